// CPU backend: each rank is a virtual device; every Stream is a worker thread that runs its
// queue in submission order, so compute/communication overlap between streams is real.
// Memory comes from a tracked caching allocator: per-category current/peak bytes of live
// buffers (exactly what was asked for), optional limit; freed blocks are kept per size class
// and reused (MemoryStats::cached). allocate() zeroes, allocateUninitialized() does not.
//
// Semantics beyond backend.h:
// - An Event recorded on a failed stream completes, but carries the stream's error; a stream
//   that waits on it becomes failed too ("waited on an event from failed stream ..."), so a
//   failure propagates along dependencies instead of letting later work read garbage.
// - A failed stream stays failed (sticky, like a CUDA error); synchronize() keeps returning the
//   first error. Work submitted after the failure is skipped and not traced.
// - Destroying a stream drains its queue first (communication ops there have timeouts).
// - Buffers may outlive their device's streams; they must not outlive the Backend.
#pragma once

#include <memory>

#include "engine/backend/backend.h"

namespace ts::engine {

// Status an Event carries: ok, or the error of the failed stream that recorded it.
// Ok for events of other backends.
Status eventStatus(Event& e);

}  // namespace ts::engine
