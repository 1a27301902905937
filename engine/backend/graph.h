// Stream graphs: a stream's work recorded once and enqueued again as a whole (CUDA graphs,
// cudaStreamBeginCapture / cudaGraphLaunch), what `cuda_graph_impl` asks for (docs/engine.md,
// "CUDA graphs"). Backends that run kernels on a device have them: CUDA, and the emulated device,
// which records its deferred kernels the same way so that the engine's use of graphs is tested
// without a GPU. The CPU backend has none (its ops run their host code on the stream's thread:
// there is nothing to record but the host code itself).
//
// The contract, CUDA's:
// - Between beginCapture(s) and endCapture(s), ops submitted to s run their host code at once, as
//   always on a device stream, but their kernels are recorded, not executed. Launching the graph
//   runs those kernels again, in order; host code never runs again, so whatever the host decided
//   while capturing (sizes, scales, seeds, which kernels) is what every launch does.
// - A capture may not wait for the stream from the host (synchronize, a download, a
//   value-returning kernel), record or wait on events of s, or copy from or into host memory:
//   the capture fails (endCapture returns the error naming the op) and the graph is not made.
// - Memory: a block a captured kernel may use stays with the graph while the graph lives. Every
//   buffer the capturing thread allocates on the device while the capture runs comes from the
//   graph's pool (other threads' allocations are not the graph's), and every
//   buffer alive during a capture that is freed while the graph lives goes back to that pool, not
//   to the device's cache, so no other buffer ever gets its address. The pool's blocks stay
//   counted (in the category of the buffer that freed them: what the graph holds, as
//   torch.cuda.memory_allocated counts a graph's private pool) until the graph is destroyed.
//   A buffer allocated while capturing that asked for zeroed memory is zeroed by a recorded
//   memset: its contents are zero once the graph has run, as on CUDA.
// - One graph per device at a time: beginCapture refuses while another graph (or capture) of the
//   device lives, since a block freed while two live would be kept for the newer only.
#pragma once

#include <cstdint>
#include <memory>

#include "common/status.h"
#include "engine/backend/backend.h"

namespace ts::engine {

class StreamGraph {
public:
    virtual ~StreamGraph() = default;
    // Enqueues the recorded work on `s` (a stream of the device it was captured on). `step`
    // labels the trace slices of this launch (the captured ops carry the capture's labels).
    virtual Status launch(Stream& s, int step) = 0;
    // Ops (emulated device: work items; CUDA: nodes) recorded.
    virtual int64_t nodes() const = 0;
    // Bytes of device memory the graph holds (its pool's blocks, live or free).
    virtual int64_t poolBytes() const = 0;
};

// Implemented by the streams that can be captured (CUDA, emulated device).
class CapturableStream {
public:
    virtual ~CapturableStream() = default;
    virtual Status beginCapture() = 0;
    virtual Result<std::unique_ptr<StreamGraph>> endCapture() = 0;
    virtual bool capturing() const = 0;
};

// Unsupported on streams that cannot be captured (the CPU backend's), with what to use instead;
// InvalidArgument when the stream's device already captures or has a live graph.
Status beginCapture(Stream& s);
// Ends the capture begun on s; the capture's first error when it failed (s is then no longer
// capturing either).
Result<std::unique_ptr<StreamGraph>> endCapture(Stream& s);
bool isCapturing(Stream& s);

}  // namespace ts::engine
