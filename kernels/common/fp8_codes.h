// FP8 codes at a scale: which float ranges hold per-tensor FP8 values as the engine stores them,
// y = fl(v * fl(1 / scale)) for FP8 values v (kernels/cpu/fp8.cpp fp8QuantizeDequantize). Such a
// y gives its code back exactly, bf16(y * scale) == v and fp8(y * scale) == v in its format
// (y * scale is v within a few fp32 ulps and v has at most 4 significant bits), so a bf16 GEMM,
// or an FP8 GEMM where both operands are codes, can multiply the codes on the tensor cores and
// fold fl(1 / scale) into alpha, as Transformer Engine does with its scale_inv: the products are
// the oracle's y_a * y_b up to fp32 rounding, as the summation order already differs.
//
// One map for the process (the inline function's static is one object across the engine and
// kernels/cuda), by the pointers the kernels receive: the engine's kern::fp8QuantizeDequantize
// binds its output when it is called; a Buffer's free forgets what lay inside it; the GEMMs look
// their operands up when they are called (kernels/cuda/gemm.cu; the host check, engine/backend/
// kernels.cpp). On a device all three happen in the host program order of the one thread that
// issues its work; the CPU backend calls kernels in its stream's order, where the GEMMs look up
// too. The model also binds at submission (GptModel::fp8Quantize, whose scale is fixed for the
// step), so that a gather submitted after it can bind its copy with the same scale (bindLike): a
// buffer's address is reused only after its free forgot it. Tensorwise scaling's scale is made on
// the device from the tensor's amax (kern::fp8QuantizeCurrent): the model binds such codes with
// the amax's address and keeps its Buffer with the binding (bindCurrent), and whoever needs the
// scale reads it there (the host check in the kernel's view, the CUDA casts on the device). The
// map is host code; Binding is plain data that kernels take.
#pragma once

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "kernels/common/hd.h"

namespace ts::kernels::fp8codes {

// Binding::scale of a range whose scale gives no exact codes (see Map::bind): the GEMM runs fp32
// on the stored values.
constexpr float kFp32Only = -1.0f;
// Binding::scale of a range whose scale lives on the device, read there by the kernel that needs
// it: tensorwise scaling's, currentScaleDivided(*amax, divisor, fp8Max) (kernels/common/
// fp8_scalar.h; Map::bindCurrent), or delayed scaling's, *scaleAt / divisor (Map::bindScaleAt:
// the step's scale, which the host writes there before the step, so a captured graph's kernels
// read each step's).
constexpr float kOnDevice = -2.0f;

// What a range holds: FP8 values of `format` (0 = E4M3, 1 = E5M2, kernels/common/fp8_scalar.h's
// numbers, kernels::cpu::Fp8Format's values) at `scale`, kFp32Only, or kOnDevice with the amax
// (or the delayed scale) and divisor the scale comes from; scale 0: nothing bound. Plain data
// (kernels take it).
struct Binding {
    float scale = 0.0f;
    int format = 0;
    const float* amax = nullptr;  // kOnDevice, tensorwise: the tensor's amax, a float where kernels see it
    float divisor = 1.0f;
    const float* scaleAt = nullptr;  // kOnDevice, delayed: the undivided scale, where kernels see it
};

// kOnDevice: the float the scale is made from (the delayed scale, else the amax).
TS_HD inline const float* deviceScaleSource(const Binding& b) { return b.scaleAt ? b.scaleAt : b.amax; }

// Whether b holds codes at a scale (on the host or the device), which the GEMMs take as codes.
TS_HD inline bool hasCodes(const Binding& b) { return b.scale > 0.0f || b.scale == kOnDevice; }

// Whether values stored at `scale` give their codes back (Map::bind): a positive normal scale
// whose inverse keeps the smallest FP8 value (2^-16, E5M2) times 1/scale a normal float.
inline bool exactCodesScale(float scale) {
    return scale > 0.0f && std::isnormal(scale) && std::isnormal(0x1p-16f * (1.0f / scale));
}

class Map {
public:
    // [base, base + n) holds codes of `format` at `scale`: replaces what overlapped it (the parts
    // of an older binding outside the range stay bound). A scale for which y would not give the
    // codes back (not a positive normal float, or one so large that the smallest FP8 value, 2^-16
    // in E5M2, times 1/scale leaves the normal floats) binds the range as kFp32Only.
    void bind(const float* base, int64_t n, float scale, int format) {
        bindRange(base, n, Binding{exactCodesScale(scale) ? scale : kFp32Only, format}, nullptr);
    }
    // [base, base + n) holds codes of `format` at the scale made where the tensor's amax is
    // (fp8QuantizeCurrent's): kOnDevice. `owner` keeps the amax's memory while the binding lives
    // (the map releases it when the range is forgotten or bound anew, outside its lock).
    void bindCurrent(const float* base, int64_t n, const float* amax, float divisor, int format,
                     std::shared_ptr<const void> owner) {
        bindRange(base, n, Binding{kOnDevice, format, amax, divisor}, std::move(owner));
    }
    // [base, base + n) holds codes of `format` at the scale *scaleAt / divisor, read where the
    // scale is when a kernel needs it (delayed scaling's, fp8QuantizeDelayed's): kOnDevice.
    // `owner` keeps scaleAt's memory while the binding lives.
    void bindScaleAt(const float* base, int64_t n, const float* scaleAt, float divisor, int format,
                     std::shared_ptr<const void> owner) {
        Binding b{kOnDevice, format, nullptr, divisor};
        b.scaleAt = scaleAt;
        bindRange(base, n, b, std::move(owner));
    }
    // The binding that covers [x, x + n) wholly; else scale 0.
    Binding lookup(const float* x, int64_t n) const {
        if (!x || n <= 0 || m_count.load(std::memory_order_relaxed) == 0) return {};
        std::lock_guard<std::mutex> lock(m_mutex);
        const Range* r = coveringLocked(x, n);
        return r ? r->b : Binding{};
    }
    // lookup's scale: the binding's, kFp32Only, kOnDevice, or 0.
    float scaleOf(const float* x, int64_t n) const { return lookup(x, n).scale; }
    // dst [0, dstN) holds copies of what src [0, srcN) holds (an all-gather of it, a staging
    // copy): bound as src is where src is bound (its owner shared), else left as it is.
    void bindLike(const float* dst, int64_t dstN, const float* src, int64_t srcN) {
        if (!src || srcN <= 0) return;
        Binding b;
        std::shared_ptr<const void> owner;
        {
            std::lock_guard<std::mutex> lock(m_mutex);
            const Range* r = coveringLocked(src, srcN);
            if (!r) return;
            b = r->b;
            owner = r->owner;
        }
        bindRange(dst, dstN, b, std::move(owner));
    }
    // What lies in [begin, begin + bytes): a freed buffer's, or a new one's (a binding of memory
    // that was not a Buffer, a test's host vector, must not reach a Buffer made there later).
    void forget(const void* begin, size_t bytes) {
        if (m_count.load(std::memory_order_relaxed) == 0) return;
        std::vector<std::shared_ptr<const void>> released;  // destroyed after the lock
        std::lock_guard<std::mutex> lock(m_mutex);
        const auto b = reinterpret_cast<uintptr_t>(begin);
        eraseLocked(b, b + bytes, &released);
    }
    size_t size() const { return m_count.load(std::memory_order_relaxed); }

private:
    struct Range {
        int64_t n;
        Binding b;
        std::shared_ptr<const void> owner;  // what keeps b.amax's or b.scaleAt's memory (kOnDevice)
    };
    // The range that covers [x, x + n) wholly, or null (x not null, n > 0).
    const Range* coveringLocked(const float* x, int64_t n) const {
        auto it = m_ranges.upper_bound(x);
        if (it == m_ranges.begin()) return nullptr;
        --it;
        return x - it->first + n <= it->second.n ? &it->second : nullptr;
    }
    void bindRange(const float* base, int64_t n, Binding b, std::shared_ptr<const void> owner) {
        if (n <= 0) return;
        std::vector<std::shared_ptr<const void>> released;  // declared first: destroyed after the lock
        std::lock_guard<std::mutex> lock(m_mutex);
        eraseLocked(reinterpret_cast<uintptr_t>(base), reinterpret_cast<uintptr_t>(base + n), &released);
        m_ranges[base] = Range{n, b, std::move(owner)};
        m_count.store(m_ranges.size(), std::memory_order_relaxed);
    }
    // Unbinds the bytes [lo, hi): a binding overlapping them keeps its whole floats outside. The
    // owners of what is gone go to *released, for the caller to drop once the lock is released
    // (dropping one may free a Buffer, whose free calls forget).
    void eraseLocked(uintptr_t lo, uintptr_t hi, std::vector<std::shared_ptr<const void>>* released) {
        if (lo >= hi) return;
        auto it = m_ranges.upper_bound(reinterpret_cast<const float*>(lo));
        if (it != m_ranges.begin()) {
            auto prev = std::prev(it);
            if (reinterpret_cast<uintptr_t>(prev->first + prev->second.n) > lo) it = prev;
        }
        std::vector<std::pair<const float*, Range>> kept;
        while (it != m_ranges.end() && reinterpret_cast<uintptr_t>(it->first) < hi) {
            const float* b = it->first;
            const Range& r = it->second;
            const auto bb = reinterpret_cast<uintptr_t>(b), end = reinterpret_cast<uintptr_t>(b + r.n);
            if (bb < lo) kept.push_back({b, Range{int64_t((lo - bb) / sizeof(float)), r.b, r.owner}});
            if (end > hi) {
                const int64_t skip = int64_t((hi - bb + sizeof(float) - 1) / sizeof(float));
                if (skip < r.n) kept.push_back({b + skip, Range{r.n - skip, r.b, r.owner}});
            }
            if (r.owner) released->push_back(r.owner);
            it = m_ranges.erase(it);
        }
        for (auto& [b, r] : kept)
            if (r.n > 0) m_ranges[b] = std::move(r);
        m_count.store(m_ranges.size(), std::memory_order_relaxed);
    }
    mutable std::mutex m_mutex;
    std::map<const float*, Range> m_ranges;
    std::atomic<size_t> m_count{0};
};

inline Map& map() {
    static Map* m = new Map;  // never destroyed: a Buffer freed during static destruction forgets here
    return *m;
}

}  // namespace ts::kernels::fp8codes
