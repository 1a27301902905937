// Op executor, deterministic RNG and QKV layout helpers for the GPT model.
#include "engine/model/layers.h"

#include "kernels/common/dropout_rng.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/backend/graph.h"
#include "engine/backend/kernels.h"

namespace ts::engine {

Result<TensorPtr> Exec::alloc(int64_t elems, MemCategory cat, size_t elemSize) {
    if (elems < 0) return Status::internal("negative allocation size");
    auto r = m_dev.allocate(size_t(std::max<int64_t>(elems, 1)) * elemSize, cat);
    if (!r) return r.status();
    return TensorPtr(std::move(r).value());
}

void Exec::op(const char* name, trace::Category cat, double flops, uint64_t bytes,
              std::function<void()> fn) {
    OpDesc d;
    d.name = name;
    d.category = cat;
    d.flops = flops;
    d.bytes = bytes;
    d.step = m_step;
    d.microbatch = m_mb;
    d.layer = m_layer;
    const std::atomic<bool>* cancel = m_cancel;
    const bool bf16 = m_bf16Gemms;
    m_stream->submit(d, [fn = std::move(fn), cancel, bf16]() -> Status {
        if (cancel && cancel->load(std::memory_order_relaxed)) return Status::cancelled("run cancelled");
        kern::Bf16GemmScope gemms(bf16);
        fn();
        return Status::ok();
    });
}

void Exec::opStatus(const char* name, trace::Category cat, double flops, uint64_t bytes,
                    std::function<Status()> fn) {
    OpDesc d;
    d.name = name;
    d.category = cat;
    d.flops = flops;
    d.bytes = bytes;
    d.step = m_step;
    d.microbatch = m_mb;
    d.layer = m_layer;
    const std::atomic<bool>* cancel = m_cancel;
    const bool bf16 = m_bf16Gemms;
    m_stream->submit(d, [fn = std::move(fn), cancel, bf16]() -> Status {
        if (cancel && cancel->load(std::memory_order_relaxed)) return Status::cancelled("run cancelled");
        kern::Bf16GemmScope gemms(bf16);
        return fn();
    });
}

Status Exec::synchronize() {
    m_events.clear();
    return m_stream->synchronize();
}

void Exec::throttle(size_t depth) {
    // A capture records the ops, runs none: nothing to wait for, and a graph holds no host wait.
    if (isCapturing(*m_stream)) return;
    auto e = m_dev.createEvent();
    m_stream->record(*e);
    m_events.push_back(std::move(e));
    while (m_events.size() > depth) {
        m_events.front()->synchronize();
        m_events.pop_front();
    }
}

Result<KernelIds> kernelInts(Exec& ex, const int32_t* host, size_t n, std::shared_ptr<const void> owner,
                             MemCategory cat) {
    if (!kern::streamOnDevice(ex.stream())) return KernelIds{host, std::move(owner)};
    const size_t bytes = n * sizeof(int32_t);
    TS_ASSIGN_OR_RETURN(TensorPtr dev, ex.alloc(int64_t(std::max<size_t>(n, 1)), cat, sizeof(int32_t)));
    // copyBytes reads a host source at the call (staged, as CUDA does); owner held to be safe
    ex.op("ids.upload", trace::Category::Memcpy, 0, bytes, [=] {
        kern::copyBytes(dev->data(), host, bytes);
        (void)owner;
    });
    return KernelIds{static_cast<const int32_t*>(dev->data()), dev};
}

// One definition with the kernels' (kernels/common/dropout_rng.h), whose dropout seeds combine
// the step key with the site key on the device as dropoutStepKey / dropoutSiteKey do here.
uint64_t splitmix64(uint64_t x) { return kernels::hd::dropoutStreamKey(x); }

uint64_t hashCombine(uint64_t a, uint64_t b) { return kernels::hd::dropoutCombine(a, b); }

uint64_t hashString(const std::string& s) {
    uint64_t h = 1469598103934665603ULL;  // FNV-1a
    for (unsigned char c : s) {
        h ^= c;
        h *= 1099511628211ULL;
    }
    return h;
}

void fillNormal(float* out, int64_t n, float std, uint64_t key) {
    // Box-Muller on pairs of counter-based uniforms in (0, 1].
    for (int64_t i = 0; i < n; i += 2) {
        const uint64_t r1 = splitmix64(key + uint64_t(i));
        const uint64_t r2 = splitmix64(key + uint64_t(i) + 1 + 0x5851f42d4c957f2dULL);
        const double u1 = (double(r1 >> 11) + 1.0) * (1.0 / 9007199254740992.0);
        const double u2 = double(r2 >> 11) * (1.0 / 9007199254740992.0);
        const double rad = std::sqrt(-2.0 * std::log(u1));
        const double th = 6.283185307179586 * u2;
        out[i] = float(rad * std::cos(th) * std);
        if (i + 1 < n) out[i + 1] = float(rad * std::sin(th) * std);
    }
}

uint64_t dropoutStepKey(uint64_t seed, int step) { return hashCombine(splitmix64(seed), uint64_t(int64_t(step))); }

uint64_t dropoutSiteKey(int microbatch, int layer, int site) {
    return hashCombine(hashCombine(uint64_t(int64_t(microbatch)), uint64_t(int64_t(layer))), uint64_t(site));
}

}  // namespace ts::engine
