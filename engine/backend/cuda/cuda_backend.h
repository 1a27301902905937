// CUDA backend (makeCudaBackend in backend.h): one Device per visible GPU, cudaStream/cudaEvent
// streams and events, a caching allocator per device. Compiled only with CUDA (TS_HAVE_CUDA);
// this header needs no CUDA headers.
//
// What differs from the CPU backend (cpu_backend.h) and why:
// - Stream::submit runs fn at once on the caller's thread, with the stream's device current and
//   CurrentStreamScope set, so the launchers fn calls enqueue on native() (a cudaStream_t made
//   with cudaStreamNonBlocking: no implicit sync with the legacy default stream). After fn,
//   takeKernelError() and cudaGetLastError(): a failed fn, a kernel error reported through
//   reportKernelError or a launch error fails the stream. A failed stream is sticky, later
//   work is skipped (and not traced), synchronize() returns the first error, as on the CPU.
//   Errors of the kernels' execution (illegal address, ...) surface at synchronize().
// - An Event carries the error of the stream that recorded it (at record time); a stream that
//   waits on an event of a failed stream fails too, as on the CPU. Events are created with
//   cudaEventDisableTiming unless the device is traced when the event is created.
// - Trace: with a recorder set, each submit records one host launch slice (Category::Launch)
//   on the calling thread's host track, as long as fn took. The GPU-side execution slices will
//   come from CUPTI activity records (profiler/cupti), not from here.
// - Memory (per device, shared with its buffers): requests are rounded to size classes (512 B
//   steps up to 1 MiB, then 8 classes per power of two); a freed block goes to its class's free
//   list and is reused; cudaMalloc only on a miss; on cudaErrorMemoryAllocation the whole cache
//   is cudaFree'd and the cudaMalloc retried once. Accounting is as on the CPU: exact requested
//   bytes per MemCategory, current and peak, `cached` = bytes held in free lists, resetPeak,
//   setMemoryLimit (OutOfMemory past it, before any cudaMalloc).
// - Reuse safety: the backend cannot know which streams used a buffer, so freeing a buffer
//   records an event on every live stream of its device (stream-ordered "free"); the block is
//   handed out again only once all those events completed (cudaEventQuery; a block still in
//   use is skipped and a new one allocated). Work enqueued on streams this backend did not
//   create (the legacy default stream, another library's stream) is not covered: synchronize
//   those before freeing buffers they use. Releasing the cache first waits for each block's events
//   (cudaEventSynchronize), then cudaFree's it, so no pending work can touch a released block
//   (cudaFree's own implicit sync follows default-stream semantics, which our non-blocking
//   streams are exempt from, so it is not relied on).
// - allocate() zero-fills the whole block with cudaMemsetAsync on the device's allocation
//   stream and waits for it (cudaStreamSynchronize) before returning, so the buffer is zero for
//   every stream without an event to wait on; allocateUninitialized() does not touch it.
// - DeviceInfo: name, memory total and free (cudaMemGetInfo when the backend is made; a
//   snapshot), SM count, compute capability, peak fp32/bf16 TFLOP/s from
//   resources/peak_flops.json by device name (common/peak_flops.h, as `analyze` does).
// - supports(op): the ops kernels/cuda/ops_cuda.h declares (engine/backend/cuda_ops.h).
// - CUDA_DEVICE_MAX_CONNECTIONS: not set or changed here (it must be in the environment before
//   the CUDA context exists). Megatron sets it to 1 with sequence parallelism / TP comm overlap
//   so that kernels reach the GPU in issue order and a communication kernel is not starved by
//   compute issued after it; set it in the launch environment (docs/engine.md, "CUDA backend").
//   `trainscope devices` shows its value.
// - makeSharedCudaBackend: the same Device per rank, several on one GPU, each with its own cache,
//   accounting and streams; blocks come from cudaMallocManaged instead of cudaMalloc (host code
//   may read and write them once the streams that used them are synchronized).
// - Buffers must not outlive the Backend (as on the CPU); streams must be destroyed before
//   their device. Destroying a stream synchronizes it first.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/backend/backend.h"

namespace ts::engine {

// The CUDA device ordinal behind `d` (a Device of the CUDA backend), or -1 for other backends.
int cudaDeviceOrdinal(const Device& d);

// A live stream of the CUDA backend, for a profiler that sees CUDA streams only by handle (the
// CUPTI collector names its tracks with these): unique serial, cudaStream_t, device ordinal,
// the kind and name it was created with ("compute", "dp_comm", ...), and the global rank its
// Device traces for now (Device::setTrace; -1 untraced): ranks sharing a GPU tell their streams
// apart by it.
struct CudaStreamLabel {
    uint64_t serial = 0;
    void* stream = nullptr;
    int device = 0;
    trace::TrackKind kind = trace::TrackKind::Compute;
    std::string name;
    int rank = -1;
};
// Every live stream of every CUDA device in the process, in creation order.
std::vector<CudaStreamLabel> cudaStreamLabels();

// Status an Event of the CUDA backend carries: ok, or the error of the failed stream that
// recorded it. Ok for events of other backends.
Status cudaEventStatus(Event& e);

}  // namespace ts::engine
