// CUDA kernels vs the CPU oracle on random data: LayerNorm, bias-GeLU, AdamW, the cuBLAS GEMM
// and the linear layer on it. Skips without a CUDA build or without a device.
#include <gtest/gtest.h>

#include "tests/gpu/gpu_test_util.h"

#ifdef TS_HAVE_CUDA

#include <cuda_runtime.h>

#include "kernels/common/fp8_codes.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/ops_cuda.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace ts::kernels {
namespace {

using namespace gputest;

// |gpu - cpu| <= atol + rtol |cpu| element-wise; NaN never matches.
void expectNear(const std::vector<float>& got, const std::vector<float>& want, double rtol, double atol,
                const char* what) {
    expectClose(got, want, rtol, atol, what, {}, {}, /*nanMatchesNan=*/false);
}

class KernelsCuda : public CudaStreamTest {};

// The strided copy the CP all-to-all pack uses (kern::copy2D): rows of `w` floats out of rows of
// `spitch` floats into rows of `dpitch` floats, the rest of the destination untouched.
TEST_F(KernelsCuda, Copy2DMovesTheStridedRows) {
    const size_t rows = 37, w = 12, spitch = 40, dpitch = 16;
    const auto src = randomVec(rows * spitch, 77);
    const auto before = randomVec(rows * dpitch, 78);
    DeviceVec<float> gs(src), gd(before);
    TS_ASSERT_OK(gs.status);
    TS_ASSERT_OK(cuda::copy2DAsync(gd.ptr + 2, dpitch * sizeof(float), gs.ptr + 5, spitch * sizeof(float),
                                   w * sizeof(float), rows, m_stream));
    sync();
    std::vector<float> want = before;
    for (size_t r = 0; r < rows; ++r)
        for (size_t i = 0; i < w; ++i) want[2 + r * dpitch + i] = src[5 + r * spitch + i];
    expectSameBits(gd.download(), want, "copy2DAsync");
}

TEST_F(KernelsCuda, LayerNormForwardMatchesCpu) {
    const int T = 67, C = 300;
    const auto x = randomVec(T * C, 1, -3, 3), w = randomVec(C, 2), b = randomVec(C, 3);
    for (bool bias : {true, false}) {
        DeviceVec<float> dx(x), dw(w), db(b), dy(T * C), dm(T), dr(T);
        TS_ASSERT_OK(dx.status);
        TS_ASSERT_OK(cuda::layerNormForward(dx.ptr, dw.ptr, bias ? db.ptr : nullptr, dy.ptr, dm.ptr,
                                            dr.ptr, T, C, 1e-5f, false, m_stream));
        TS_ASSERT_OK(cuda::streamSynchronize(m_stream));
        std::vector<float> y(T * C), mean(T), rstd(T);
        cpu::layerNormForward(x.data(), w.data(), bias ? b.data() : nullptr, y.data(), mean.data(),
                              rstd.data(), T, C, 1e-5f);
        expectNear(dy.download(), y, 1e-4, 1e-5, "y");
        expectNear(dm.download(), mean, 1e-4, 1e-6, "mean");
        expectNear(dr.download(), rstd, 1e-4, 0, "rstd");
    }
}

TEST_F(KernelsCuda, BiasGeluForwardMatchesCpu) {
    const int T = 33, C = 1000;
    const auto x = randomVec(T * C, 4, -6, 6), b = randomVec(C, 5);
    DeviceVec<float> dx(x), db(b), dy(T * C);
    TS_ASSERT_OK(cuda::biasGeluForward(dx.ptr, db.ptr, dy.ptr, T, C, false, m_stream));
    TS_ASSERT_OK(cuda::streamSynchronize(m_stream));
    std::vector<float> y(T * C);
    cpu::biasGeluForward(x.data(), b.data(), y.data(), T, C);
    expectNear(dy.download(), y, 1e-5, 1e-6, "y");
}

// Bit for bit: the kernel rounds every product and sum as the oracle (compiled without FP
// contraction) does, so params, moments and the bf16 model copy are the CPU's exactly, with
// either branch of torch's lerp (beta1 0.9: weight 0.1; beta1 0.3: weight 0.7).
TEST_F(KernelsCuda, AdamWThreeStepsMatchCpu) {
    const int64_t n = 10007;
    for (const float beta1 : {0.9f, 0.3f}) {
        SCOPED_TRACE("beta1 " + std::to_string(beta1));
        auto p = randomVec(n, 6);
        std::vector<float> m(n, 0.f), v(n, 0.f);
        DeviceVec<float> dp(p), dm(m), dv(v);
        cpu::AdamParams hc, hg;  // cuda::AdamParams is the same struct
        hc.lr = hg.lr = 1e-3f;
        hc.beta1 = hg.beta1 = beta1;
        hc.beta2 = hg.beta2 = 0.95f;
        hc.weightDecay = hg.weightDecay = 0.1f;
        hc.gradScale = hg.gradScale = 0.6f;  // clipping folded into the update
        DeviceVec<uint16_t> dbits(static_cast<size_t>(n));
        std::vector<uint16_t> wantBits(static_cast<size_t>(n));
        for (int step = 1; step <= 3; ++step) {
            const auto g = randomVec(n, 10 + step, -2, 2);
            DeviceVec<float> dg(g);
            hc.step = hg.step = step;
            // the last step writes the bf16 model copy in the same pass
            TS_ASSERT_OK(
                cuda::adamwStep(dp.ptr, dg.ptr, dm.ptr, dv.ptr, n, hg, step == 3 ? dbits.ptr : nullptr, m_stream));
            TS_ASSERT_OK(cuda::streamSynchronize(m_stream));
            cpu::adamwStep(p.data(), g.data(), m.data(), v.data(), n, hc, step == 3 ? wantBits.data() : nullptr);
        }
        expectEqualInts(dbits.download(), wantBits, "the model copy's bits");
        expectNear(dp.download(), p, 0, 0, "param");
        expectNear(dm.download(), m, 0, 0, "exp_avg");
        expectNear(dv.download(), v, 0, 0, "exp_avg_sq");
    }
}

TEST_F(KernelsCuda, LinearForwardAndBackwardMatchCpu) {
    const int T = 70, in = 96, out = 130;
    const auto x = randomVec(T * in, 8), W = randomVec(out * in, 9), b = randomVec(out, 10);
    const auto dy = randomVec(T * out, 11), dW0 = randomVec(out * in, 12), db0 = randomVec(out, 13);
    for (bool bias : {true, false}) {
        DeviceVec<float> dx(x), dWt(W), dbias(b), dyv(T * out);
        TS_ASSERT_OK(cuda::linearForward(dx.ptr, dWt.ptr, bias ? dbias.ptr : nullptr, dyv.ptr, T, in, out,
                                         m_stream));
        TS_ASSERT_OK(cuda::streamSynchronize(m_stream));
        std::vector<float> y(T * out);
        cpu::linearForward(x.data(), W.data(), bias ? b.data() : nullptr, y.data(), T, in, out);
        expectNear(dyv.download(), y, 1e-4, 1e-4, "y");
    }
    // Backward: dx overwritten, dW and db accumulated onto what is there.
    DeviceVec<float> ddy(dy), dx(x), dWt(W), gx(T * in), gW(dW0), gb(db0);
    TS_ASSERT_OK(cuda::linearBackward(ddy.ptr, dx.ptr, dWt.ptr, gx.ptr, gW.ptr, gb.ptr, T, in, out, m_stream));
    TS_ASSERT_OK(cuda::streamSynchronize(m_stream));
    std::vector<float> cx(T * in), cW = dW0, cb = db0;
    cpu::linearBackward(dy.data(), x.data(), W.data(), cx.data(), cW.data(), cb.data(), T, in, out);
    expectNear(gx.download(), cx, 1e-4, 1e-4, "dx");
    expectNear(gW.download(), cW, 1e-4, 1e-4, "dW");
    expectNear(gb.download(), cb, 1e-4, 1e-4, "db");
    EXPECT_FALSE(cuda::linearForward(nullptr, nullptr, nullptr, nullptr, 1, 0, 1, m_stream).isOk());
}

TEST_F(KernelsCuda, GemmTransposesMatchCpu) {
    const int M = 37, N = 29, K = 41;
    for (bool ta : {false, true})
        for (bool tb : {false, true}) {
            const auto A = randomVec(M * K, 20 + ta), B = randomVec(K * N, 22 + tb), C0 = randomVec(M * N, 24);
            const int lda = ta ? M : K, ldb = tb ? K : N;
            DeviceVec<float> dA(A), dB(B), dC(C0);
            TS_ASSERT_OK(cuda::gemm(ta, tb, M, N, K, 0.5f, dA.ptr, lda, dB.ptr, ldb, 2.0f, dC.ptr, N, m_stream));
            TS_ASSERT_OK(cuda::streamSynchronize(m_stream));
            std::vector<float> C = C0;
            cpu::gemm(ta, tb, M, N, K, 0.5f, A.data(), lda, B.data(), ldb, 2.0f, C.data(), N);
            expectNear(dC.download(), C, 1e-4, 1e-4, ta ? (tb ? "TT" : "TN") : (tb ? "NT" : "NN"));
        }
}

// Delayed scaling's device observation: the running max of amax / divisor, NaN sticking, bit for
// bit the oracle's (a max and one correctly rounded division).
TEST_F(KernelsCuda, AmaxAccumulateMatchesCpu) {
    const auto a = randomVec(100003, 70, -5, 5), b = randomVec(777, 71, -9, 9);
    std::vector<float> nan = randomVec(33, 72);
    nan[17] = std::nanf("");
    DeviceVec<float> da(a), db(b), dn(nan), slot(std::vector<float>{0.5f});
    float want = 0.5f;
    TS_ASSERT_OK(cuda::amaxAccumulate(da.ptr, int64_t(a.size()), 3.0f, slot.ptr, m_stream));
    cpu::amaxAccumulate(a.data(), int64_t(a.size()), 3.0f, &want);
    TS_ASSERT_OK(cuda::amaxAccumulate(db.ptr, int64_t(b.size()), 0.7f, slot.ptr, m_stream));
    cpu::amaxAccumulate(b.data(), int64_t(b.size()), 0.7f, &want);
    TS_ASSERT_OK(cuda::streamSynchronize(m_stream));
    expectSameBits(slot.download(), {want}, "amaxAccumulate");
    TS_ASSERT_OK(cuda::amaxAccumulate(dn.ptr, int64_t(nan.size()), 1.0f, slot.ptr, m_stream));
    TS_ASSERT_OK(cuda::amaxAccumulate(da.ptr, int64_t(a.size()), 1.0f, slot.ptr, m_stream));
    TS_ASSERT_OK(cuda::streamSynchronize(m_stream));
    EXPECT_TRUE(std::isnan(slot.download()[0])) << "NaN must stick";
}

// Current scaling with the amax on the device: codes, values and the observed amax bit for bit.
TEST_F(KernelsCuda, Fp8QuantizeCurrentMatchesCpu) {
    const auto x = randomVec(50021, 80, -30, 30);
    for (const float amax : {0.f, 30.f, 61.5f})
        for (const float divisor : {1.f, 2.f}) {
            DeviceVec<float> dx(x), dy(x.size()), da(std::vector<float>{amax}), dobs(std::vector<float>{-1.f});
            DeviceVec<uint8_t> dc(x.size());
            TS_ASSERT_OK(cuda::fp8QuantizeCurrent(dx.ptr, dy.ptr, dc.ptr, int64_t(x.size()), da.ptr, divisor,
                                                  cpu::Fp8Format::E4M3, dobs.ptr, m_stream));
            TS_ASSERT_OK(cuda::streamSynchronize(m_stream));
            std::vector<float> y(x.size());
            std::vector<uint8_t> codes(x.size());
            float observed = -1.f;
            cpu::fp8QuantizeCurrent(x.data(), y.data(), codes.data(), int64_t(x.size()), &amax, divisor,
                                    cpu::Fp8Format::E4M3, &observed);
            const std::string what = "fp8QuantizeCurrent amax " + std::to_string(amax) + " / " + std::to_string(divisor);
            expectSameBits(dy.download(), y, what);
            EXPECT_EQ(dc.download(), codes) << what;
            expectSameBits(dobs.download(), {observed}, what + " observed");
        }
}

// Delayed scaling with the step's scale on the device (a graph's kernels read each step's): codes
// and values bit for bit, and another scale written there quantizes at it.
TEST_F(KernelsCuda, Fp8QuantizeDelayedMatchesCpu) {
    const auto x = randomVec(50021, 81, -30, 30);
    for (const float scale : {1.f, 7.3f, 448.f / 61.5f})
        for (const float divisor : {1.f, 2.f}) {
            DeviceVec<float> dx(x), dy(x.size()), ds(std::vector<float>{scale});
            DeviceVec<uint8_t> dc(x.size());
            TS_ASSERT_OK(cuda::fp8QuantizeDelayed(dx.ptr, dy.ptr, dc.ptr, int64_t(x.size()), ds.ptr, divisor,
                                                  cpu::Fp8Format::E4M3, m_stream));
            TS_ASSERT_OK(cuda::streamSynchronize(m_stream));
            std::vector<float> y(x.size());
            std::vector<uint8_t> codes(x.size());
            cpu::fp8QuantizeDelayed(x.data(), y.data(), codes.data(), int64_t(x.size()), &scale, divisor,
                                    cpu::Fp8Format::E4M3);
            const std::string what = "fp8QuantizeDelayed scale " + std::to_string(scale) + " / " + std::to_string(divisor);
            expectSameBits(dy.download(), y, what);
            EXPECT_EQ(dc.download(), codes) << what;
        }
}

// bf16 GEMMs on, with or without FAST_16BF, for a test's scope; both restored after.
struct Bf16GemmsOn {
    bool fastBefore = cuda::fast16bfGemms();
    explicit Bf16GemmsOn(bool fast) {
        cuda::setBf16Gemms(true);
        cuda::setFast16bfGemms(fast);
    }
    ~Bf16GemmsOn() {
        cuda::setBf16Gemms(false);
        cuda::setFast16bfGemms(fastBefore);
    }
};

// gemm in every transpose on raw fp32 operands against the oracle on their bf16 rounding (the
// same products; only the order of the fp32 sums differs) and not the fp32 result (the rounding
// really happens). Returns the largest difference from the rounded oracle.
double checkBf16GemmTransposes(void* stream, const std::string& tag) {
    auto bf = [](std::vector<float> v) {
        cpu::roundToBf16(v.data(), int64_t(v.size()));
        return v;
    };
    const int M = 67, N = 45, K = 131;
    double worst = 0;
    for (bool ta : {false, true})
        for (bool tb : {false, true}) {
            const auto A = randomVec(M * K, 40 + ta), B = randomVec(K * N, 42 + tb), C0 = randomVec(M * N, 44);
            const int lda = ta ? M : K, ldb = tb ? K : N;
            DeviceVec<float> dA(A), dB(B), dC(C0);
            const std::string what = tag + (ta ? (tb ? " TT" : " TN") : (tb ? " NT" : " NN"));
            const Status st = cuda::gemm(ta, tb, M, N, K, 0.5f, dA.ptr, lda, dB.ptr, ldb, 2.0f, dC.ptr, N, stream);
            EXPECT_TRUE(st.isOk()) << what << ": " << st.toString();
            const Status synced = cuda::streamSynchronize(stream);
            EXPECT_TRUE(synced.isOk()) << what << ": " << synced.toString();
            std::vector<float> C = C0, Cfp32 = C0;
            const auto Ab = bf(A), Bb = bf(B);
            cpu::gemm(ta, tb, M, N, K, 0.5f, Ab.data(), lda, Bb.data(), ldb, 2.0f, C.data(), N);
            cpu::gemm(ta, tb, M, N, K, 0.5f, A.data(), lda, B.data(), ldb, 2.0f, Cfp32.data(), N);
            const auto got = dC.download();
            expectNear(got, C, 1e-4, 1e-4, what.c_str());
            double off = 0;
            for (size_t i = 0; i < got.size(); ++i) {
                off = std::max(off, double(std::fabs(got[i] - Cfp32[i])));
                worst = std::max(worst, double(std::fabs(got[i] - C[i])));
            }
            EXPECT_GT(off, 1e-4) << what << ": the fp32 result; the operands were not rounded to bf16";
        }
    return worst;
}

// setBf16Gemms: the operands go to bf16 (round to nearest even) and the products are summed in
// fp32 on the tensor cores. Against the oracle on the bf16-rounded operands: gemm in every
// transpose (checkBf16GemmTransposes), a strided batch with a broadcast operand (stride 0, as
// attention's GQA), and the linear layer's forward and backward (the wgrad accumulated into an
// fp32 main grad).
TEST_F(KernelsCuda, Bf16GemmsEqualTheOracleOnBf16RoundedOperands) {
    auto bf = [](std::vector<float> v) {
        cpu::roundToBf16(v.data(), int64_t(v.size()));
        return v;
    };
    const Bf16GemmsOn on(false);  // the copies made here, whatever TS_CUDA_GEMM_FAST_16BF says
    const int M = 67, N = 45, K = 131;
    checkBf16GemmTransposes(m_stream, "bf16");
    {
        // [batch 3] x [M, K] times one shared [K, N] (stride 0)
        const int batch = 3;
        const auto A = bf(randomVec(batch * M * K, 50)), B = bf(randomVec(K * N, 51));
        DeviceVec<float> dA(A), dB(B), dC(size_t(batch) * M * N);
        TS_ASSERT_OK(cuda::gemmStridedBatched(false, false, M, N, K, 1.0f, dA.ptr, K, int64_t(M) * K, dB.ptr, N, 0, 0.0f,
                                              dC.ptr, N, int64_t(M) * N, batch, m_stream));
        TS_ASSERT_OK(cuda::streamSynchronize(m_stream));
        std::vector<float> C(size_t(batch) * M * N);
        cpu::gemmStridedBatched(false, false, M, N, K, 1.0f, A.data(), K, int64_t(M) * K, B.data(), N, 0, 0.0f, C.data(),
                                N, int64_t(M) * N, batch);
        expectNear(dC.download(), C, 1e-4, 1e-4, "bf16 strided batch");
    }
    {
        const int T = 53, in = 96, out = 80;
        const auto x = bf(randomVec(T * in, 60)), W = bf(randomVec(out * in, 61)), b = randomVec(out, 62);
        const auto dy = bf(randomVec(T * out, 63)), g0 = randomVec(out * in, 64);
        DeviceVec<float> dx(x), dW(W), db(b), dy_(dy), dyOut(size_t(T) * out), ddx(size_t(T) * in), dG(g0);
        TS_ASSERT_OK(cuda::linearForward(dx.ptr, dW.ptr, db.ptr, dyOut.ptr, T, in, out, m_stream));
        TS_ASSERT_OK(cuda::linearBackward(dy_.ptr, dx.ptr, dW.ptr, ddx.ptr, dG.ptr, nullptr, T, in, out, m_stream));
        TS_ASSERT_OK(cuda::streamSynchronize(m_stream));
        std::vector<float> y(size_t(T) * out), gx(size_t(T) * in), G = g0;
        cpu::linearForward(x.data(), W.data(), b.data(), y.data(), T, in, out);
        cpu::linearBackward(dy.data(), x.data(), W.data(), gx.data(), G.data(), nullptr, T, in, out);
        expectNear(dyOut.download(), y, 1e-4, 1e-4, "bf16 linearForward");
        expectNear(ddx.download(), gx, 1e-4, 1e-4, "bf16 linearBackward dx");
        expectNear(dG.download(), G, 1e-4, 1e-4, "bf16 linearBackward dW (accumulated)");
    }
}

// The MoE experts' grouped GEMMs (linearForwardGrouped / linearBackwardGrouped) against the
// oracle's, in fp32 and under bf16 GEMMs (where the shared operands are converted once for every
// group): an empty group, rows outside the groups, a group without a bias, dW and db accumulated.
TEST_F(KernelsCuda, GroupedLinearMatchesCpu) {
    auto bf = [](std::vector<float> v) {
        cpu::roundToBf16(v.data(), int64_t(v.size()));
        return v;
    };
    const int in = 64, out = 48, G = 4, total = 70;
    const int off[G + 1] = {3, 30, 30, 31, 66};
    for (bool bf16 : {false, true}) {
        SCOPED_TRACE(bf16 ? "bf16 GEMMs" : "fp32 GEMMs");
        const auto x = bf(randomVec(size_t(total) * in, 80)), dy = bf(randomVec(size_t(total) * out, 81));
        DeviceVec<float> dx(x), ddy(dy), y(std::vector<float>(size_t(total) * out, 7.0f)),
            gx(std::vector<float>(size_t(total) * in, 9.0f));
        std::vector<std::vector<float>> W, b, dW0, db0;
        std::vector<std::unique_ptr<DeviceVec<float>>> dW, db, gW, gb;
        std::vector<const float*> Wd, bd, Wh, bh;
        std::vector<float*> gWd, gbd;
        for (int g = 0; g < G; ++g) {
            W.push_back(bf(randomVec(size_t(out) * in, 90 + g)));
            b.push_back(randomVec(size_t(out), 100 + g));
            dW0.push_back(randomVec(size_t(out) * in, 110 + g));
            db0.push_back(randomVec(size_t(out), 120 + g));
            dW.push_back(std::make_unique<DeviceVec<float>>(W.back()));
            db.push_back(std::make_unique<DeviceVec<float>>(b.back()));
            gW.push_back(std::make_unique<DeviceVec<float>>(dW0.back()));
            gb.push_back(std::make_unique<DeviceVec<float>>(db0.back()));
            Wd.push_back(dW.back()->ptr);
            bd.push_back(g == 2 ? nullptr : db.back()->ptr);
            Wh.push_back(W.back().data());
            bh.push_back(g == 2 ? nullptr : b.back().data());
            gWd.push_back(gW.back()->ptr);
            gbd.push_back(gb.back()->ptr);
        }
        {
            const Bf16GemmsOn on(false);
            if (!bf16) cuda::setBf16Gemms(false);
            TS_ASSERT_OK(cuda::linearForwardGrouped(dx.ptr, Wd.data(), bd.data(), y.ptr, off, G, in, out, m_stream));
            TS_ASSERT_OK(cuda::linearBackwardGrouped(ddy.ptr, dx.ptr, Wd.data(), gx.ptr, gWd.data(), gbd.data(), off, G,
                                                     in, out, m_stream));
            TS_ASSERT_OK(cuda::streamSynchronize(m_stream));
        }
        std::vector<float> wantY(size_t(total) * out, 7.0f), wantGx(size_t(total) * in, 9.0f);
        auto wantGW = dW0, wantGb = db0;
        std::vector<float*> hGW, hGb;
        for (int g = 0; g < G; ++g) {
            hGW.push_back(wantGW[size_t(g)].data());
            hGb.push_back(wantGb[size_t(g)].data());
        }
        cpu::linearForwardGrouped(x.data(), Wh.data(), bh.data(), wantY.data(), off, G, in, out);
        cpu::linearBackwardGrouped(dy.data(), x.data(), Wh.data(), wantGx.data(), hGW.data(), hGb.data(), off, G, in,
                                   out);
        expectNear(y.download(), wantY, 1e-4, 1e-4, "grouped forward");
        expectNear(gx.download(), wantGx, 1e-4, 1e-4, "grouped dgrad");
        for (int g = 0; g < G; ++g) {
            expectNear(gW[size_t(g)]->download(), wantGW[size_t(g)], 1e-4, 1e-4, "grouped wgrad (accumulated)");
            expectNear(gb[size_t(g)]->download(), wantGb[size_t(g)], 1e-4, 1e-4, "grouped bias grad");
        }
    }
    const int bad[3] = {0, 5, 4};  // descending offsets
    const float* none[2] = {nullptr, nullptr};
    EXPECT_FALSE(cuda::linearForwardGrouped(nullptr, none, nullptr, nullptr, bad, 2, in, out, m_stream).isOk());
}

// setFast16bfGemms (TS_CUDA_GEMM_FAST_16BF): cuBLAS rounds the fp32 operands itself. Against the
// same oracle as the copies made here (round to nearest even); the largest difference is printed,
// to tell whether cuBLAS rounds the same way (a few 1e-6 of fp32 summation order if so).
TEST_F(KernelsCuda, Fast16bfGemmsEqualTheOracleOnBf16RoundedOperands) {
    const Bf16GemmsOn on(true);
    const double worst = checkBf16GemmTransposes(m_stream, "FAST_16BF");
    std::printf("[fast 16bf] largest difference from the round-to-nearest-even oracle: %.3g\n", worst);
    // cuBLAS's own rounding, bit for bit: A times the identity is A rounded to bf16 (one exact
    // product per element), for values at a tie (even and odd last kept bit), a bit either side
    // of one, and random ones; all normal, so flushing plays no part.
    const int K = 64, M = 5 * K;
    std::vector<float> A(size_t(M) * K), I(size_t(K) * K, 0.0f);
    for (int k = 0; k < K; ++k) I[size_t(k) * K + k] = 1.0f;
    const std::vector<float> r = randomVec(A.size(), 90);
    const char* kinds[] = {"tie, even kept bit", "tie, odd kept bit", "just above a tie", "just below a tie", "random"};
    for (size_t i = 0; i < A.size(); ++i) {
        uint32_t bits;
        std::memcpy(&bits, &r[i], 4);
        const int kind = int(i / (size_t(K) * K));
        const uint32_t hi = (bits & 0xFFFF0000u) | (kind == 1 ? 0x10000u : 0u);  // kind 1: odd last kept bit
        if (kind == 0) bits = (hi & ~0x10000u) | 0x8000u;
        else if (kind == 1) bits = hi | 0x8000u;
        else if (kind == 2) bits = (hi & 0xFFFF0000u) | 0x8001u;
        else if (kind == 3) bits = (hi & 0xFFFF0000u) | 0x7FFFu;
        std::memcpy(&A[i], &bits, 4);
    }
    DeviceVec<float> dA(A), dI(I), dC(A.size());
    const Status st = cuda::gemm(false, false, M, K, K, 1.0f, dA.ptr, K, dI.ptr, K, 0.0f, dC.ptr, K, m_stream);
    ASSERT_TRUE(st.isOk()) << st.toString();
    TS_ASSERT_OK(cuda::streamSynchronize(m_stream));
    std::vector<float> want = A;
    cpu::roundToBf16(want.data(), int64_t(want.size()));
    const std::vector<float> got = dC.download();
    for (int kind = 0; kind < 5; ++kind) {
        int mismatches = 0;
        for (size_t i = size_t(kind) * K * K; i < size_t(kind + 1) * K * K; ++i)
            mismatches += std::memcmp(&got[i], &want[i], 4) != 0;
        std::printf("[fast 16bf] %s: %d of %d differ from round to nearest even\n", kinds[kind], mismatches, K * K);
        EXPECT_EQ(mismatches, 0) << kinds[kind] << ": cuBLAS's FAST_16BF does not round as the bf16 copies do";
    }
}

// setFp8Gemms for a test's scope.
struct Fp8GemmsOn {
    bool before = cuda::fp8Gemms();
    explicit Fp8GemmsOn(bool on) { cuda::setFp8Gemms(on); }
    ~Fp8GemmsOn() { cuda::setFp8Gemms(before); }
};

// Floats bound as FP8 codes for one test (also when an assertion ends it early).
struct BoundCodes {
    std::vector<std::pair<const float*, int64_t>> ranges;
    void bind(const float* p, int64_t n, float s, cpu::Fp8Format f) {
        fp8codes::map().bind(p, n, s, int(f));
        ranges.push_back({p, n});
    }
    ~BoundCodes() {
        for (const auto& [p, n] : ranges) fp8codes::map().forget(p, sizeof(float) * size_t(n));
    }
};

std::vector<float> quantizedAt(std::vector<float> v, float scale, cpu::Fp8Format f) {
    cpu::fp8QuantizeDequantize(v.data(), v.data(), nullptr, int64_t(v.size()), scale, f);
    return v;
}

bool gpuHasFp8TensorCores() {
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev))
        return false;
    return major > 8 || (major == 8 && minor >= 9);
}

// The sums of the products' magnitudes of each element of the linear layer's forward (y), dgrad
// (gx) and wgrad (G): its GEMMs on the operands' absolute values.
struct LinearSums {
    std::vector<float> y, gx, G;
};
LinearSums linearProductSums(const std::vector<float>& x, const std::vector<float>& W, const std::vector<float>& dy,
                             int T, int in, int out) {
    auto abs = [](std::vector<float> v) {
        for (float& e : v) e = std::fabs(e);
        return v;
    };
    LinearSums s{std::vector<float>(size_t(T) * out), std::vector<float>(size_t(T) * in),
                 std::vector<float>(size_t(out) * in, 0.0f)};
    cpu::linearForward(abs(x).data(), abs(W).data(), nullptr, s.y.data(), T, in, out);
    cpu::linearBackward(abs(dy).data(), abs(x).data(), abs(W).data(), s.gx.data(), s.G.data(), nullptr, T, in, out);
    return s;
}

// What an FP8 GEMM may differ from the oracle by: 2^-9 of the sum of each element's products'
// magnitudes (cuBLASLt's FP8 kernels accumulate in fp32 with periodic promotion; the products of
// FP8 values are exact), plus fp32 rounding of the result (a wgrad accumulated into its grad).
// Prints the largest difference seen, as a fraction of that sum.
void expectWithinProductSums(const std::vector<float>& got, const std::vector<float>& want,
                             const std::vector<float>& sums, const char* what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    double worst = 0;
    int bad = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        const double d = std::fabs(double(got[i]) - want[i]);
        worst = std::max(worst, d / std::max(double(sums[i]), 1e-30));
        if (!(d <= 0x1p-9 * sums[i] + 1e-6 * std::fabs(want[i])) && bad++ < 5)
            ADD_FAILURE() << what << " [" << i << "]: " << got[i] << ", want " << want[i] << " (products' sum "
                          << sums[i] << ")";
    }
    std::printf("[fp8 gemm] %s: largest difference %.3g of the products' magnitudes\n", what, worst);
}

// fp8CodesToFp8 gives the oracle's codes (cpu::fp8Encode of x * scale) bit for bit, in place and
// transposed, for a matrix with a row stride wider than its rows and sizes off the 32 x 32 tiles.
TEST_F(KernelsCuda, Fp8CodesToFp8GivesTheOraclesCodes) {
    const int rows = 45, cols = 37, ld = 50;
    for (cpu::Fp8Format f : {cpu::Fp8Format::E4M3, cpu::Fp8Format::E5M2}) {
        const float scale = f == cpu::Fp8Format::E4M3 ? 211.3f : 1.9e4f;
        const auto x = quantizedAt(randomVec(size_t(rows) * ld, 90, -2, 2), scale, f);
        DeviceVec<float> dx(x);
        for (bool transpose : {false, true}) {
            DeviceVec<uint8_t> y(size_t(rows) * cols);
            const fp8codes::Binding codes{scale, int(f)};
            TS_ASSERT_OK(cuda::fp8CodesToFp8(dx.ptr, rows, cols, ld, transpose, codes, y.ptr, m_stream));
            TS_ASSERT_OK(cuda::streamSynchronize(m_stream));
            const std::vector<uint8_t> got = y.download();
            int bad = 0;
            for (int r = 0; r < rows; ++r)
                for (int c = 0; c < cols; ++c) {
                    const uint8_t want = cpu::fp8Encode(x[size_t(r) * ld + c] * scale, f);
                    const uint8_t g = transpose ? got[size_t(c) * rows + r] : got[size_t(r) * cols + c];
                    if (g != want && bad++ < 5)
                        ADD_FAILURE() << (f == cpu::Fp8Format::E4M3 ? "E4M3" : "E5M2")
                                      << (transpose ? " transposed" : "") << ": code of [" << r << ", " << c
                                      << "] is " << int(g) << ", want " << int(want);
                }
            EXPECT_EQ(bad, 0);
        }
    }
}

// With FP8 GEMMs on, the linear layer whose operands are all FP8 codes (x and W E4M3, dy E5M2, as
// the hybrid recipe stores them) multiplies the codes on FP8 tensor cores: the forward, the dgrad
// (W read transposed) and the wgrad (dy and x read transposed, accumulated into an fp32 main
// grad), each the oracle's fp32 GEMM of the stored values up to the summation (the products of
// FP8 values are exact in fp32; cuBLASLt's FP8 kernels accumulate in fp32 with periodic
// promotion, hence a tolerance above the bf16 path's). The GEMMs that do not qualify run on bf16
// as before: a K off the multiples of 16, and E5M2 times E5M2.
TEST_F(KernelsCuda, Fp8GemmsMultiplyFp8CodesOnTheTensorCores) {
    if (!gpuHasFp8TensorCores()) GTEST_SKIP() << "this GPU has no FP8 tensor cores (sm_89 or later)";
    const Bf16GemmsOn on(false);
    const Fp8GemmsOn fp8(true);
    const int T = 64, in = 96, out = 80;
    const float sx = 37.7f, sw = 211.3f, sdy = 1.9e4f;
    const auto x = quantizedAt(randomVec(T * in, 91), sx, cpu::Fp8Format::E4M3);
    const auto W = quantizedAt(randomVec(out * in, 92), sw, cpu::Fp8Format::E4M3);
    const auto dy = quantizedAt(randomVec(T * out, 93, -1e-3f, 1e-3f), sdy, cpu::Fp8Format::E5M2);
    const auto g0 = randomVec(out * in, 94);
    DeviceVec<float> dx(x), dW(W), ddy(dy), y(size_t(T) * out), gx(size_t(T) * in), G(g0);
    BoundCodes bound;
    bound.bind(dx.ptr, int64_t(x.size()), sx, cpu::Fp8Format::E4M3);
    bound.bind(dW.ptr, int64_t(W.size()), sw, cpu::Fp8Format::E4M3);
    bound.bind(ddy.ptr, int64_t(dy.size()), sdy, cpu::Fp8Format::E5M2);
    const int64_t before = cuda::fp8GemmCount();
    TS_ASSERT_OK(cuda::linearForward(dx.ptr, dW.ptr, nullptr, y.ptr, T, in, out, m_stream));
    TS_ASSERT_OK(cuda::linearBackward(ddy.ptr, dx.ptr, dW.ptr, gx.ptr, G.ptr, nullptr, T, in, out, m_stream));
    TS_ASSERT_OK(cuda::streamSynchronize(m_stream));
    EXPECT_EQ(cuda::fp8GemmCount() - before, 3) << "forward, dgrad and wgrad on the FP8 tensor cores";
    std::vector<float> wantY(size_t(T) * out), wantGx(size_t(T) * in), wantG = g0;
    cpu::linearForward(x.data(), W.data(), nullptr, wantY.data(), T, in, out);
    cpu::linearBackward(dy.data(), x.data(), W.data(), wantGx.data(), wantG.data(), nullptr, T, in, out);
    const LinearSums sums = linearProductSums(x, W, dy, T, in, out);
    expectWithinProductSums(y.download(), wantY, sums.y, "linearForward");
    expectWithinProductSums(gx.download(), wantGx, sums.gx, "linearBackward dx");
    expectWithinProductSums(G.download(), wantG, sums.G, "linearBackward dW (accumulated)");
    // What does not qualify: the bf16 path, the same results.
    const int K2 = 72;  // x [T, 72] W [out, 72]
    const auto x2 = quantizedAt(randomVec(T * K2, 95), sx, cpu::Fp8Format::E4M3);
    const auto W2 = quantizedAt(randomVec(out * K2, 96), sw, cpu::Fp8Format::E4M3);
    DeviceVec<float> dx2(x2), dW2(W2), y2(size_t(T) * out);
    bound.bind(dx2.ptr, int64_t(x2.size()), sx, cpu::Fp8Format::E4M3);
    bound.bind(dW2.ptr, int64_t(W2.size()), sw, cpu::Fp8Format::E4M3);
    const auto dy2 = quantizedAt(randomVec(T * out, 97), sdy, cpu::Fp8Format::E5M2);
    DeviceVec<float> ddy2(dy2), G2(size_t(out) * out);
    bound.bind(ddy2.ptr, int64_t(dy2.size()), sdy, cpu::Fp8Format::E5M2);
    const int64_t mid = cuda::fp8GemmCount();
    TS_ASSERT_OK(cuda::linearForward(dx2.ptr, dW2.ptr, nullptr, y2.ptr, T, K2, out, m_stream));
    // dy2^T dy2: E5M2 times E5M2, which cuBLASLt has no kernel for
    TS_ASSERT_OK(cuda::gemm(true, false, out, out, T, 1.0f, ddy2.ptr, out, ddy2.ptr, out, 0.0f, G2.ptr, out, m_stream));
    TS_ASSERT_OK(cuda::streamSynchronize(m_stream));
    EXPECT_EQ(cuda::fp8GemmCount(), mid) << "K = 72 and E5M2 x E5M2 stay on bf16";
    std::vector<float> wantY2(size_t(T) * out), wantG2(size_t(out) * out);
    cpu::linearForward(x2.data(), W2.data(), nullptr, wantY2.data(), T, K2, out);
    cpu::gemm(true, false, out, out, T, 1.0f, dy2.data(), out, dy2.data(), out, 0.0f, wantG2.data(), out);
    expectNear(y2.download(), wantY2, 1e-5, 1e-5, "K off 16: bf16 GEMM");
    expectNear(G2.download(), wantG2, 1e-5, 1e-5, "E5M2 x E5M2: bf16 GEMM");
}

// Tensorwise scaling's codes, whose scale is made on the device from the tensor's amax
// (cuda::fp8QuantizeCurrent) and bound with it (Map::bindCurrent): with FP8 GEMMs on, the linear
// layer takes them on the tensor cores, alpha from the device: on bf16 for a K off the multiples
// of 16 (the scales' inverses through device pointers), on FP8 (cuBLASLt's scale pointers)
// otherwise, and a GEMM of a device-scaled operand with an unbound bf16 one; off, their GEMMs run
// in fp32 on the stored values. Each against the oracle on the same quantized values (the CPU's
// quantization gives the same bits).
TEST_F(KernelsCuda, GemmsTakeFp8CodesAtTheirDeviceScales) {
    const Bf16GemmsOn on(false);
    const float gradDivisor = 2.0f;
    for (const int in : {72, 96}) {
        SCOPED_TRACE("in = " + std::to_string(in));
        const bool fp8Shape = in % 16 == 0;
        if (fp8Shape && !gpuHasFp8TensorCores()) continue;
        const int T = 64, out = 80;
        const auto x0 = randomVec(T * in, 101), W0 = randomVec(out * in, 102);
        const auto dy0 = randomVec(T * out, 103, -1e-3f, 1e-3f), g0 = randomVec(out * in, 104);
        // quantized on the device at the scale of their amax, bound with it
        DeviceVec<float> dx(x0), dW(W0), ddy(dy0), amax(3);
        auto quantize = [&](DeviceVec<float>& v, int64_t n, int slot, float divisor, cpu::Fp8Format f) {
            EXPECT_TRUE(cuda::amaxOf(v.ptr, n, amax.ptr + slot, m_stream).isOk());
            EXPECT_TRUE(
                cuda::fp8QuantizeCurrent(v.ptr, v.ptr, nullptr, n, amax.ptr + slot, divisor, f, nullptr, m_stream).isOk());
        };
        quantize(dx, T * in, 0, 1.0f, cpu::Fp8Format::E4M3);
        quantize(dW, out * in, 1, 1.0f, cpu::Fp8Format::E4M3);
        quantize(ddy, T * out, 2, gradDivisor, cpu::Fp8Format::E5M2);
        TS_ASSERT_OK(cuda::streamSynchronize(m_stream));
        // the oracle's quantization of the same values
        auto oracle = [](std::vector<float> v, float divisor, cpu::Fp8Format f) {
            const float a = cpu::amaxOf(v.data(), int64_t(v.size()));
            cpu::fp8QuantizeCurrent(v.data(), v.data(), nullptr, int64_t(v.size()), &a, divisor, f, nullptr);
            return v;
        };
        const auto x = oracle(x0, 1.0f, cpu::Fp8Format::E4M3), W = oracle(W0, 1.0f, cpu::Fp8Format::E4M3);
        const auto dy = oracle(dy0, gradDivisor, cpu::Fp8Format::E5M2);
        expectNear(dx.download(), x, 0, 0, "the device's tensorwise quantization");
        auto owner = std::make_shared<int>(0);  // stands for the amax's buffer
        struct Unbind {
            std::vector<std::pair<const float*, int64_t>> ranges;
            ~Unbind() {
                for (const auto& [p, n] : ranges) fp8codes::map().forget(p, sizeof(float) * size_t(n));
            }
        } unbind;
        auto bind = [&](const float* p, int64_t n, int slot, float divisor, cpu::Fp8Format f) {
            fp8codes::map().bindCurrent(p, n, amax.ptr + slot, divisor, int(f), owner);
            unbind.ranges.push_back({p, n});
        };
        bind(dx.ptr, T * in, 0, 1.0f, cpu::Fp8Format::E4M3);
        bind(dW.ptr, out * in, 1, 1.0f, cpu::Fp8Format::E4M3);
        bind(ddy.ptr, T * out, 2, gradDivisor, cpu::Fp8Format::E5M2);
        std::vector<float> wantY(size_t(T) * out), wantGx(size_t(T) * in), wantG = g0;
        cpu::linearForward(x.data(), W.data(), nullptr, wantY.data(), T, in, out);
        cpu::linearBackward(dy.data(), x.data(), W.data(), wantGx.data(), wantG.data(), nullptr, T, in, out);
        // a bf16-valued operand without codes times x's codes: y2 = b x^T, b [out, T]
        auto b = randomVec(size_t(out) * T, 105);
        cpu::roundToBf16(b.data(), int64_t(b.size()));
        std::vector<float> wantY2(size_t(out) * in);
        cpu::gemm(false, false, out, in, T, 1.0f, b.data(), T, x.data(), in, 0.0f, wantY2.data(), in);
        DeviceVec<float> db(b);
        for (bool fp8 : {false, true}) {
            SCOPED_TRACE(fp8 ? "FP8 GEMMs on" : "FP8 GEMMs off: fp32");
            const Fp8GemmsOn gemms(fp8);
            DeviceVec<float> y(size_t(T) * out), gx(size_t(T) * in), G(g0), y2(size_t(out) * in);
            const int64_t before = cuda::fp8GemmCount();
            TS_ASSERT_OK(cuda::linearForward(dx.ptr, dW.ptr, nullptr, y.ptr, T, in, out, m_stream));
            TS_ASSERT_OK(cuda::linearBackward(ddy.ptr, dx.ptr, dW.ptr, gx.ptr, G.ptr, nullptr, T, in, out, m_stream));
            TS_ASSERT_OK(cuda::gemm(false, false, out, in, T, 1.0f, db.ptr, T, dx.ptr, in, 0.0f, y2.ptr, in, m_stream));
            TS_ASSERT_OK(cuda::streamSynchronize(m_stream));
            EXPECT_EQ(cuda::fp8GemmCount() - before, fp8 && fp8Shape ? 3 : 0);
            if (fp8 && fp8Shape) {  // FP8 tensor cores: their accumulation
                const LinearSums sums = linearProductSums(x, W, dy, T, in, out);
                expectWithinProductSums(y.download(), wantY, sums.y, "device scales: linearForward");
                expectWithinProductSums(gx.download(), wantGx, sums.gx, "device scales: linearBackward dx");
                expectWithinProductSums(G.download(), wantG, sums.G, "device scales: linearBackward dW");
            } else {
                expectNear(y.download(), wantY, 1e-5, 1e-5, "device scales: linearForward");
                expectNear(gx.download(), wantGx, 1e-5, 1e-8, "device scales: linearBackward dx");
                expectNear(G.download(), wantG, 1e-5, 1e-5, "device scales: linearBackward dW (accumulated)");
            }
            expectNear(y2.download(), wantY2, 1e-5, 1e-4, "device scales times an unbound bf16 operand");
        }
    }
}

// Operands bound as FP8 codes at a scale (kernels/common/fp8_codes.h, what delayed scaling's
// fp8QuantizeDequantize stores): the bf16 GEMMs take their codes bf16(y * scale) and put the
// scales' inverses into alpha, which gives the oracle's fp32 GEMM on the stored values up to fp32
// rounding (the stored values are no bf16 values: converting them would differ by bf16's
// rounding). The linear layer's forward (x and W bound), backward (dy, x and W bound; dW
// accumulated into an fp32 main grad), and an operand bound at a scale whose inverses underflow
// alpha, which runs the fp32 GEMM.
TEST_F(KernelsCuda, Bf16GemmsTakeFp8CodesAtTheirBoundScales) {
    const Bf16GemmsOn on(false);
    const Fp8GemmsOn fp8(false);  // the bf16 path, whatever TS_CUDA_FP8_GEMMS says
    const int T = 53, in = 96, out = 80;
    const float sx = 37.7f, sw = 211.3f, sdy = 1.9e4f;  // none a power of two
    auto quantized = [](std::vector<float> v, float scale) {
        return quantizedAt(std::move(v), scale, cpu::Fp8Format::E4M3);
    };
    const auto x = quantized(randomVec(T * in, 80), sx), W = quantized(randomVec(out * in, 81), sw);
    const auto dy = quantized(randomVec(T * out, 82), sdy), g0 = randomVec(out * in, 83);
    DeviceVec<float> dx(x), dW(W), ddy(dy), y(size_t(T) * out), gx(size_t(T) * in), G(g0);
    auto& codes = fp8codes::map();
    BoundCodes bound;  // for this test only
    const auto e4m3 = cpu::Fp8Format::E4M3;
    bound.bind(dx.ptr, int64_t(x.size()), sx, e4m3);
    bound.bind(dW.ptr, int64_t(W.size()), sw, e4m3);
    bound.bind(ddy.ptr, int64_t(dy.size()), sdy, e4m3);
    EXPECT_EQ(codes.scaleOf(dx.ptr, int64_t(x.size())), sx);
    TS_ASSERT_OK(cuda::linearForward(dx.ptr, dW.ptr, nullptr, y.ptr, T, in, out, m_stream));
    TS_ASSERT_OK(cuda::linearBackward(ddy.ptr, dx.ptr, dW.ptr, gx.ptr, G.ptr, nullptr, T, in, out, m_stream));
    TS_ASSERT_OK(cuda::streamSynchronize(m_stream));
    std::vector<float> wantY(size_t(T) * out), wantGx(size_t(T) * in), wantG = g0;
    cpu::linearForward(x.data(), W.data(), nullptr, wantY.data(), T, in, out);
    cpu::linearBackward(dy.data(), x.data(), W.data(), wantGx.data(), wantG.data(), nullptr, T, in, out);
    expectNear(y.download(), wantY, 1e-5, 1e-5, "FP8 codes: linearForward");
    expectNear(gx.download(), wantGx, 1e-5, 1e-5, "FP8 codes: linearBackward dx");
    expectNear(G.download(), wantG, 1e-5, 1e-5, "FP8 codes: linearBackward dW (accumulated)");
    // 1/scale^2 underflows a float: the fp32 GEMM on the stored values.
    const float huge = 3e19f;  // its inverse is normal (2^-16 times it too), the square of that is not
    auto small = [&](std::vector<float> v) {
        for (float& e : v) e *= 100.0f / huge;  // codes up to 100, inside E4M3's range
        return quantized(std::move(v), huge);
    };
    const auto xh = small(randomVec(T * in, 84));
    DeviceVec<float> dxh(xh), yh(size_t(T) * out);
    bound.bind(dxh.ptr, int64_t(xh.size()), huge, e4m3);
    const std::vector<float> Wh = small(randomVec(out * in, 85));
    DeviceVec<float> dWh(Wh);
    bound.bind(dWh.ptr, int64_t(Wh.size()), huge, e4m3);
    TS_ASSERT_OK(cuda::linearForward(dxh.ptr, dWh.ptr, nullptr, yh.ptr, T, in, out, m_stream));
    TS_ASSERT_OK(cuda::streamSynchronize(m_stream));
    std::vector<float> wantYh(size_t(T) * out);
    cpu::linearForward(xh.data(), Wh.data(), nullptr, wantYh.data(), T, in, out);
    expectNear(yh.download(), wantYh, 1e-5, 1e-36, "FP8 codes at extreme scales (fp32 GEMM)");
}

// A bound 16-bit twin is what a bf16 GEMM reads for an operand inside its array: W's twin bound
// with the bits of 2*W gives exactly the GEMM of 2*W (the twin really is read, not W), a weight
// slice at an offset reads the twin at that offset, an operand sticking out of the array is
// converted as before, and after unbinding W itself is read again.
TEST_F(KernelsCuda, Bf16GemmsReadTheBoundTwinOfAnOperand) {
    const Bf16GemmsOn on(false);  // FAST_16BF would read W instead of its twin
    auto bf = [](std::vector<float> v) {
        cpu::roundToBf16(v.data(), int64_t(v.size()));
        return v;
    };
    const int T = 37, in = 64, out = 48, rows = out + 16;  // W is rows [8, 8 + out) of a bigger array
    const auto x = bf(randomVec(T * in, 70)), big = bf(randomVec(size_t(rows) * in, 71));
    std::vector<float> twice = big;
    for (float& v : twice) v *= 2.0f;  // exact in bf16
    std::vector<uint16_t> twinBits(twice.size());
    cpu::floatToBf16(twice.data(), twinBits.data(), int64_t(twice.size()));
    DeviceVec<float> dx(x), dBig(big), dy(size_t(T) * out);
    DeviceVec<uint16_t> dTwin(twinBits);
    const float* W = dBig.ptr + 8 * in;
    auto run = [&] {
        EXPECT_TRUE(cuda::linearForward(dx.ptr, W, nullptr, dy.ptr, T, in, out, m_stream).isOk());
        EXPECT_TRUE(cuda::streamSynchronize(m_stream).isOk());
        return dy.download();
    };
    auto want = [&](const std::vector<float>& from) {
        std::vector<float> y(size_t(T) * out);
        cpu::linearForward(x.data(), from.data() + 8 * in, nullptr, y.data(), T, in, out);
        return y;
    };
    cuda::bindBf16Twin(dBig.ptr, dTwin.ptr, int64_t(big.size()));
    EXPECT_EQ(cuda::boundBf16Twin(W, int64_t(out) * in), dTwin.ptr + 8 * in);
    EXPECT_EQ(cuda::boundBf16Twin(W, int64_t(rows - 8) * in + 1), nullptr) << "past the array's end";
    EXPECT_EQ(cuda::boundBf16Twin(dx.ptr, 1), nullptr) << "another array";
    expectNear(run(), want(twice), 1e-4, 1e-4, "GEMM through the twin (2W)");
    cuda::unbindBf16Twin(dBig.ptr);
    EXPECT_EQ(cuda::boundBf16Twin(W, 1), nullptr);
    expectNear(run(), want(big), 1e-4, 1e-4, "GEMM after unbinding (W)");
}

}  // namespace
}  // namespace ts::kernels

#else  // !TS_HAVE_CUDA

TEST(KernelsCuda, Skipped) { GTEST_SKIP() << "built without CUDA"; }

#endif
