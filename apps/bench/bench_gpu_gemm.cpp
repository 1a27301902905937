// bench_gpu_gemm: the linear layers' GEMMs of the ~1.3B GPT (T = seq x micro-batch tokens, hidden
// 2048, ffn 8192: qkv, proj, fc1, fc2) on GPU 0 through the engine's CUDA linear layer
// (kernels/cuda/gemm.cu), in each precision path the trainer takes: fp32 (cuBLAS pedantic),
// bf16 (bf16-valued operands converted per call, as activations are), FP8 codes at host scales
// (delayed scaling: x and W E4M3, dy E5M2) on bf16 tensor cores, the same on the FP8 tensor cores
// (TS_CUDA_FP8_GEMMS's path), and tensorwise scaling's codes (scales on the device) on the FP8
// tensor cores; against two baselines without the conversions, the forward GEMM alone on operands
// already in bf16 (cublasGemmEx) and already FP8 bytes K-major (cublasLtMatmul): what the
// engine's per-call conversions cost, and how far each path is from the tensor cores' own speed.
// Prints each linear's median forward (y = x W^T) and backward (dgrad and wgrad) time in ms and
// TFLOP/s (CUDA events, after 2 warm-up calls), then one JSON line. Without a CUDA build or a GPU
// it says why and exits 1.
//   usage: bench_gpu_gemm [--t N] [--hidden N] [--ffn N] [--reps N]
#include "apps/bench/bench_args.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#ifdef TS_HAVE_CUDA
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "apps/bench/bench_cuda.h"
#include "kernels/common/fp8_codes.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/ops_cuda.h"
#endif

namespace {

constexpr const char* kUsage = "usage: bench_gpu_gemm [--t N] [--hidden N] [--ffn N] [--reps N]";

#ifdef TS_HAVE_CUDA
namespace cuda = ts::kernels::cuda;
namespace cpu = ts::kernels::cpu;
namespace fp8codes = ts::kernels::fp8codes;

using ts::bench::gpu::Dev;
using ts::bench::gpu::ok;
using ts::bench::gpu::timeMs;

std::vector<float> uniform(size_t n, unsigned seed, float lo, float hi) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = u(rng);
    return v;
}

struct Linear {
    std::string name;
    int in, out;
};
#endif

}  // namespace

int main(int argc, char** argv) {
    if (int rc = ts::bench::checkArgs(argc, argv, kUsage); rc >= 0) return rc;
    int T = 2048, hidden = 2048, ffn = 8192, reps = 10;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string a = argv[i], v = argv[i + 1];
        if (a == "--t") T = std::atoi(v.c_str());
        else if (a == "--hidden") hidden = std::atoi(v.c_str());
        else if (a == "--ffn") ffn = std::atoi(v.c_str());
        else if (a == "--reps") reps = std::atoi(v.c_str());
        else {
            std::fprintf(stderr, "unknown option %s\n%s\n", a.c_str(), kUsage);
            return 2;
        }
    }
    if (T < 1 || hidden < 1 || ffn < 1 || reps < 1) {
        std::fprintf(stderr, "bench_gpu_gemm: need t, hidden, ffn, reps >= 1\n%s\n", kUsage);
        return 2;
    }
#ifndef TS_HAVE_CUDA
    std::fprintf(stderr, "bench_gpu_gemm: built without CUDA (configure with the CUDA toolkit present)\n");
    return 1;
#else
    ts::bench::gpu::program() = "bench_gpu_gemm";
    cudaDeviceProp prop{};
    if (!ts::bench::gpu::firstGpu(prop)) return 1;
    const bool fp8Cores = prop.major > 8 || (prop.major == 8 && prop.minor >= 9);
    void* stream = nullptr;
    if (!ok(cuda::streamCreate(&stream))) return 1;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    cublasHandle_t blas = nullptr;
    cublasLtHandle_t lt = nullptr;
    if (!ok(cublasCreate(&blas), "cublasCreate") || !ok(cublasSetStream(blas, s), "cublasSetStream") ||
        !ok(cublasLtCreate(&lt), "cublasLtCreate"))
        return 1;
    const std::vector<Linear> linears = {
        {"qkv", hidden, 3 * hidden}, {"proj", hidden, hidden}, {"fc1", hidden, ffn}, {"fc2", ffn, hidden}};
    const float sx = 37.7f, sw = 211.3f, sdy = 1.9e4f;  // delayed scaling's host scales
    std::printf("linear layers of a GPT on %s: T %d, hidden %d, ffn %d, median of %d (ms, TFLOP/s)\n", prop.name, T,
                hidden, ffn, reps);
    nlohmann::json rows = nlohmann::json::array();
    for (const Linear& l : linears) {
        const size_t nx = size_t(T) * l.in, nw = size_t(l.out) * l.in, ny = size_t(T) * l.out;
        auto hx = uniform(nx, 1, -1, 1), hw = uniform(nw, 2, -0.05f, 0.05f), hdy = uniform(ny, 3, -1e-3f, 1e-3f);
        cpu::roundToBf16(hx.data(), int64_t(nx));
        cpu::roundToBf16(hw.data(), int64_t(nw));
        cpu::roundToBf16(hdy.data(), int64_t(ny));
        Dev<float> x(nx), w(nw), dy(ny), y(ny), dx(nx), dw(nw), amax(3);
        Dev<float> qx(nx), qw(nw), qdy(ny);  // FP8 codes, delayed (host scales)
        Dev<float> tx(nx), tw(nw), tdy(ny);  // FP8 codes, tensorwise (device scales)
        Dev<uint16_t> bx(nx), bw(nw);        // bf16 baseline operands
        Dev<uint8_t> cx(nx), cw(nw);         // FP8 baseline operands, K-major
        Dev<char> lws(size_t(32) << 20);
        if (!x.p || !w.p || !dy.p || !y.p || !dx.p || !dw.p || !qx.p || !qw.p || !qdy.p || !tx.p || !tw.p || !tdy.p ||
            !bx.p || !bw.p || !cx.p || !cw.p || !lws.p || !amax.p) {
            std::fprintf(stderr, "bench_gpu_gemm: cudaMalloc failed\n");
            return 1;
        }
        if (!ok(cudaMemcpy(x.p, hx.data(), sizeof(float) * nx, cudaMemcpyHostToDevice), "upload") ||
            !ok(cudaMemcpy(w.p, hw.data(), sizeof(float) * nw, cudaMemcpyHostToDevice), "upload") ||
            !ok(cudaMemcpy(dy.p, hdy.data(), sizeof(float) * ny, cudaMemcpyHostToDevice), "upload"))
            return 1;
        using F = cpu::Fp8Format;
        bool good = ok(cuda::fp8QuantizeDequantize(x.p, qx.p, nullptr, int64_t(nx), sx, F::E4M3, stream)) &&
                    ok(cuda::fp8QuantizeDequantize(w.p, qw.p, nullptr, int64_t(nw), sw, F::E4M3, stream)) &&
                    ok(cuda::fp8QuantizeDequantize(dy.p, qdy.p, nullptr, int64_t(ny), sdy, F::E5M2, stream));
        const float* tsrc[3] = {x.p, w.p, dy.p};
        float* tdst[3] = {tx.p, tw.p, tdy.p};
        const int64_t tn[3] = {int64_t(nx), int64_t(nw), int64_t(ny)};
        for (int i = 0; i < 3 && good; ++i)
            good = ok(cuda::amaxOf(tsrc[i], tn[i], amax.p + i, stream)) &&
                   ok(cuda::fp8QuantizeCurrent(tsrc[i], tdst[i], nullptr, tn[i], amax.p + i, 1.0f,
                                               i == 2 ? F::E5M2 : F::E4M3, nullptr, stream));
        good = good && ok(cuda::floatToBf16(x.p, bx.p, int64_t(nx), stream)) &&
               ok(cuda::floatToBf16(w.p, bw.p, int64_t(nw), stream)) &&
               ok(cuda::fp8CodesToFp8(qx.p, T, l.in, l.in, false, fp8codes::Binding{sx, 0}, cx.p, stream)) &&
               ok(cuda::fp8CodesToFp8(qw.p, l.out, l.in, l.in, false, fp8codes::Binding{sw, 0}, cw.p, stream)) &&
               ok(cudaStreamSynchronize(s), "setup");
        if (!good) return 1;
        auto& codes = fp8codes::map();
        codes.bind(qx.p, int64_t(nx), sx, 0);
        codes.bind(qw.p, int64_t(nw), sw, 0);
        codes.bind(qdy.p, int64_t(ny), sdy, 1);
        codes.bindCurrent(tx.p, int64_t(nx), amax.p, 1.0f, 0, nullptr);
        codes.bindCurrent(tw.p, int64_t(nw), amax.p + 1, 1.0f, 0, nullptr);
        codes.bindCurrent(tdy.p, int64_t(ny), amax.p + 2, 1.0f, 1, nullptr);

        const double flops = 2.0 * T * double(l.in) * l.out;  // one GEMM
        nlohmann::json paths = nlohmann::json::array();
        auto report = [&](const char* path, double fwd, double bwd, int64_t fp8Gemms) {
            std::printf("  %-5s %-26s forward %8.3f ms %7.1f   backward %8.3f ms %7.1f%s\n", l.name.c_str(), path, fwd,
                        fwd > 0 ? flops / fwd / 1e9 : 0.0, bwd, bwd > 0 ? 2 * flops / bwd / 1e9 : 0.0,
                        fp8Gemms > 0 ? "  (FP8 tensor cores)" : "");
            paths.push_back({{"path", path},
                             {"forward_ms", fwd},
                             {"backward_ms", bwd},
                             {"forward_tflops", fwd > 0 ? flops / fwd / 1e9 : 0.0},
                             {"backward_tflops", bwd > 0 ? 2 * flops / bwd / 1e9 : 0.0},
                             {"fp8_gemms", fp8Gemms}});
        };
        // The engine's linear layer on (x, W, dy) in one precision path.
        auto engine = [&](const char* path, bool bf16, bool fp8Gemms, const float* px, const float* pw,
                          const float* pdy) {
            cuda::setBf16Gemms(bf16);
            cuda::setFp8Gemms(fp8Gemms);
            const int64_t before = cuda::fp8GemmCount();
            const double fwd = timeMs(stream, reps, [&] {
                return ok(cuda::linearForward(px, pw, nullptr, y.p, T, l.in, l.out, stream));
            });
            const double bwd = timeMs(stream, reps, [&] {
                return ok(cuda::linearBackward(pdy, px, pw, dx.p, dw.p, nullptr, T, l.in, l.out, stream));
            });
            report(path, fwd, bwd, cuda::fp8GemmCount() - before);
            cuda::setBf16Gemms(false);
            cuda::setFp8Gemms(false);
        };
        engine("fp32", false, false, x.p, w.p, dy.p);
        engine("bf16", true, false, x.p, w.p, dy.p);
        engine("fp8 delayed, bf16 cores", true, false, qx.p, qw.p, qdy.p);
        if (fp8Cores) {
            engine("fp8 delayed, FP8 cores", true, true, qx.p, qw.p, qdy.p);
            engine("fp8 tensorwise, FP8 cores", true, true, tx.p, tw.p, tdy.p);
        }
        // Baselines: the forward GEMM on operands already converted (column-major y^T = W x^T).
        const float one = 1.0f, zero = 0.0f;
        const double bf16Fwd = timeMs(stream, reps, [&] {
            return ok(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, l.out, T, l.in, &one, bw.p, CUDA_R_16BF, l.in, bx.p,
                                   CUDA_R_16BF, l.in, &zero, y.p, CUDA_R_32F, l.out, CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT),
                      "cublasGemmEx");
        });
        report("baseline bf16 (cublasGemmEx)", bf16Fwd, 0, 0);
        if (fp8Cores) {
            cublasLtMatmulDesc_t desc = nullptr;
            cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
            cublasLtMatmulPreference_t pref = nullptr;
            const cublasOperation_t opT = CUBLAS_OP_T, opN = CUBLAS_OP_N;
            const uint64_t wsBytes = size_t(32) << 20;
            cublasLtMatmulHeuristicResult_t res{};
            int found = 0;
            using A = cublasLtMatmulDescAttributes_t;
            const A ta = CUBLASLT_MATMUL_DESC_TRANSA, tb = CUBLASLT_MATMUL_DESC_TRANSB;
            bool lok = ok(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc") &&
                       ok(cublasLtMatmulDescSetAttribute(desc, ta, &opT, sizeof opT), "TRANSA") &&
                       ok(cublasLtMatmulDescSetAttribute(desc, tb, &opN, sizeof opN), "TRANSB") &&
                       ok(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, l.in, l.out, l.in), "layout A") &&
                       ok(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, l.in, T, l.in), "layout B") &&
                       ok(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, l.out, T, l.out), "layout C") &&
                       ok(cublasLtMatmulPreferenceCreate(&pref), "preference") &&
                       ok(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsBytes,
                                                               sizeof wsBytes),
                          "workspace") &&
                       ok(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 1, &res, &found), "heuristic");
            double fp8Fwd = -1;
            if (lok && found > 0)
                fp8Fwd = timeMs(stream, reps, [&] {
                    return ok(cublasLtMatmul(lt, desc, &one, cw.p, la, cx.p, lb, &zero, y.p, lc, y.p, lc, &res.algo,
                                             lws.p, wsBytes, s),
                              "cublasLtMatmul");
                });
            else
                std::fprintf(stderr, "bench_gpu_gemm: cuBLASLt has no FP8 algorithm for %s\n", l.name.c_str());
            report("baseline fp8 (cublasLtMatmul)", fp8Fwd, 0, 0);
            if (pref) cublasLtMatmulPreferenceDestroy(pref);
            for (auto* lay : {la, lb, lc})
                if (lay) cublasLtMatrixLayoutDestroy(lay);
            if (desc) cublasLtMatmulDescDestroy(desc);
        }
        codes.forget(qx.p, sizeof(float) * nx);
        codes.forget(qw.p, sizeof(float) * nw);
        codes.forget(qdy.p, sizeof(float) * ny);
        codes.forget(tx.p, sizeof(float) * nx);
        codes.forget(tw.p, sizeof(float) * nw);
        codes.forget(tdy.p, sizeof(float) * ny);
        rows.push_back({{"linear", l.name}, {"in", l.in}, {"out", l.out}, {"paths", paths}});
    }
    cublasLtDestroy(lt);
    cublasDestroy(blas);
    (void)cuda::streamDestroy(stream);
    std::printf("%s\n", nlohmann::json{{"bench", "bench_gpu_gemm"},
                                       {"device", prop.name},
                                       {"t", T},
                                       {"hidden", hidden},
                                       {"ffn", ffn},
                                       {"reps", reps},
                                       {"fp8_tensor_cores", fp8Cores},
                                       {"linears", rows}}
                            .dump()
                            .c_str());
    return 0;
#endif
}
