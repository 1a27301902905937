// The promise behind a GPU's bf16 GEMMs (kern::Bf16GemmScope): every GEMM operand the engine
// hands a bf16 GEMM holds bf16 values, so the tensor cores' products are the CPU oracle's and
// only the fp32 summation order differs. kern::setCheckBf16Gemms makes the host backends look at
// every such operand; here:
//   - the check fails an op that breaks the promise, naming the operand, and passes one that
//     keeps it, on the CPU backend and on the emulated device (whose kernels run deferred);
//   - every trainer variant (tests/trainer_variants.h, what the CUDA trainer test runs) trains
//     with the check on, on both host backends: no GEMM of a bf16 model (FP8 ones included,
//     but for the FP8 linears of tensorwise scaling, which Fp32GemmScope takes out) sees a
//     value bf16 would round, or, where the operand is bound as FP8 codes at a scale (delayed and
//     tensorwise scaling's, kernels/common/fp8_codes.h), a value that is no code at that scale; and the
//     GEMMs taken out are only those.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/kernels.h"
#include "engine/train/trainer.h"
#include "kernels/common/fp8_codes.h"
#include "kernels/cpu/ops.h"
#include "tests/trainer_backend_run.h"
#include "tests/trainer_variants.h"

namespace ts::engine {
namespace {

// The check on for a scope (what it was after).
class CheckBf16Gemms {
public:
    CheckBf16Gemms() : m_prev(kern::checkBf16Gemms()) { kern::setCheckBf16Gemms(true); }
    ~CheckBf16Gemms() { kern::setCheckBf16Gemms(m_prev); }

private:
    bool m_prev;
};

std::unique_ptr<Backend> backendOf(bool emulate) {
    return emulate ? makeEmulatedDeviceBackend(1) : makeCpuBackend(1);
}

std::vector<float> values(int n, float step) {
    std::vector<float> v(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) v[size_t(i)] = step * float(i % 7 - 3);
    return v;
}

// Buffers made from `host` on a fresh stream of the backend, then `fn(pointers)` as one op under
// a bf16 GEMM scope (or, with scope false, outside one); the stream's status.
Status underBf16Scope(bool emulate, const std::vector<std::vector<float>>& host,
                      const std::function<void(const std::vector<float*>&)>& fn, bool scope = true) {
    auto backend = backendOf(emulate);
    Device& dev = backend->device(0);
    auto stream = dev.createStream(trace::TrackKind::Compute, "compute");
    std::vector<std::unique_ptr<Buffer>> bufs;
    std::vector<float*> ptrs;
    for (const auto& h : host) {
        auto b = dev.allocate(h.size() * sizeof(float), MemCategory::Activations);
        if (!b.isOk()) return b.status();
        ptrs.push_back(static_cast<float*>((*b)->data()));
        TS_RETURN_IF_ERROR(kern::copyFromHost(*stream, ptrs.back(), h.data(), h.size() * sizeof(float)));
        bufs.push_back(std::move(b).value());
    }
    OpDesc d;
    d.name = "gemms";
    d.category = trace::Category::Gemm;
    stream->submit(d, [&fn, ptrs, scope]() -> Status {
        kern::Bf16GemmScope gemms(scope);
        fn(ptrs);
        return Status::ok();
    });
    return stream->synchronize();
}

// y = x W^T under a bf16 GEMM scope (or outside one); the stream's status.
Status linear(bool emulate, const std::vector<float>& x, const std::vector<float>& W, int T, int in, int out,
              bool scope) {
    return underBf16Scope(
        emulate, {x, W, std::vector<float>(static_cast<size_t>(T) * out)},
        [&](const std::vector<float*>& p) { kern::linearForward(p[0], p[1], nullptr, p[2], T, in, out); }, scope);
}

TEST(Bf16GemmCheck, FailsAGemmWhoseOperandBf16WouldRoundAndNamesIt) {
    CheckBf16Gemms on;
    const int T = 3, in = 4, out = 2;
    std::vector<float> x = values(T * in, 0.25f), W = values(out * in, 0.5f);
    for (bool emulate : {false, true}) {
        const std::string where = emulate ? "emulated device" : "CPU backend";
        EXPECT_TRUE(linear(emulate, x, W, T, in, out, true).isOk()) << where << ": bf16 operands";
        std::vector<float> xBad = x;
        xBad[size_t(1 * in + 2)] = 1.0f + std::ldexp(1.0f, -12);  // 13 significant bits
        const Status s = linear(emulate, xBad, W, T, in, out, true);
        ASSERT_FALSE(s.isOk()) << where;
        EXPECT_NE(s.message().find("linearForward"), std::string::npos) << where << ": " << s.toString();
        EXPECT_NE(s.message().find("operand x"), std::string::npos) << where << ": " << s.toString();
        EXPECT_NE(s.message().find("[0, 1, 2]"), std::string::npos) << where << ": " << s.toString();
        std::vector<float> wBad = W;
        wBad[0] = 0.1f;
        const Status sw = linear(emulate, x, wBad, T, in, out, true);
        ASSERT_FALSE(sw.isOk()) << where;
        EXPECT_NE(sw.message().find("operand W"), std::string::npos) << where << ": " << sw.toString();
        // Outside a bf16 scope the GEMM is fp32 and any value is fine.
        EXPECT_TRUE(linear(emulate, xBad, wBad, T, in, out, false).isOk()) << where;
    }
}

constexpr float kNotBf16 = 1.0f + 1.0f / 4096.0f;

// The checked extents follow each GEMM's layout: transposed operands, leading dimensions wider
// than the matrix (their padding is not read), batches and the gaps between them, and the
// operands linearBackward's GEMMs read (dy; W for dx only; x for dW only).
TEST(Bf16GemmCheck, LooksAtWhatEachGemmReadsAndNothingElse) {
    CheckBf16Gemms on;
    const int M = 3, N = 2, K = 4, ld = 6;  // A^T stored [K, ld], B^T stored [N, ld]
    for (bool emulate : {false, true}) {
        const std::string where = emulate ? "emulated device" : "CPU backend";
        auto gemmT = [&](std::vector<float> A, std::vector<float> B) {
            return underBf16Scope(emulate, {A, B, std::vector<float>(size_t(M) * N)}, [&](const std::vector<float*>& p) {
                kern::gemm(true, true, M, N, K, 1.0f, p[0], ld, p[1], ld, 0.0f, p[2], N);
            });
        };
        std::vector<float> A = values(K * ld, 0.5f), B = values(N * ld, 0.25f);
        EXPECT_TRUE(gemmT(A, B).isOk()) << where;
        std::vector<float> a = A;
        a[size_t(3 * ld + M)] = kNotBf16;  // padding past A^T's M columns: not read
        EXPECT_TRUE(gemmT(a, B).isOk()) << where << ": A's padding";
        a[size_t(3 * ld + M - 1)] = kNotBf16;  // A^T[3, 2]
        Status s = gemmT(a, B);
        ASSERT_FALSE(s.isOk()) << where;
        EXPECT_NE(s.message().find("operand A"), std::string::npos) << s.toString();
        EXPECT_NE(s.message().find("[0, 3, 2]"), std::string::npos) << s.toString();
        std::vector<float> b = B;
        b[size_t(1 * ld + K)] = kNotBf16;  // padding past B^T's K columns
        EXPECT_TRUE(gemmT(A, b).isOk()) << where << ": B's padding";
        b[size_t(1 * ld + K - 1)] = kNotBf16;
        s = gemmT(A, b);
        ASSERT_FALSE(s.isOk()) << where;
        EXPECT_NE(s.message().find("operand B"), std::string::npos) << s.toString();

        // Two batches of A [M, K] 20 floats apart: the gap is not read, the second batch is.
        const int64_t stride = 20;
        auto batched = [&](std::vector<float> As) {
            return underBf16Scope(emulate, {As, values(K * N, 0.5f), std::vector<float>(size_t(2 * M * N))},
                                  [&](const std::vector<float*>& p) {
                                      kern::gemmStridedBatched(false, false, M, N, K, 1.0f, p[0], K, stride, p[1], N,
                                                               0, 0.0f, p[2], N, M * N, 2);
                                  });
        };
        std::vector<float> As = values(int(stride) + M * K, 0.25f);
        EXPECT_TRUE(batched(As).isOk()) << where;
        As[size_t(M * K + 1)] = kNotBf16;  // in the gap
        EXPECT_TRUE(batched(As).isOk()) << where << ": the gap between batches";
        As[size_t(stride + 1 * K + 2)] = kNotBf16;  // batch 1, [1, 2]
        s = batched(As);
        ASSERT_FALSE(s.isOk()) << where;
        EXPECT_NE(s.message().find("[1, 1, 2]"), std::string::npos) << s.toString();

        // linearBackward: dy [T, out], x [T, in], W [out, in].
        const int T = 3, in = 4, out = 2;
        auto backward = [&](std::vector<float> dy, std::vector<float> x, std::vector<float> W, bool dx, bool dW) {
            return underBf16Scope(emulate,
                                  {dy, x, W, std::vector<float>(size_t(T) * in), std::vector<float>(size_t(out) * in)},
                                  [&](const std::vector<float*>& p) {
                                      kern::linearBackward(p[0], p[1], p[2], dx ? p[3] : nullptr, dW ? p[4] : nullptr,
                                                           nullptr, T, in, out);
                                  });
        };
        const std::vector<float> dy = values(T * out, 0.25f), x = values(T * in, 0.5f), W = values(out * in, 0.5f);
        std::vector<float> badDy = dy, badX = x, badW = W;
        badDy[1] = badX[2] = badW[3] = kNotBf16;
        EXPECT_TRUE(backward(dy, badX, W, true, false).isOk()) << where << ": dgrad only does not read x";
        EXPECT_TRUE(backward(dy, x, badW, false, true).isOk()) << where << ": wgrad only does not read W";
        for (const auto& [what, st] : {std::pair<const char*, Status>{"operand dy", backward(badDy, x, W, true, true)},
                                       {"operand W", backward(dy, x, badW, true, false)},
                                       {"operand x", backward(dy, badX, W, false, true)}}) {
            ASSERT_FALSE(st.isOk()) << where << ": " << what;
            EXPECT_NE(st.message().find(std::string("linearBackward under bf16 GEMMs: ") + what), std::string::npos)
                << st.toString();
        }
    }
}

// What kern::fp8QuantizeDequantize writes is bound as codes at its scale: a bf16 GEMM may take
// it (its values are no bf16 values, their codes are), a sub-range too; a value written over it
// afterwards, or rows past the bound range, fail the check; the buffer's free forgets the
// binding. On the CPU backend and the emulated device.
TEST(Bf16GemmCheck, Fp8ValuesAtABoundScaleAreCheckedAsCodes) {
    CheckBf16Gemms on;
    const int T = 4, in = 8, out = 2;
    const float scale = 3.3f;  // 1/3.3 is no power of two: the stored values are no bf16 values
    const std::vector<float> x = values(T * in, 0.37f), W = values(out * in, 0.25f);
    for (bool emulate : {false, true}) {
        SCOPED_TRACE(emulate ? "emulated device" : "CPU backend");
        float* seen = nullptr;
        // fn(x, W, y) after x's first `rows` rows were quantized in place at `scale`.
        auto run = [&](int rows, const std::function<void(const std::vector<float*>&)>& fn) {
            return underBf16Scope(emulate, {x, W, std::vector<float>(size_t(T) * out)},
                                  [&](const std::vector<float*>& p) {
                                      seen = p[0];
                                      kern::fp8QuantizeDequantize(p[0], p[0], nullptr, int64_t(rows) * in, scale,
                                                                  kern::Fp8Format::E4M3);
                                      fn(p);
                                  });
        };
        auto fwd = [&](int rows, int first = 0) {
            return [=](const std::vector<float*>& p) {
                kern::linearForward(p[0] + first * in, p[1], nullptr, p[2], rows, in, out);
            };
        };
        EXPECT_TRUE(run(T, fwd(T)).isOk());
        EXPECT_EQ(kernels::fp8codes::map().scaleOf(seen, 1), 0.0f) << "the free forgets the binding";
        EXPECT_TRUE(run(T, fwd(2, 1)).isOk()) << "rows 1..2 of the bound range";
        Status st = run(T - 1, fwd(T));
        ASSERT_FALSE(st.isOk()) << "the last row is not bound";
        EXPECT_NE(st.message().find("operand x holds"), std::string::npos) << st.toString();
        const float bad = 0.1f;  // no E4M3 code at 3.3: 0.33 rounds to 0.328125
        st = run(T, [&](const std::vector<float*>& p) {
            kern::copyBytes(p[0] + 5, &bad, sizeof bad);
            fwd(T)(p);
        });
        ASSERT_FALSE(st.isOk()) << "a value written over the codes";
        EXPECT_NE(st.message().find("operand x is bound as E4M3 codes at scale 3.29999995 but holds 0.100000001 "
                                    "at [0, 0, 5]"),
                  std::string::npos)
            << st.toString();
        // Codes of the other format: E4M3's three mantissa bits are no E5M2 code, which an FP8 GEMM
        // would round (a bf16 GEMM would not).
        st = underBf16Scope(emulate, {x, W, std::vector<float>(size_t(T) * out)}, [&](const std::vector<float*>& p) {
            kern::fp8QuantizeDequantize(p[0], p[0], nullptr, int64_t(T) * in, scale, kern::Fp8Format::E4M3);
            kernels::fp8codes::map().bind(p[0], int64_t(T) * in, scale, int(kern::Fp8Format::E5M2));
            fwd(T)(p);
        });
        ASSERT_FALSE(st.isOk()) << "E4M3 codes bound as E5M2";
        EXPECT_NE(st.message().find("operand x is bound as E5M2 codes at scale 3.29999995"), std::string::npos)
            << st.toString();
        EXPECT_NE(st.message().find("which is no E5M2 code at that scale"), std::string::npos) << st.toString();
        // ... and E5M2's the other way round, where they lie in E4M3's range.
        st = underBf16Scope(emulate, {x, W, std::vector<float>(size_t(T) * out)}, [&](const std::vector<float*>& p) {
            kern::fp8QuantizeDequantize(p[0], p[0], nullptr, int64_t(T) * in, scale, kern::Fp8Format::E5M2);
            kernels::fp8codes::map().bind(p[0], int64_t(T) * in, scale, int(kern::Fp8Format::E4M3));
            fwd(T)(p);
        });
        EXPECT_TRUE(st.isOk()) << st.toString();
        // Without the binding the same stored values are no bf16 values.
        st = underBf16Scope(emulate, {x, W, std::vector<float>(size_t(T) * out)}, [&](const std::vector<float*>& p) {
            kern::fp8QuantizeDequantize(p[0], p[0], nullptr, int64_t(T) * in, scale, kern::Fp8Format::E4M3);
            kernels::fp8codes::map().forget(p[0], sizeof(float) * size_t(T) * in);
            fwd(T)(p);
        });
        EXPECT_FALSE(st.isOk());
    }
    // A binding replaces what it overlaps; the older ones keep their floats outside it.
    std::vector<float> a(32);
    auto& m = kernels::fp8codes::map();
    m.bind(a.data(), 10, 2.0f, 1);
    m.bind(a.data() + 20, 4, 8.0f, 0);
    EXPECT_EQ(m.scaleOf(a.data() + 2, 8), 2.0f);
    EXPECT_EQ(m.scaleOf(a.data() + 2, 9), 0.0f);
    m.bind(a.data() + 5, 10, 4.0f, 0);
    EXPECT_EQ(m.scaleOf(a.data(), 5), 2.0f) << "the older binding's floats before the new one";
    EXPECT_EQ(m.lookup(a.data(), 5).format, 1) << "and its format";
    EXPECT_EQ(m.scaleOf(a.data(), 6), 0.0f);
    EXPECT_EQ(m.scaleOf(a.data() + 6, 3), 4.0f);
    EXPECT_EQ(m.scaleOf(a.data() + 20, 4), 8.0f);
    m.bindLike(a.data() + 26, 4, a.data() + 1, 2);
    EXPECT_EQ(m.lookup(a.data() + 26, 4).scale, 2.0f) << "a copy is bound as its source";
    EXPECT_EQ(m.lookup(a.data() + 26, 4).format, 1);
    m.bindLike(a.data() + 26, 4, a.data() + 16, 2);
    EXPECT_EQ(m.lookup(a.data() + 26, 4).scale, 2.0f) << "an unbound source leaves the copy as it is";
    m.forget(a.data() + 26, sizeof(float) * 4);
    m.forget(a.data() + 21, sizeof(float) * 2);
    EXPECT_EQ(m.scaleOf(a.data() + 20, 1), 8.0f);
    EXPECT_EQ(m.scaleOf(a.data() + 23, 1), 8.0f);
    EXPECT_EQ(m.scaleOf(a.data() + 21, 1), 0.0f);
    m.forget(a.data() + 6, 0);  // nothing
    EXPECT_EQ(m.scaleOf(a.data() + 6, 3), 4.0f);
    // Scales whose stored values give no exact codes: bound as fp32-only (a GPU runs the GEMM in
    // fp32 on the stored values, which the check therefore leaves alone).
    for (float bad : {0.0f, -3.0f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::max(), 1e36f}) {
        m.bind(a.data() + 20, 4, bad, 0);
        EXPECT_EQ(m.scaleOf(a.data() + 20, 4), kernels::fp8codes::kFp32Only) << bad;
    }
    m.bind(a.data() + 20, 4, 1e33f, 0);  // 2^-16 / 1e33 is still a normal float
    EXPECT_EQ(m.scaleOf(a.data() + 20, 4), 1e33f);
    m.forget(a.data(), sizeof(float) * a.size());
    EXPECT_EQ(m.scaleOf(a.data() + 6, 3), 0.0f);
    for (bool emulate : {false, true}) {
        SCOPED_TRACE(emulate ? "emulated device" : "CPU backend");
        // codes up to about 100 at a scale of 3.3e37: 1/scale is a normal float with a full
        // mantissa (the stored values are no bf16 values), 2^-16 / scale is not
        const float huge = 3.3e37f;
        std::vector<float> tiny = x;
        for (float& v : tiny) v *= 100.0f / huge;
        const Status st = underBf16Scope(emulate, {tiny, W, std::vector<float>(size_t(T) * out)},
                                         [&](const std::vector<float*>& p) {
                                             kern::fp8QuantizeDequantize(p[0], p[0], nullptr, int64_t(T) * in, huge,
                                                                         kern::Fp8Format::E4M3);
                                             EXPECT_EQ(kernels::fp8codes::map().scaleOf(p[0], int64_t(T) * in),
                                                       kernels::fp8codes::kFp32Only);
                                             kern::linearForward(p[0], p[1], nullptr, p[2], T, in, out);
                                         });
        EXPECT_TRUE(st.isOk()) << "an fp32-only operand is not checked: " << st.toString();
    }
    // A Buffer made where a binding of other memory lay starts unbound.
    for (bool emulate : {false, true}) {
        auto backend = backendOf(emulate);
        Device& dev = backend->device(0);
        const float* at = nullptr;
        {
            auto b = dev.allocate(1024, MemCategory::Activations);
            ASSERT_TRUE(b.isOk());
            at = static_cast<const float*>((*b)->data());
        }
        m.bind(at, 16, 2.0f, 0);  // as a host vector's leftover binding would be
        auto b = dev.allocate(1024, MemCategory::Activations);
        ASSERT_TRUE(b.isOk());
        EXPECT_EQ(static_cast<const float*>((*b)->data()), at) << "the allocator reuses the block";
        EXPECT_EQ(m.scaleOf(at, 16), 0.0f) << (emulate ? "emulated device" : "CPU backend");
    }
}

// Codes whose scale lives on the device: tensorwise scaling's, made where the amax is
// (kern::fp8QuantizeCurrent, bound with the amax by Map::bindCurrent), and delayed scaling's, the
// step's scale read where it is (kern::fp8QuantizeDelayed, Map::bindScaleAt). They are checked at
// the scale that float gives when the GEMM's kernel runs, so one changed after the quantization
// fails them; a copy bound like them shares the float's owner, which the map drops when the last
// binding goes. On the CPU backend and the emulated device.
TEST(Bf16GemmCheck, Fp8ValuesAtADeviceScaleAreCheckedAsCodes) {
    CheckBf16Gemms on;
    const int T = 4, in = 8, out = 2;
    const float divisor = 2.0f;  // as a data-parallel rank's output gradients
    const std::vector<float> x = values(T * in, 0.37f), W = values(out * in, 0.25f);
    for (bool delayed : {false, true})
    for (bool emulate : {false, true}) {
        SCOPED_TRACE(std::string(delayed ? "delayed" : "tensorwise") + (emulate ? ", emulated device" : ", CPU backend"));
        auto owner = std::make_shared<int>(0);
        const std::weak_ptr<int> watch = owner;
        // x quantized in place at the scale p[3] gives (tensorwise: its amax, written there;
        // delayed: 3, no power of two, so that another scale gives other codes) and bound with
        // p[3]; then fn.
        auto run = [&](const std::function<void(const std::vector<float*>&)>& fn) {
            return underBf16Scope(emulate, {x, W, std::vector<float>(size_t(T) * out), {delayed ? 3.0f : 0.0f}, x},
                                  [&](const std::vector<float*>& p) {
                                      const int64_t n = int64_t(T) * in;
                                      const auto f = kern::Fp8Format::E4M3;
                                      if (delayed) {
                                          kern::fp8QuantizeDelayed(p[0], p[0], nullptr, n, p[3], divisor, f);
                                          kernels::fp8codes::map().bindScaleAt(p[0], n, p[3], divisor, int(f), owner);
                                      } else {
                                          kern::amaxInto(p[0], n, p[3]);
                                          kern::fp8QuantizeCurrent(p[0], p[0], nullptr, n, p[3], divisor, f, nullptr);
                                          kernels::fp8codes::map().bindCurrent(p[0], n, p[3], divisor, int(f), owner);
                                      }
                                      fn(p);
                                  });
        };
        EXPECT_TRUE(run([&](const std::vector<float*>& p) {
                        EXPECT_EQ(kernels::fp8codes::map().scaleOf(p[0], int64_t(T) * in),
                                  kernels::fp8codes::kOnDevice);
                        kern::linearForward(p[0], p[1], nullptr, p[2], T, in, out);
                    }).isOk());
        owner.reset();
        EXPECT_TRUE(watch.expired()) << "the buffer's free forgot the binding and dropped the scale's owner";
        owner = std::make_shared<int>(0);
        // Another amax or scale: the stored values are no codes at the scale it gives.
        const float other = 5.0f;
        Status st = run([&](const std::vector<float*>& p) {
            kern::copyBytes(p[3], &other, sizeof other);
            kern::linearForward(p[0], p[1], nullptr, p[2], T, in, out);
        });
        ASSERT_FALSE(st.isOk()) << "codes at the scale of a float written afterwards";
        EXPECT_NE(st.message().find("operand x is bound as E4M3 codes at scale"), std::string::npos) << st.toString();
        EXPECT_NE(st.message().find(delayed ? "made from its delayed scale 5 / 2" : "made from its amax 5 / 2"),
                  std::string::npos)
            << st.toString();
        // A copy (p[4], as a sequence-parallel gather's) bound like x is checked the same way and
        // holds the owner too.
        const std::weak_ptr<int> watch2 = owner;
        st = run([&](const std::vector<float*>& p) {
            kern::copyBytes(p[4], p[0], sizeof(float) * size_t(T) * in);
            kernels::fp8codes::map().bindLike(p[4], int64_t(T) * in, p[0], int64_t(T) * in);
            kernels::fp8codes::map().forget(p[0], sizeof(float) * size_t(T) * in);
            owner.reset();
            EXPECT_FALSE(watch2.expired()) << "the copy's binding holds the owner";
            kern::linearForward(p[4], p[1], nullptr, p[2], T, in, out);
        });
        EXPECT_TRUE(st.isOk()) << st.toString();
        EXPECT_TRUE(watch2.expired());
        owner = std::make_shared<int>(0);
    }
}

// Fp32GemmScope(true) takes the GEMMs inside it out of a bf16 scope; (false) leaves the
// surrounding setting as it is, on or off.
TEST(Bf16GemmCheck, Fp32GemmScopeTakesItsGemmsOutAndNothingElse) {
    CheckBf16Gemms on;
    const int T = 3, in = 4, out = 2;
    const std::vector<float> W = values(out * in, 0.25f);
    std::vector<float> badX = values(T * in, 0.5f);
    badX[5] = 1.0f + 1.0f / 1024;  // 11 significant bits
    for (bool emulate : {false, true}) {
        SCOPED_TRACE(emulate ? "emulated device" : "CPU backend");
        auto run = [&](bool scope, std::function<void(const std::vector<float*>&)> fn) {
            return underBf16Scope(emulate, {badX, W, std::vector<float>(size_t(T) * out)}, fn, scope);
        };
        auto fwd = [&](const std::vector<float*>& p) { kern::linearForward(p[0], p[1], nullptr, p[2], T, in, out); };
        const kern::Bf16GemmCounts c0 = kern::bf16GemmCounts();
        EXPECT_TRUE(run(true, [&](const std::vector<float*>& p) {
                        kern::Fp32GemmScope fp32(true);
                        EXPECT_FALSE(kern::Bf16GemmScope::active());
                        fwd(p);
                    }).isOk());
        EXPECT_FALSE(run(true, [&](const std::vector<float*>& p) {
                         kern::Fp32GemmScope fp32(false);
                         EXPECT_TRUE(kern::Bf16GemmScope::active());
                         fwd(p);
                     }).isOk());
        EXPECT_TRUE(run(false, [&](const std::vector<float*>& p) {
                        kern::Fp32GemmScope fp32(false);
                        EXPECT_FALSE(kern::Bf16GemmScope::active());
                        fwd(p);
                    }).isOk());
        // After each: the surrounding scope again.
        EXPECT_TRUE(run(true, [&](const std::vector<float*>& p) {
                        { kern::Fp32GemmScope fp32(true); }
                        EXPECT_TRUE(kern::Bf16GemmScope::active());
                    }).isOk());
        const kern::Bf16GemmCounts c1 = kern::bf16GemmCounts();
        EXPECT_EQ(c1.bf16 - c0.bf16, 1);
        EXPECT_EQ(c1.fp32 - c0.fp32, 2);
    }
}

// Every variant trains with the check on, and its GEMMs run where its precision says: a bf16
// model's in bf16, except the fp32 router of MoE layers; the FP8 linears (the experts' too) run
// bf16 GEMMs on codes at their bound scales, delayed scaling's step scales and tensorwise
// scaling's amax-made ones, both on the device; an fp32 model's in fp32.
// Each bf16 variant without FP8 runs a second time with hybrid tensorwise FP8, whose codes are
// bound with their amax wherever the variant's paths quantize (recompute, microbatches, shared
// experts, untied embeddings...).
TEST(Bf16GemmCheck, EveryTrainerVariantKeepsItsBf16GemmOperandsBf16) {
    CheckBf16Gemms on;
    std::vector<ts::testing::TrainerVariant> variants = ts::testing::trainerVariants();
    for (const ts::testing::TrainerVariant& v : ts::testing::trainerVariants()) {
        Config c = ts::testing::tinyTrainerConfig();
        v.edit(c);
        if (c.bf16 && c.fp8.empty())
            variants.push_back({v.name + ", hybrid tensorwise FP8", [edit = v.edit](Config& c) {
                                    edit(c);
                                    c.fp8 = "hybrid";
                                    c.fp8_recipe = "tensorwise";
                                }});
    }
    for (const auto& [name, edit] : variants) {
        Config c = ts::testing::tinyTrainerConfig();
        edit(c);
        c.train_iters = 3;
        const bool fp32Gemms = !c.bf16 || c.num_moe_experts > 0;
        for (bool emulate : {false, true}) {
            SCOPED_TRACE(name + (emulate ? " (emulated device)" : " (CPU backend)"));
            TrainerOptions o;
            o.emulateDevice = emulate;
            const kern::Bf16GemmCounts c0 = kern::bf16GemmCounts();
            const ts::testing::TrainRun r = ts::testing::trainRun(c, o);
            const kern::Bf16GemmCounts c1 = kern::bf16GemmCounts();
            EXPECT_EQ(r.losses.size(), size_t(c.train_iters));
            EXPECT_EQ(c1.bf16 > c0.bf16, c.bf16) << "bf16 GEMMs: " << c1.bf16 - c0.bf16;
            EXPECT_EQ(c1.fp32 > c0.fp32, fp32Gemms) << "fp32 GEMMs: " << c1.fp32 - c0.fp32;
        }
    }
}

}  // namespace
}  // namespace ts::engine
