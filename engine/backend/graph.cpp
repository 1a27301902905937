// Stream graphs (graph.h): the dispatch to the streams that can be captured.
#include "engine/backend/graph.h"

#include <string>

namespace ts::engine {

namespace {
CapturableStream* capturable(Stream& s) { return dynamic_cast<CapturableStream*>(&s); }
}  // namespace

Status beginCapture(Stream& s) {
    if (CapturableStream* c = capturable(s)) return c->beginCapture();
    return Status::unsupported("stream '" + s.name() +
                               "' cannot be captured into a graph: graphs (cuda_graph_impl) record the kernels of a "
                               "device stream, and this is a CPU backend stream, whose ops run on its own thread; use "
                               "device_backend: cuda (or the emulated device, TS_EMULATE_DEVICE=1, to check a run "
                               "without a GPU), or cuda_graph_impl: none");
}

Result<std::unique_ptr<StreamGraph>> endCapture(Stream& s) {
    if (CapturableStream* c = capturable(s)) return c->endCapture();
    return Status::invalid("stream '" + s.name() + "' is not being captured");
}

bool isCapturing(Stream& s) {
    CapturableStream* c = capturable(s);
    return c && c->capturing();
}

}  // namespace ts::engine
