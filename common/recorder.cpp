// Names for the trace enums (stored as text in the trace so readers need no enum table).
#include "common/recorder.h"

namespace ts::trace {

const char* trackKindName(TrackKind k) {
    switch (k) {
        case TrackKind::HostThread: return "host";
        case TrackKind::Compute: return "compute";
        case TrackKind::Comm: return "comm";
        case TrackKind::P2P: return "p2p";
        case TrackKind::Copy: return "copy";
    }
    return "unknown";
}

const char* categoryName(Category c) {
    switch (c) {
        case Category::Gemm: return "gemm";
        case Category::Attention: return "attention";
        case Category::Norm: return "norm";
        case Category::Elementwise: return "elementwise";
        case Category::Softmax: return "softmax";
        case Category::Embedding: return "embedding";
        case Category::Loss: return "loss";
        case Category::Optimizer: return "optimizer";
        case Category::Collective: return "collective";
        case Category::P2P: return "p2p";
        case Category::Memcpy: return "memcpy";
        case Category::Memset: return "memset";
        case Category::Range: return "range";
        case Category::Launch: return "launch";
        case Category::Other: return "other";
    }
    return "other";
}

const char* memCategoryName(MemCategory c) {
    switch (c) {
        case MemCategory::Params: return "params";
        case MemCategory::Grads: return "grads";
        case MemCategory::OptimizerState: return "optimizer_state";
        case MemCategory::Activations: return "activations";
        case MemCategory::Workspace: return "workspace";
        case MemCategory::CommBuffers: return "comm_buffers";
        case MemCategory::Count: break;
    }
    return "other";
}

}  // namespace ts::trace
