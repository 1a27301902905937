// CUDA norms, cross entropy and FP8 (kernels/cuda/norm.cu, cross_entropy.cu, fp8.cu) against
// their CPU oracles (kernels/cpu/norm.cpp, cross_entropy.cpp, fp8.cpp, fp8_block.cpp) on random
// data: with and without bias, odd sizes (C not a multiple of 32, T = 1), in-place variants,
// targets outside the vocab partition; FP8 codes, scales and values compared bit for bit (NaN
// values by NaN-ness) for E4M3 and E5M2. Float results use a tolerance scaled to the magnitude
// of what was summed. Every failure names the op, the case and the element.
// Skips without a CUDA build or without a device.
#include <gtest/gtest.h>

#include "tests/gpu/gpu_test_util.h"

#ifdef TS_HAVE_CUDA

#include "kernels/cpu/fp8_block.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/ops_cuda.h"

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace ts::kernels {
namespace {

using namespace gputest;

std::string shape(const char* op, int T, int C, const char* extra = "") {
    return std::string(op) + "(T=" + std::to_string(T) + ", C=" + std::to_string(C) + extra + ")";
}

class CudaNormCeFp8 : public CudaStreamTest {};

// (T, C): odd C, T = 1, C below a warp, and enough rows for several dw/db chunks.
const std::vector<std::pair<int, int>> kNormShapes = {{67, 300}, {1, 17}, {5, 1}, {33, 1024}, {1000, 96}};

// ---- Norms ---------------------------------------------------------------------------------

TEST_F(CudaNormCeFp8, LayerNormForwardUnfusedAndFusedMatchCpu) {
    for (auto [T, C] : kNormShapes)
        for (bool fused : {false, true})
            for (bool bias : {true, false}) {
                const auto x = randomVec(size_t(T) * C, 1 + T, -3, 3), w = randomVec(C, 2), b = randomVec(C, 3);
                DeviceVec<float> dx(x), dw(w), db(b), dy(size_t(T) * C), dm(T), dr(T);
                TS_ASSERT_OK(dx.status);
                const float* bp = bias ? db.ptr : nullptr;
                if (fused)
                    TS_ASSERT_OK(cuda::layerNormForwardFused(dx.ptr, dw.ptr, bp, dy.ptr, dm.ptr, dr.ptr, T, C, 1e-5f, false, m_stream));
                else
                    TS_ASSERT_OK(cuda::layerNormForward(dx.ptr, dw.ptr, bp, dy.ptr, dm.ptr, dr.ptr, T, C, 1e-5f, false, m_stream));
                sync();
                std::vector<float> y(size_t(T) * C), mean(T), rstd(T);
                (fused ? cpu::layerNormForwardFused : cpu::layerNormForward)(
                    x.data(), w.data(), bias ? b.data() : nullptr, y.data(), mean.data(), rstd.data(), T, C, 1e-5f, false);
                const std::string name =
                    shape(fused ? "layerNormForwardFused" : "layerNormForward", T, C, bias ? ", bias" : ", no bias");
                // y = xhat * w + b with |xhat| up to a few: absolute error ~ 1e-6 * |xhat|
                expectClose(dy.download(), y, 1e-4, 2e-5, name + " y");
                expectClose(dm.download(), mean, 1e-4, 2e-6, name + " mean");
                expectClose(dr.download(), rstd, 2e-4, 0, name + " rstd");
            }
}

TEST_F(CudaNormCeFp8, LayerNormBackwardUnfusedAndFusedMatchCpu) {
    for (auto [T, C] : kNormShapes)
        for (bool fused : {false, true})
            for (bool bias : {true, false}) {
                const size_t n = size_t(T) * C;
                const auto x = randomVec(n, 10 + T, -2, 2), w = randomVec(C, 11), b = randomVec(C, 12);
                const auto dyv = randomVec(n, 13 + C), dw0 = randomVec(C, 14), db0 = randomVec(C, 15);
                std::vector<float> y(n), mean(T), rstd(T);
                cpu::layerNormForward(x.data(), w.data(), b.data(), y.data(), mean.data(), rstd.data(), T, C, 1e-5f);
                std::vector<float> dx(n), dw = dw0, db = db0;
                (fused ? cpu::layerNormBackwardFused : cpu::layerNormBackward)(
                    dyv.data(), x.data(), w.data(), mean.data(), rstd.data(), dx.data(), dw.data(),
                    bias ? db.data() : nullptr, T, C, false);
                DeviceVec<float> gdy(dyv), gx(x), gw(w), gm(mean), gr(rstd), gdx(n), gdw(dw0), gdb(db0);
                TS_ASSERT_OK(gdb.status);
                float* dbp = bias ? gdb.ptr : nullptr;
                if (fused)
                    TS_ASSERT_OK(cuda::layerNormBackwardFused(gdy.ptr, gx.ptr, gw.ptr, gm.ptr, gr.ptr, gdx.ptr, gdw.ptr,
                                                              dbp, T, C, false, m_stream));
                else
                    TS_ASSERT_OK(cuda::layerNormBackward(gdy.ptr, gx.ptr, gw.ptr, gm.ptr, gr.ptr, gdx.ptr, gdw.ptr, dbp,
                                                         T, C, false, m_stream));
                sync();
                // Magnitudes: dx from |rstd| * (|g| + mean|g| + |xhat| mean|g xhat|) ~ rstd * few;
                // dw, db: the sums over T of |dy xhat|, |dy| plus the initial value.
                std::vector<double> magDx(n), magW(C, 0.0), magB(C, 0.0);
                for (int t = 0; t < T; ++t)
                    for (int c = 0; c < C; ++c) {
                        const size_t i = size_t(t) * C + c;
                        const double xhat = (x[i] - mean[t]) * double(rstd[t]);
                        magDx[i] = std::fabs(rstd[t]) * (1.0 + std::fabs(xhat)) * 2.0;
                        magW[c] += std::fabs(dyv[i] * xhat);
                        magB[c] += std::fabs(dyv[i]);
                    }
                for (int c = 0; c < C; ++c) {
                    magW[c] += std::fabs(dw0[c]);
                    magB[c] += std::fabs(db0[c]);
                }
                const std::string name = shape(fused ? "layerNormBackwardFused" : "layerNormBackward", T, C,
                                               bias ? ", bias" : ", no bias");
                expectClose(gdx.download(), dx, 2e-5, 1e-6, name + " dx", {}, magDx);
                expectClose(gdw.download(), dw, 5e-5, 1e-6, name + " dw (+=)", {}, magW);
                if (bias)
                    expectClose(gdb.download(), db, 5e-5, 1e-6, name + " db (+=)", {}, magB);
                else
                    expectSameBits(gdb.download(), db0, name + " db untouched without bias");
            }
}

TEST_F(CudaNormCeFp8, RmsNormForwardAndBackwardMatchCpu) {
    for (auto [T, C] : kNormShapes) {
        const size_t n = size_t(T) * C;
        const auto x = randomVec(n, 20 + T, -2, 2), w = randomVec(C, 21), dyv = randomVec(n, 22), dw0 = randomVec(C, 23);
        std::vector<float> y(n), rstd(T), dx(n), dw = dw0;
        cpu::rmsNormForward(x.data(), w.data(), y.data(), rstd.data(), T, C, 1e-5f);
        cpu::rmsNormBackward(dyv.data(), x.data(), w.data(), rstd.data(), dx.data(), dw.data(), T, C);
        DeviceVec<float> gx(x), gw(w), gy(n), gr(T), gdy(dyv), gdx(n), gdw(dw0);
        TS_ASSERT_OK(gdw.status);
        TS_ASSERT_OK(cuda::rmsNormForward(gx.ptr, gw.ptr, gy.ptr, gr.ptr, T, C, 1e-5f, false, m_stream));
        sync();
        const auto gpuRstd = gr.download();
        expectClose(gy.download(), y, 1e-4, 1e-5, shape("rmsNormForward", T, C) + " y");
        expectClose(gpuRstd, rstd, 1e-4, 0, shape("rmsNormForward", T, C) + " rstd");
        // Backward from the CPU's rstd, so only the backward's own rounding is compared.
        DeviceVec<float> gr2(rstd);
        TS_ASSERT_OK(cuda::rmsNormBackward(gdy.ptr, gx.ptr, gw.ptr, gr2.ptr, gdx.ptr, gdw.ptr, T, C, false, m_stream));
        sync();
        std::vector<double> magDx(n), magW(C, 0.0);
        for (int t = 0; t < T; ++t)
            for (int c = 0; c < C; ++c) {
                const size_t i = size_t(t) * C + c;
                const double xr = x[i] * double(rstd[t]);
                magDx[i] = std::fabs(rstd[t]) * (1.0 + std::fabs(xr)) * 2.0;
                magW[c] += std::fabs(dyv[i] * xr);
            }
        for (int c = 0; c < C; ++c) magW[c] += std::fabs(dw0[c]);
        expectClose(gdx.download(), dx, 2e-5, 1e-6, shape("rmsNormBackward", T, C) + " dx", {}, magDx);
        expectClose(gdw.download(), dw, 5e-5, 1e-6, shape("rmsNormBackward", T, C) + " dw (+=)", {}, magW);
    }
}

// roundBf16: the kernels that write a bf16 model's activations store bf16 values in the same
// pass. Each output must be exactly the bf16 rounding (the host's round to nearest even) of what
// the same kernel writes without it; the statistics and parameter gradients are unchanged.
TEST_F(CudaNormCeFp8, NormsAndActivationsStoreBf16ValuesUnderRoundBf16) {
    auto bf = [](std::vector<float> v) {
        cpu::roundToBf16(v.data(), int64_t(v.size()));
        return v;
    };
    const int T = 67, C = 300;
    const size_t n = size_t(T) * C;
    const auto x = randomVec(n, 40, -3, 3), w = randomVec(C, 41), b = randomVec(C, 42), dyv = randomVec(n, 43);
    const auto x2 = randomVec(2 * n, 44, -4, 4);  // SwiGLU's [gate | up] rows of 2C
    // Each op twice, without and with the flag.
    std::vector<float> plain[6], rounded[6], statsPlain[6], statsRounded[6];
    for (int pass = 0; pass < 2; ++pass) {
        const bool round = pass == 1;
        DeviceVec<float> gx(x), gw(w), gb(b), gdy(dyv), gx2(x2), y(n), m(T), r(T), dx(n), dw(std::vector<float>(C, 0.f)),
            db(std::vector<float>(C, 0.f));
        TS_ASSERT_OK(cuda::layerNormForwardFused(gx.ptr, gw.ptr, gb.ptr, y.ptr, m.ptr, r.ptr, T, C, 1e-5f, round, m_stream));
        sync();
        (round ? rounded : plain)[0] = y.download();
        (round ? statsRounded : statsPlain)[0] = r.download();
        TS_ASSERT_OK(cuda::layerNormBackwardFused(gdy.ptr, gx.ptr, gw.ptr, m.ptr, r.ptr, dx.ptr, dw.ptr, db.ptr, T, C,
                                                  round, m_stream));
        sync();
        (round ? rounded : plain)[1] = dx.download();
        (round ? statsRounded : statsPlain)[1] = dw.download();
        TS_ASSERT_OK(cuda::rmsNormForward(gx.ptr, gw.ptr, y.ptr, r.ptr, T, C, 1e-5f, round, m_stream));
        sync();
        (round ? rounded : plain)[2] = y.download();
        (round ? statsRounded : statsPlain)[2] = r.download();
        TS_ASSERT_OK(cuda::rmsNormBackward(gdy.ptr, gx.ptr, gw.ptr, r.ptr, dx.ptr, dw.ptr, T, C, round, m_stream));
        sync();
        (round ? rounded : plain)[3] = dx.download();
        (round ? statsRounded : statsPlain)[3] = dw.download();
        TS_ASSERT_OK(cuda::biasGeluForward(gx.ptr, gb.ptr, y.ptr, T, C, round, m_stream));
        sync();
        (round ? rounded : plain)[4] = y.download();
        TS_ASSERT_OK(cuda::swigluForward(gx2.ptr, y.ptr, T, C, round, m_stream));
        sync();
        (round ? rounded : plain)[5] = y.download();
    }
    const char* names[6] = {"layerNormForwardFused y", "layerNormBackwardFused dx", "rmsNormForward y",
                            "rmsNormBackward dx", "biasGeluForward y", "swigluForward y"};
    for (int i = 0; i < 6; ++i) {
        expectSameBits(rounded[i], bf(plain[i]), std::string(names[i]) + " under roundBf16");
        if (i < 4) expectSameBits(statsRounded[i], statsPlain[i], std::string(names[i]) + ": statistics, grads unchanged");
    }
}

// ---- Cross entropy -------------------------------------------------------------------------

// Targets: mostly inside [vStart, vStart + Vl), some in other partitions, one negative.
std::vector<int32_t> targetsFor(int T, int vStart, int Vl, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int32_t> t(T);
    for (int i = 0; i < T; ++i) {
        const int kind = i % 5;
        if (kind == 3) t[i] = vStart + Vl + int(rng() % 7);   // a later partition
        else if (kind == 4) t[i] = i % 2 ? -1 : vStart - 1;   // invalid / an earlier partition
        else t[i] = vStart + int(rng() % uint32_t(Vl));
    }
    return t;
}

struct CeShape {
    int T, Vl, vStart;
};
const std::vector<CeShape> kCeShapes = {{37, 1003, 2000}, {1, 7, 0}, {6, 4099, 0}, {9, 1, 5}};

TEST_F(CudaNormCeFp8, CrossEntropyVocabParallelStagesMatchCpu) {
    for (const CeShape& s : kCeShapes) {
        const int T = s.T, Vl = s.Vl;
        const size_t n = size_t(T) * Vl;
        const auto logits = randomVec(n, 30 + T, -8, 8);
        const auto targets = targetsFor(T, s.vStart, Vl, 31);
        const auto dloss = randomVec(T, 32, 0.1f, 2.0f);
        std::vector<float> rowMax(T), tl(T), se(T), loss(T), dl(n);
        cpu::crossEntropyRowMax(logits.data(), rowMax.data(), T, Vl);
        cpu::crossEntropyStats(logits.data(), targets.data(), rowMax.data(), tl.data(), se.data(), T, Vl, s.vStart);
        cpu::crossEntropyLoss(tl.data(), se.data(), loss.data(), T);
        cpu::crossEntropyBackward(logits.data(), targets.data(), rowMax.data(), se.data(), dloss.data(), dl.data(),
                                  T, Vl, s.vStart);
        const std::string name = " (T=" + std::to_string(T) + ", Vl=" + std::to_string(Vl) +
                                 ", vStart=" + std::to_string(s.vStart) + ")";
        DeviceVec<float> gl(logits), gmax(T), gtl(T), gse(T), gloss(T), gdl(n), gdloss(dloss);
        DeviceVec<int32_t> gt(targets);
        TS_ASSERT_OK(gt.status);
        TS_ASSERT_OK(cuda::crossEntropyRowMax(gl.ptr, gmax.ptr, T, Vl, m_stream));
        TS_ASSERT_OK(cuda::crossEntropyStats(gl.ptr, gt.ptr, gmax.ptr, gtl.ptr, gse.ptr, T, Vl, s.vStart, m_stream));
        TS_ASSERT_OK(cuda::crossEntropyLoss(gtl.ptr, gse.ptr, gloss.ptr, T, m_stream));
        TS_ASSERT_OK(cuda::crossEntropyBackward(gl.ptr, gt.ptr, gmax.ptr, gse.ptr, gdloss.ptr, gdl.ptr, T, Vl,
                                                s.vStart, m_stream));
        sync();
        expectSameBits(gmax.download(), rowMax, "crossEntropyRowMax" + name + " rowMax");  // a max is exact
        expectSameBits(gtl.download(), tl, "crossEntropyStats" + name + " targetLogit");  // one subtraction
        expectClose(gse.download(), se, 1e-5, 0, "crossEntropyStats" + name + " sumExp");
        expectClose(gloss.download(), loss, 1e-5, 2e-6, "crossEntropyLoss" + name + " loss");
        // dlogits = p * dloss - [target] dloss: error ~ 1e-6 relative to dloss
        std::vector<double> mag(n);
        for (size_t i = 0; i < n; ++i) mag[i] = dloss[i / Vl];
        expectClose(gdl.download(), dl, 4e-6, 0, "crossEntropyBackward" + name + " dlogits", {}, mag);
        // In place: dlogits over the logits.
        TS_ASSERT_OK(cuda::crossEntropyBackward(gl.ptr, gt.ptr, gmax.ptr, gse.ptr, gdloss.ptr, gl.ptr, T, Vl,
                                                s.vStart, m_stream));
        sync();
        expectClose(gl.download(), dl, 4e-6, 0, "crossEntropyBackward in place" + name + " dlogits", {}, mag);
    }
}

TEST_F(CudaNormCeFp8, CrossEntropyUnfusedAndFusedMatchCpu) {
    for (const CeShape& s : kCeShapes) {
        const int T = s.T, V = s.Vl;
        const size_t n = size_t(T) * V;
        const auto logits = randomVec(n, 40 + T, -8, 8);
        const auto targets = targetsFor(T, 0, V, 41);  // some >= V and some negative: no target term
        const auto dloss = randomVec(T, 42, 0.1f, 2.0f);
        std::vector<float> probs(n), loss(T), dl(n), fusedRows = logits, fusedLoss(T);
        cpu::crossEntropyForwardUnfused(logits.data(), targets.data(), probs.data(), loss.data(), T, V);
        cpu::crossEntropyBackwardUnfused(probs.data(), targets.data(), dloss.data(), dl.data(), T, V);
        cpu::crossEntropyFused(fusedRows.data(), targets.data(), dloss.data(), fusedLoss.data(), T, V);
        const std::string name = " (T=" + std::to_string(T) + ", V=" + std::to_string(V) + ")";
        DeviceVec<float> gl(logits), gp(n), gloss(T), gdl(n), gdloss(dloss), gfl(T);
        DeviceVec<int32_t> gt(targets);
        TS_ASSERT_OK(gt.status);
        TS_ASSERT_OK(cuda::crossEntropyForwardUnfused(gl.ptr, gt.ptr, gp.ptr, gloss.ptr, T, V, m_stream));
        TS_ASSERT_OK(cuda::crossEntropyBackwardUnfused(gp.ptr, gt.ptr, gdloss.ptr, gdl.ptr, T, V, m_stream));
        sync();
        std::vector<double> mag(n);
        for (size_t i = 0; i < n; ++i) mag[i] = dloss[i / V];
        expectClose(gp.download(), probs, 1e-5, 1e-9, "crossEntropyForwardUnfused" + name + " probs");
        expectClose(gloss.download(), loss, 1e-5, 2e-6, "crossEntropyForwardUnfused" + name + " loss");
        expectClose(gdl.download(), dl, 4e-6, 0, "crossEntropyBackwardUnfused" + name + " dlogits", {}, mag);
        // Backward in place over probs.
        TS_ASSERT_OK(cuda::crossEntropyBackwardUnfused(gp.ptr, gt.ptr, gdloss.ptr, gp.ptr, T, V, m_stream));
        sync();
        expectClose(gp.download(), dl, 4e-6, 0, "crossEntropyBackwardUnfused in place" + name + " dlogits", {}, mag);
        // Fused: in place over the logits.
        TS_ASSERT_OK(cuda::crossEntropyFused(gl.ptr, gt.ptr, gdloss.ptr, gfl.ptr, T, V, m_stream));
        sync();
        expectClose(gfl.download(), fusedLoss, 1e-5, 2e-6, "crossEntropyFused" + name + " loss");
        expectClose(gl.download(), fusedRows, 4e-6, 0, "crossEntropyFused" + name + " dlogits (in place)", {}, mag);
    }
}

// ---- FP8 -----------------------------------------------------------------------------------

const char* fmtName(cpu::Fp8Format f) { return f == cpu::Fp8Format::E4M3 ? "E4M3" : "E5M2"; }

TEST_F(CudaNormCeFp8, AmaxOfMatchesCpuAndPropagatesNaN) {
    auto x = randomVec(100003, 50, -3, 3);
    x[77777] = -9.5f;
    std::vector<std::pair<std::string, std::vector<float>>> cases = {{"random", x}};
    auto withInf = x;
    withInf[5] = -INFINITY;
    cases.emplace_back("with -inf", withInf);
    auto withNaN = x;
    withNaN[99999] = -std::nanf("");
    cases.emplace_back("with NaN", withNaN);
    cases.emplace_back("one element", std::vector<float>{-0.25f});
    cases.emplace_back("zeros", std::vector<float>(1000, -0.0f));
    for (const auto& [name, v] : cases) {
        DeviceVec<float> gx(v), ga(1);
        TS_ASSERT_OK(cuda::amaxOf(gx.ptr, int64_t(v.size()), ga.ptr, m_stream));
        sync();
        expectSameBits(ga.download(), {cpu::amaxOf(v.data(), int64_t(v.size()))}, "amaxOf(" + name + ")");
    }
    DeviceVec<float> ga(std::vector<float>{123.0f});
    TS_ASSERT_OK(cuda::amaxOf(nullptr, 0, ga.ptr, m_stream));
    sync();
    expectSameBits(ga.download(), {0.0f}, "amaxOf(n = 0)");
}

// Inputs that reach every rounding path: each code's value and the midpoints to its neighbour
// (ties) and their float neighbours, both signs, zeros, denormals, overflow, inf, NaN of both
// signs; then 2^20 float bit patterns spread over the whole 32-bit space.
std::vector<float> fp8Probe(cpu::Fp8Format f) {
    std::vector<float> x;
    for (int c = 0; c < 256; ++c) {
        const float v = cpu::fp8Decode(uint8_t(c), f);
        x.push_back(v);
        const float next = cpu::fp8Decode(uint8_t(c + 1), f);
        if ((c & 0x7F) < 0x7F && std::isfinite(v) && std::isfinite(next)) {
            const float mid = float((double(v) + double(next)) / 2);
            x.push_back(mid);
            x.push_back(std::nextafter(mid, 0.0f));
            x.push_back(std::nextafter(mid, INFINITY));
            x.push_back(std::nextafter(mid, -INFINITY));
        }
    }
    for (float v : {0.0f, -0.0f, 1e-30f, -1e-42f, INFINITY, -INFINITY, 1e6f, -3e38f, std::nanf(""), -std::nanf("")})
        x.push_back(v);
    for (uint32_t i = 0; i < (1u << 20); ++i) x.push_back(floatFromBits(i * 0x9E3779B1u));
    return x;
}

TEST_F(CudaNormCeFp8, Fp8QuantizeDequantizeIsBitExactWithCpu) {
    for (auto f : {cpu::Fp8Format::E4M3, cpu::Fp8Format::E5M2}) {
        const auto x = fp8Probe(f);
        const int64_t n = int64_t(x.size());
        DeviceVec<float> gx(x), gy(x.size());
        DeviceVec<uint8_t> gc(x.size());
        TS_ASSERT_OK(gc.status);
        for (float scale : {1.0f, 37.5f, 0.125f}) {
            std::vector<float> y(x.size());
            std::vector<uint8_t> codes(x.size());
            cpu::fp8QuantizeDequantize(x.data(), y.data(), codes.data(), n, scale, f);
            TS_ASSERT_OK(cuda::fp8QuantizeDequantize(gx.ptr, gy.ptr, gc.ptr, n, scale, f, m_stream));
            sync();
            const std::string name =
                std::string("fp8QuantizeDequantize(") + fmtName(f) + ", scale " + std::to_string(scale) + ")";
            expectEqualInts(gc.download(), codes, name + " codes", {}, &x);
            expectSameBits(gy.download(), y, name + " y", {}, &x);
            if (scale == 37.5f) {
                // In place without codes.
                DeviceVec<float> gio(x);
                TS_ASSERT_OK(cuda::fp8QuantizeDequantize(gio.ptr, gio.ptr, nullptr, n, scale, f, m_stream));
                sync();
                expectSameBits(gio.download(), y, name + " y in place, no codes", {}, &x);
            }
        }
    }
}

// Every code decodes and re-encodes on the GPU as on the CPU (through the tensor-scaled path with
// scale 1 and the MXFP8 path, whose block of exact values gets scale 2^0 when its amax is max).
TEST_F(CudaNormCeFp8, Fp8All256CodesRoundTripAsOnCpu) {
    for (auto f : {cpu::Fp8Format::E4M3, cpu::Fp8Format::E5M2}) {
        std::vector<float> x(256);
        for (int c = 0; c < 256; ++c) x[c] = cpu::fp8Decode(uint8_t(c), f);
        std::vector<float> y(256);
        std::vector<uint8_t> codes(256);
        cpu::fp8QuantizeDequantize(x.data(), y.data(), codes.data(), 256, 1.0f, f);
        DeviceVec<float> gx(x), gy(256);
        DeviceVec<uint8_t> gc(256);
        TS_ASSERT_OK(cuda::fp8QuantizeDequantize(gx.ptr, gy.ptr, gc.ptr, 256, 1.0f, f, m_stream));
        sync();
        const std::string name = std::string("fp8QuantizeDequantize(all 256 codes, ") + fmtName(f) + ")";
        expectEqualInts(gc.download(), codes, name + " codes", {}, &x);
        expectSameBits(gy.download(), y, name + " y", {}, &x);
        // Finite codes only for MXFP8 (a NaN or inf would take its block's scale to NaN/inf).
        std::vector<float> fin;
        for (float v : x)
            if (std::isfinite(v)) fin.push_back(v);
        const int64_t cols = int64_t(fin.size());
        std::vector<float> my(fin.size());
        std::vector<uint8_t> mc(fin.size()), ms(size_t(cpu::fp8BlockScaleCount(1, cols, cpu::Fp8BlockKind::Mx1x32, true)));
        cpu::fp8BlockQuantizeDequantize(fin.data(), my.data(), mc.data(), ms.data(), 1, cols, cpu::Fp8BlockKind::Mx1x32,
                                        true, f);
        DeviceVec<float> gfin(fin), gmy(fin.size());
        DeviceVec<uint8_t> gmc(fin.size()), gms(ms.size());
        TS_ASSERT_OK(cuda::fp8BlockQuantizeDequantize(gfin.ptr, gmy.ptr, gmc.ptr, gms.ptr, 1, cols,
                                                      cpu::Fp8BlockKind::Mx1x32, true, f, true, m_stream));
        sync();
        const std::string mname = std::string("fp8BlockQuantizeDequantize(MXFP8, all finite codes, ") + fmtName(f) + ")";
        expectEqualInts(gmc.download(), mc, mname + " codes", {}, &fin);
        expectSameBits(gmy.download(), my, mname + " y", {}, &fin);
        expectEqualInts(gms.download(), ms, mname + " E8M0 scales");
    }
}

const char* kindName(cpu::Fp8BlockKind k) {
    return k == cpu::Fp8BlockKind::Mx1x32 ? "MXFP8 1x32" : (k == cpu::Fp8BlockKind::Block1x128 ? "1x128" : "128x128");
}

// One block-scaled case: codes, values and scales against the CPU, then in place without codes.
void checkBlockCase(const std::vector<float>& x, int64_t rows, int64_t cols, cpu::Fp8BlockKind kind, bool alongRows,
                    cpu::Fp8Format f, bool pow2, void* stream, const std::string& tag) {
    const size_t n = x.size();
    const bool mx = kind == cpu::Fp8BlockKind::Mx1x32;
    const int64_t ns = cpu::fp8BlockScaleCount(rows, cols, kind, alongRows);
    std::vector<float> y(n), fscales(mx ? 0 : size_t(ns));
    std::vector<uint8_t> codes(n), escales(mx ? size_t(ns) : 0);
    void* cpuScales = mx ? static_cast<void*>(escales.data()) : static_cast<void*>(fscales.data());
    cpu::fp8BlockQuantizeDequantize(x.data(), y.data(), codes.data(), cpuScales, rows, cols, kind, alongRows, f, pow2);
    DeviceVec<float> gx(x), gy(n), gfs(fscales.size());
    DeviceVec<uint8_t> gc(n), ges(escales.size());
    ASSERT_TRUE(gx.status.isOk() && gy.status.isOk() && gc.status.isOk());
    void* gpuScales = mx ? static_cast<void*>(ges.ptr) : static_cast<void*>(gfs.ptr);
    TS_ASSERT_OK(cuda::fp8BlockQuantizeDequantize(gx.ptr, gy.ptr, gc.ptr, gpuScales, rows, cols, kind, alongRows, f,
                                                  pow2, stream));
    TS_ASSERT_OK(cuda::streamSynchronize(stream));
    const std::string name = std::string("fp8BlockQuantizeDequantize(") + kindName(kind) + ", " +
                             (alongRows ? "along rows" : "along columns") + ", " + fmtName(f) +
                             (mx ? "" : (pow2 ? ", pow2" : ", fp32 scales")) + ", " + std::to_string(rows) + "x" +
                             std::to_string(cols) + ", " + tag + ")";
    expectEqualInts(gc.download(), codes, name + " codes", {}, &x);
    expectSameBits(gy.download(), y, name + " y", {}, &x);
    if (mx)
        expectEqualInts(ges.download(), escales, name + " E8M0 scales");
    else
        expectSameBits(gfs.download(), fscales, name + " inverse scales");
    DeviceVec<float> gio(x);
    TS_ASSERT_OK(cuda::fp8BlockQuantizeDequantize(gio.ptr, gio.ptr, nullptr, nullptr, rows, cols, kind, alongRows, f,
                                                  pow2, stream));
    TS_ASSERT_OK(cuda::streamSynchronize(stream));
    expectSameBits(gio.download(), y, name + " y in place, no codes or scales", {}, &x);
}

TEST_F(CudaNormCeFp8, Fp8BlockQuantizeDequantizeIsBitExactWithCpu) {
    // 130 x 257: a partial last block along both dimensions for every kind. Values over a wide
    // range of magnitudes (so blocks get very different scales), one all-zero row, one large row,
    // a NaN, an inf and denormals in some blocks.
    const int64_t rows = 130, cols = 257;
    std::mt19937 rng(60);
    std::uniform_real_distribution<float> lg(-30.0f, 20.0f), u(-1.0f, 1.0f);
    std::vector<float> x(size_t(rows * cols));
    for (auto& v : x) v = u(rng) * std::exp2(lg(rng) * (u(rng) > 0 ? 0.2f : 1.0f));
    for (int64_t c = 0; c < cols; ++c) x[size_t(7 * cols + c)] = 0.0f;
    for (int64_t c = 0; c < cols; ++c) x[size_t(9 * cols + c)] = 3e38f * u(rng);
    x[size_t(3 * cols + 40)] = std::nanf("");
    x[size_t(100 * cols + 200)] = -INFINITY;
    x[size_t(64 * cols + 5)] = 1e-41f;
    x[size_t(64 * cols + 6)] = -3e-39f;
    for (auto f : {cpu::Fp8Format::E4M3, cpu::Fp8Format::E5M2})
        for (auto kind : {cpu::Fp8BlockKind::Mx1x32, cpu::Fp8BlockKind::Block1x128, cpu::Fp8BlockKind::Block128x128})
            for (bool alongRows : {true, false})
                for (bool pow2 : {true, false}) {
                    if (kind == cpu::Fp8BlockKind::Mx1x32 && !pow2) continue;  // pow2 is for blockwise only
                    checkBlockCase(x, rows, cols, kind, alongRows, f, pow2, m_stream, "mixed magnitudes");
                }
    // Raw bit patterns (NaNs in most blocks: scale 1 / NaN scale paths) and single rows / columns.
    std::vector<float> raw(1u << 16);
    for (uint32_t i = 0; i < raw.size(); ++i) raw[i] = floatFromBits(i * 0x9E3779B1u + 12345u);
    for (auto f : {cpu::Fp8Format::E4M3, cpu::Fp8Format::E5M2})
        for (auto kind : {cpu::Fp8BlockKind::Mx1x32, cpu::Fp8BlockKind::Block1x128, cpu::Fp8BlockKind::Block128x128}) {
            checkBlockCase(raw, 256, 256, kind, true, f, true, m_stream, "raw bit patterns");
            checkBlockCase(raw, 256, 256, kind, false, f, false, m_stream, "raw bit patterns");
            std::vector<float> row(x.begin(), x.begin() + 45);
            checkBlockCase(row, 1, 45, kind, true, f, true, m_stream, "one row");
            checkBlockCase(row, 45, 1, kind, false, f, true, m_stream, "one column");
        }
}

}  // namespace
}  // namespace ts::kernels

#else  // !TS_HAVE_CUDA

TEST(CudaNormCeFp8, Skipped) { GTEST_SKIP() << "built without CUDA"; }

#endif
