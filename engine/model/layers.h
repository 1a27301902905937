// Building blocks of the GPT model: the op executor that puts every kernel on the rank's
// compute stream (so the trace shows it and comm overlap is real), tensors as tracked device
// buffers, deterministic RNG for init and dropout, and the QKV layout helpers.
//
// Lifetime rule: every op lambda captures the TensorPtr(s) it touches BY VALUE, so a buffer
// lives until the last op using it has executed; the host drops its references as soon as it
// has enqueued the last use. The host is throttled to stay at most one layer ahead of
// the stream so that the tracked peak memory is that of the real execution order.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/recorder.h"
#include "common/status.h"
#include "engine/backend/backend.h"

namespace ts::engine {

using TensorPtr = std::shared_ptr<Buffer>;
inline float* fp(const TensorPtr& t) { return t ? t->as<float>() : nullptr; }

// Keeps `tensors` alive until the work already queued on `s` has run (Stream::keepUntilPassed):
// the buffers a collective or a raw-pointer op reads, released in stream order.
inline void keepUntilPassed(Stream& s, std::vector<TensorPtr> tensors) {
    s.keepUntilPassed(std::make_shared<std::vector<TensorPtr>>(std::move(tensors)));
}

class Exec {
public:
    Exec(Device& dev, Stream& stream) : m_dev(dev), m_stream(&stream) {}

    Device& device() { return m_dev; }
    Stream& stream() { return *m_stream; }
    // Sends the ops enqueued from now on to `s` (another stream of the same device); returns the
    // previous one. MoE shared experts overlapped with the dispatcher use it (gpt_layer.cpp).
    Stream& setStream(Stream& s) {
        Stream& prev = *m_stream;
        m_stream = &s;
        return prev;
    }
    void setCancelFlag(const std::atomic<bool>* flag) { m_cancel = flag; }
    // The ops' GEMMs take bf16 operands where the backend has bf16 GEMMs (kern::Bf16GemmScope).
    void setBf16Gemms(bool on) { m_bf16Gemms = on; }
    bool bf16Gemms() const { return m_bf16Gemms; }
    bool cancelled() const { return m_cancel && m_cancel->load(std::memory_order_relaxed); }
    void setStep(int step) { m_step = step; }
    void setMicrobatch(int mb) { m_mb = mb; }
    void setLayer(int layer) { m_layer = layer; }
    int step() const { return m_step; }
    int microbatch() const { return m_mb; }

    // Zeroed float buffer of `elems` elements (tracked under `cat`).
    Result<TensorPtr> alloc(int64_t elems, MemCategory cat = MemCategory::Activations,
                            size_t elemSize = sizeof(float));
    // Enqueue a kernel. The cancel flag is checked when the op runs.
    void op(const char* name, trace::Category cat, double flops, uint64_t bytes,
            std::function<void()> fn);
    void opStatus(const char* name, trace::Category cat, double flops, uint64_t bytes,
                  std::function<Status()> fn);
    Status synchronize();
    // Records an event and waits (host) for the one recorded `depth` throttle points ago.
    void throttle(size_t depth = 1);
    void clearThrottle() { m_events.clear(); }

private:
    Device& m_dev;
    Stream* m_stream;
    const std::atomic<bool>* m_cancel = nullptr;
    bool m_bf16Gemms = false;
    int m_step = -1, m_mb = -1, m_layer = -1;
    std::deque<std::unique_ptr<Event>> m_events;
};

// Ints as kernels read them (token ids, labels, CP positions), with what keeps that memory alive
// until the ops that read it have run (ops run later than they are enqueued): the host array's
// owner where kernels read host memory (the CPU backend), an uploaded copy where they see device
// memory (kern::streamOnDevice). Ops capture the whole struct.
struct KernelIds {
    const int32_t* ptr = nullptr;
    std::shared_ptr<const void> keep;
};
// host[0..n), kept alive by `owner`: itself on the CPU backend, else a buffer filled by an upload
// op on ex's stream.
Result<KernelIds> kernelInts(Exec& ex, const int32_t* host, size_t n, std::shared_ptr<const void> owner,
                             MemCategory cat = MemCategory::Activations);

// --- deterministic RNG -------------------------------------------------------------------
uint64_t splitmix64(uint64_t x);
uint64_t hashCombine(uint64_t a, uint64_t b);
uint64_t hashString(const std::string& s);
// n samples of N(0, std) from a counter-based generator keyed by `key` (platform-independent).
void fillNormal(float* out, int64_t n, float std, uint64_t key);

// The seed of one dropout site is a pure function of its coordinates, so recompute reproduces
// the mask: kernels/common/dropout_rng.h dropoutCombine(step key, site key). The model keeps the
// step key in device memory and hands kernels a DropoutSeed{&key, site key}, so the kernels of a
// captured CUDA graph read each step's key when launched. site: 0 embedding, 1 attention-out,
// 2 mlp-out, 3 core attention.
uint64_t dropoutStepKey(uint64_t seed, int step);
uint64_t dropoutSiteKey(int microbatch, int layer, int site);

}  // namespace ts::engine
