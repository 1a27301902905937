// The narrow interface through which the engine reports what it does to the profiler
// (DESIGN.md: "profiler/capture is called by the engine through a narrow recorder
// interface"). The engine holds a Recorder* that may be null: profiling off costs one branch.
//
// Model of a trace (same as nsys/Kineto): per rank there is a host thread track where ops are
// *launched*, and one track per stream where they *execute* (compute, comm, p2p, copy).
// A launch and its execution share a correlation id. NVTX-style ranges (step, microbatch,
// forward/backward, stage, layer, optimizer) are slices of category Range on the host track.
// Memory is reported as counters per rank and category.
//
// Thread-safety: every method may be called concurrently from any rank/stream thread.
// Implementations must not block on I/O in these calls (append to per-thread buffers).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace ts::trace {

enum class TrackKind : uint8_t {
    HostThread = 0,  // the rank's CPU thread: launches + NVTX-style ranges
    Compute = 1,     // compute stream
    Comm = 2,        // collective stream (TP/DP/CP/EP collectives)
    P2P = 3,         // pipeline send/recv stream
    Copy = 4,        // memcpy / H2D / D2H
};
const char* trackKindName(TrackKind k);

enum class Category : uint8_t {
    Gemm = 0,
    Attention,    // core attention (QK^T, softmax, .V)
    Norm,         // LayerNorm / RMSNorm
    Elementwise,  // activation, bias, dropout, residual, RoPE
    Softmax,
    Embedding,
    Loss,         // cross entropy
    Optimizer,    // Adam, grad-norm, clipping, casts of main params
    Collective,   // all-reduce / reduce-scatter / all-gather / broadcast / all-to-all
    P2P,          // pipeline send / recv
    Memcpy,
    Memset,
    Range,        // NVTX-style range: step, microbatch, forward, backward, stage, layer
    Launch,       // host-side launch of a kernel/collective (cudaLaunchKernel analogue)
    Other,
};
const char* categoryName(Category c);
// Communication kind for Collective/P2P slices; mirrors the process group names.
// (Stored as the interned group name, e.g. "tp", "dp", "pp", "cp", "ep", "tp-sp".)

// Memory categories, as the tracked allocator knows them.
enum class MemCategory : uint8_t {
    Params = 0,
    Grads,
    OptimizerState,
    Activations,
    Workspace,
    CommBuffers,
    Count
};
const char* memCategoryName(MemCategory c);

struct TrackDesc {
    int32_t rank = 0;         // global rank
    int32_t device = 0;       // local device index
    TrackKind kind = TrackKind::HostThread;
    int32_t streamIndex = 0;  // several comm streams -> 0,1,...
    std::string name;         // "rank 3 compute", "rank 3 comm dp"
};

// One completed op (or range). Timestamps are monotonicNs() (common/clock.h).
struct Slice {
    uint32_t track = 0;        // from Recorder::track()
    uint32_t name = 0;         // from Recorder::intern()
    Category category = Category::Other;
    int64_t startNs = 0;
    int64_t durNs = 0;
    int32_t step = -1;         // training iteration, -1 unknown
    int32_t microbatch = -1;
    int32_t chunk = -1;        // virtual pipeline chunk (model chunk)
    int32_t layer = -1;
    uint64_t correlation = 0;  // links host Launch slice with its stream execution slice
    uint64_t bytes = 0;        // bytes moved (collectives, p2p, memcpy) or touched
    double flops = 0;          // floating point operations (2*m*n*k for a GEMM)
    uint32_t group = 0;        // interned process-group name for comm ("tp","dp","pp",...), 0 none
    int32_t depth = 0;         // nesting depth for Range slices
};

struct Counter {
    int32_t rank = 0;
    uint32_t name = 0;  // interned, e.g. "memory.params"
    int64_t tsNs = 0;
    double value = 0;
};

class Recorder {
public:
    virtual ~Recorder() = default;
    // Register a track once (e.g. at stream creation). Returns its id.
    virtual uint32_t track(const TrackDesc& desc) = 0;
    // Intern a string; the same text always returns the same id. Id 0 means "none".
    virtual uint32_t intern(std::string_view text) = 0;
    virtual void slice(const Slice& s) = 0;
    virtual void counter(const Counter& c) = 0;
    // Run metadata: config (JSON), hardware, versions, clock anchor ...
    virtual void metadata(std::string_view key, std::string_view value) = 0;
    // Fresh correlation id (unique within the run).
    virtual uint64_t nextCorrelation() = 0;
};

}  // namespace ts::trace
