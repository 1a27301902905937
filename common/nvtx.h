// NVTX ranges for the CUDA backend (step / microbatch / forward / backward / layer ...), so
// nsys and our CUPTI collector (profiler/cupti) see the same ranges the CPU backend records.
// Header-only over NVTX3 (also header-only, from the CUDA toolkit). Compiles to nothing when
// the target has no CUDA include path or none of TS_HAVE_NVTX / TS_HAVE_CUDA / TS_HAVE_CUPTI:
// marking costs nothing then.
//   { ts::nvtx::ScopedRange r("forward"); ... }      // push/pop, same thread
//   auto id = ts::nvtx::startRange("step 3"); ... ts::nvtx::endRange(id);  // may end elsewhere
#pragma once

#include <cstdint>

#if (defined(TS_HAVE_NVTX) || defined(TS_HAVE_CUDA) || defined(TS_HAVE_CUPTI)) && \
    __has_include(<nvtx3/nvToolsExt.h>)
#include <nvtx3/nvToolsExt.h>
#define TS_NVTX_ENABLED 1
#else
#define TS_NVTX_ENABLED 0
#endif

namespace ts::nvtx {

inline constexpr bool kEnabled = TS_NVTX_ENABLED != 0;

#if TS_NVTX_ENABLED
inline void push(const char* name) { nvtxRangePushA(name); }
inline void pop() { nvtxRangePop(); }
inline void mark(const char* name) { nvtxMarkA(name); }
inline uint64_t startRange(const char* name) { return nvtxRangeStartA(name); }
inline void endRange(uint64_t id) { nvtxRangeEnd(id); }
#else
inline void push(const char*) {}
inline void pop() {}
inline void mark(const char*) {}
inline uint64_t startRange(const char*) { return 0; }
inline void endRange(uint64_t) {}
#endif

// Push on construction, pop on destruction (same thread).
class ScopedRange {
public:
    explicit ScopedRange(const char* name) { push(name); }
    ~ScopedRange() { pop(); }
    ScopedRange(const ScopedRange&) = delete;
    ScopedRange& operator=(const ScopedRange&) = delete;
};

}  // namespace ts::nvtx
