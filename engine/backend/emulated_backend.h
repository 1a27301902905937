// Emulated device backend (makeEmulatedDeviceBackend in backend.h): runs on the CPU with the
// CUDA backend's execution model, and traps the two things host code may not do on a GPU, so
// the engine's CUDA port is test-driven on machines without one (CI).
//
// What it emulates, and how:
// - Device memory host code cannot touch. Each device owns an arena: a memfd mapped twice, a
//   "device view" whose pages are PROT_NONE (what Buffer::data() returns) and a read-write
//   "host view" at another address (what kernels and the in-process communicator use, through
//   hostAlias()). Host code that dereferences a buffer pointer (fp(t)[i], memcpy, std::fill)
//   gets SIGSEGV at that line; a SIGSEGV handler prints "host code touched emulated device
//   memory" with the address, the device and a backtrace, then lets the signal kill the process
//   (faults elsewhere go to the previous handler). The arena reserves 64 GiB of address space
//   per view (MAP_NORESERVE; less if the system refuses) and grows the memfd with ftruncate.
// - Run-at-submit streams. submit(desc, fn) runs fn NOW on the caller's thread inside
//   CurrentStreamScope(this), as on CUDA. The kernel dispatch (kernels.h) sees kernelLaunch() ==
//   Defer and hands each kernel to deferKernel() as a closure over host-view pointers; the op's
//   kernels are queued as ONE work item on the stream's worker thread (host_runtime.h's stream,
//   the CPU backend's), which runs them later in stream order. Host code in fn that reads a
//   buffer thus sees it before the kernels that fill it have run (and traps anyway, above).
//   A kernel given a pointer that is neither emulated device memory nor null (a host
//   std::vector, a stack array) is not queued: the op fails with a message naming the kernel and
//   the argument, as a CUDA kernel would fault on it.
// - Communication ops (OpDesc::category Collective or P2P) are queued whole, as NCCL enqueues a
//   collective: fn runs on the worker in stream order, where kernelLaunch() == NowHostView (a
//   kernel called there runs at once on host views). The in-process communicator translates its
//   buffer pointers with hostAlias where it touches memory.
// - Value-returning kernels (sumSquares, allFinite, amaxOf, countInvalidIds, embeddingForward)
//   queue the kernel, synchronize the stream and return the value, as on CUDA; the op's kernels
//   queued so far become their own work item (so such an op shows as several slices).
// - Failures follow the Stream contract: fn's Status (and any kernel error it reported) fails
//   the stream in stream order, when the worker reaches the op's item; a failed stream stays
//   failed, and fn is not run for ops submitted after the failure is known. Events, record/wait
//   and synchronize are the CPU backend's (cpu_backend.h), eventStatus() included.
// - Memory: size classes as on the CPU (256-byte aligned, like cudaMalloc), per-category
//   current/peak, `cached`, memory limit and OutOfMemory message as on the CPU. Reuse is stream
//   ordered, as on the CUDA backend: a freed block is reused only once every stream of its
//   device has executed the work queued before the free (including the op being submitted when
//   the free happened), so a kernel still queued never sees its buffer handed out again.
//   allocate() zero-fills through the host view before returning (safe: reuse is stream ordered,
//   fresh memfd pages are zero already); allocateUninitialized() does not touch the block.
//   Free blocks past 4 GiB of cache give their pages back (fallocate PUNCH_HOLE).
// - Trace: as the CPU backend: one launch slice per queued item on the submitting thread's host
//   track, and the execution slice on the stream's track when the worker runs it.
// - DeviceInfo: backend EmulatedDevice, name "emulated:N", memory total = physical RAM / devices.
//
// Not emulated: kernel speed, asynchrony between the host and a device beyond the queue, the
// legacy default stream, CUDA graphs, pinned memory. Uninitialized memory is whatever the block
// held before (not poisoned).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "engine/backend/backend.h"

namespace ts::engine {

// Reserved address space per view of each emulated device's arena (bytes).
inline constexpr size_t kEmulatedArenaReserve = size_t(64) << 30;

// The ops whose host code made the host wait for one of an emulated device's streams (a
// download, a value-returning kernel: a stream synchronize on CUDA, where the host then stops
// queueing work ahead of the GPU), each with how often since the device was made. Empty for any
// other device. Synchronizes outside ops (a step's end) are not counted.
std::map<std::string, int64_t> emulatedHostWaits(Device& device);

}  // namespace ts::engine
