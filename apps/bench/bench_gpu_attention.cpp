// bench_gpu_attention: flash attention's forward and backward on GPU 0 under bf16 GEMMs, the
// tiled tensor-core kernels (kernels/cuda/flash_attention.cu) against the GEMM path (scores GEMM,
// row kernels, PV GEMM over the [s, s] square), at the ~1.3B GPT's shape by default (s 2048, 16
// heads of 128, micro-batch 1). Prints each path's median forward and backward time (CUDA events,
// after warm-up calls), the causal attention's model TFLOP/s (half the square: forward 2 GEMMs
// of 2*s*s*d/2 per head, backward 2.5 times that), how far the tiled results are from the GEMM
// path's (max |a - b| / max |b| per output), and one JSON line. Without a CUDA build or a GPU it
// says why and exits 1.
//   usage: bench_gpu_attention [--s N] [--b N] [--heads N] [--kv-heads N] [--d N] [--dropout P] [--reps N]
#include "apps/bench/bench_args.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#ifdef TS_HAVE_CUDA
#include <cuda_runtime.h>

#include "apps/bench/bench_cuda.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/ops_cuda.h"
#endif

namespace {

constexpr const char* kUsage =
    "usage: bench_gpu_attention [--s N] [--b N] [--heads N] [--kv-heads N] [--d N] [--dropout P] [--reps N]";

#ifdef TS_HAVE_CUDA
namespace cuda = ts::kernels::cuda;
namespace cpu = ts::kernels::cpu;

using Dev = ts::bench::gpu::Dev<float>;
using ts::bench::gpu::ok;
using ts::bench::gpu::timeMs;

// bf16-valued uniform floats in [lo, hi), what a bf16 model stores.
std::vector<float> bf16Values(size_t n, unsigned seed, float lo, float hi) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = u(rng);
    cpu::roundToBf16(v.data(), static_cast<int64_t>(n));
    return v;
}

// max |a - b| / max |b|
double relDiff(const std::vector<float>& a, const std::vector<float>& b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        num = std::max(num, std::fabs(double(a[i]) - double(b[i])));
        den = std::max(den, std::fabs(double(b[i])));
    }
    return den > 0 ? num / den : num;
}
#endif

}  // namespace

int main(int argc, char** argv) {
    if (int rc = ts::bench::checkArgs(argc, argv, kUsage); rc >= 0) return rc;
    int s = 2048, b = 1, heads = 16, kvHeads = 0, d = 128, reps = 10;
    float dropout = 0.0f;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string a = argv[i], v = argv[i + 1];
        if (a == "--s") s = std::atoi(v.c_str());
        else if (a == "--b") b = std::atoi(v.c_str());
        else if (a == "--heads") heads = std::atoi(v.c_str());
        else if (a == "--kv-heads") kvHeads = std::atoi(v.c_str());
        else if (a == "--d") d = std::atoi(v.c_str());
        else if (a == "--dropout") dropout = std::strtof(v.c_str(), nullptr);
        else if (a == "--reps") reps = std::atoi(v.c_str());
        else {
            std::fprintf(stderr, "unknown option %s\n%s\n", a.c_str(), kUsage);
            return 2;
        }
    }
    if (kvHeads == 0) kvHeads = heads;
    if (s < 1 || b < 1 || heads < 1 || kvHeads < 1 || heads % kvHeads != 0 || d < 1 || reps < 1 || dropout < 0 ||
        dropout >= 1) {
        std::fprintf(stderr, "bench_gpu_attention: need s, b, heads, d, reps >= 1, heads a multiple of kv-heads and "
                             "0 <= dropout < 1\n%s\n", kUsage);
        return 2;
    }
#ifndef TS_HAVE_CUDA
    std::fprintf(stderr, "bench_gpu_attention: built without CUDA (configure with the CUDA toolkit present)\n");
    return 1;
#else
    ts::bench::gpu::program() = "bench_gpu_attention";
    cudaDeviceProp prop{};
    if (!ts::bench::gpu::firstGpu(prop)) return 1;
    if (!cuda::flashTilesSupported(d))
        std::fprintf(stderr, "bench_gpu_attention: the tiled kernels do not run on this GPU at head dim %d: both "
                             "rows below are the GEMM path\n", d);
    cpu::AttnDims dm;
    dm.s = s;
    dm.b = b;
    dm.nq = heads;
    dm.nkv = kvHeads;
    dm.d = d;
    dm.scale = 1.0f / std::sqrt(static_cast<float>(d));
    dm.dropout = dropout;
    dm.dropoutSeed = 7;
    const size_t nQ = size_t(s) * b * heads * d, nK = size_t(s) * b * kvHeads * d;
    Dev q(nQ), k(nK), v(nK), dout(nQ), stats(cpu::attentionStatsSize(dm)), scratch(cpu::attentionFlashScratchSize(dm));
    if (!q.p || !k.p || !v.p || !dout.p || !stats.p || !scratch.p) {
        std::fprintf(stderr, "bench_gpu_attention: cudaMalloc failed\n");
        return 1;
    }
    const auto hq = bf16Values(nQ, 1, -1, 1), hk = bf16Values(nK, 2, -1, 1), hv = bf16Values(nK, 3, -1, 1),
               hdo = bf16Values(nQ, 4, -0.01f, 0.01f);
    if (!ok(cudaMemcpy(q.p, hq.data(), sizeof(float) * nQ, cudaMemcpyHostToDevice), "upload") ||
        !ok(cudaMemcpy(k.p, hk.data(), sizeof(float) * nK, cudaMemcpyHostToDevice), "upload") ||
        !ok(cudaMemcpy(v.p, hv.data(), sizeof(float) * nK, cudaMemcpyHostToDevice), "upload") ||
        !ok(cudaMemcpy(dout.p, hdo.data(), sizeof(float) * nQ, cudaMemcpyHostToDevice), "upload"))
        return 1;
    void* stream = nullptr;
    if (!ok(cuda::streamCreate(&stream))) return 1;

    struct Result {
        std::string path;
        double fwdMs = 0, bwdMs = 0;
        std::vector<float> out, dq, dk, dv;
    };
    std::vector<Result> results;
    cuda::setBf16Gemms(true);
    for (bool tiles : {false, true}) {
        cuda::setFlashTiles(tiles);
        Result r;
        r.path = tiles ? "tiles" : "gemm";
        Dev out(nQ), dq(nQ), dk(nK), dv(nK);
        auto fwd = [&] { return cuda::attentionFlashForward(dm, q.p, k.p, v.p, stats.p, out.p, stream); };
        auto bwd = [&] {
            return cuda::attentionFlashBackward(dm, q.p, k.p, v.p, stats.p, dout.p, dq.p, dk.p, dv.p, scratch.p, stream);
        };
        // The backward reads the forward's stats, the same every call.
        r.fwdMs = timeMs(stream, reps, [&] { return ok(fwd()); });
        r.bwdMs = r.fwdMs < 0 ? -1.0 : timeMs(stream, reps, [&] { return ok(bwd()); });
        if (r.fwdMs < 0 || r.bwdMs < 0) return 1;
        r.out = out.get();
        r.dq = dq.get();
        r.dk = dk.get();
        r.dv = dv.get();
        results.push_back(std::move(r));
    }
    cuda::setBf16Gemms(false);
    cuda::setFlashTiles(false);
    (void)cuda::streamDestroy(stream);

    // The causal square's model FLOPs: forward QK^T and PV over half the square, backward 2.5x.
    const double fwdFlops = 2.0 * 2.0 * b * heads * double(s) * s * d / 2;
    const double bwdFlops = 2.5 * fwdFlops;
    std::printf("flash attention on %s: s %d, b %d, %d heads (%d kv) of %d, dropout %g, bf16 GEMMs, median of %d\n",
                prop.name, s, b, heads, kvHeads, d, dropout, reps);
    nlohmann::json paths = nlohmann::json::array();
    for (const Result& r : results) {
        std::printf("  %-5s forward %8.3f ms (%6.1f TFLOP/s)  backward %8.3f ms (%6.1f TFLOP/s)\n", r.path.c_str(),
                    r.fwdMs, fwdFlops / r.fwdMs / 1e9, r.bwdMs, bwdFlops / r.bwdMs / 1e9);
        paths.push_back({{"path", r.path},
                         {"forward_ms", r.fwdMs},
                         {"backward_ms", r.bwdMs},
                         {"forward_tflops", fwdFlops / r.fwdMs / 1e9},
                         {"backward_tflops", bwdFlops / r.bwdMs / 1e9}});
    }
    const Result& g = results[0];
    const Result& t = results[1];
    const double dOut = relDiff(t.out, g.out), dQ = relDiff(t.dq, g.dq), dK = relDiff(t.dk, g.dk),
                 dV = relDiff(t.dv, g.dv);
    std::printf("  tiles against gemm, max |diff| / max |gemm|: out %.2e, dq %.2e, dk %.2e, dv %.2e\n", dOut, dQ, dK, dV);
    std::printf("%s\n", nlohmann::json{{"bench", "bench_gpu_attention"},
                                       {"device", prop.name},
                                       {"s", s},
                                       {"b", b},
                                       {"heads", heads},
                                       {"kv_heads", kvHeads},
                                       {"d", d},
                                       {"dropout", dropout},
                                       {"reps", reps},
                                       {"tiles_supported", cuda::flashTilesSupported(d)},
                                       {"paths", paths},
                                       {"rel_diff", {{"out", dOut}, {"dq", dQ}, {"dk", dK}, {"dv", dV}}}}
                            .dump()
                            .c_str());
    return 0;
#endif
}
