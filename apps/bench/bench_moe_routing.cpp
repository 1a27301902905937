// bench_moe_routing: one MoE layer's routing for one microbatch at the router shapes of real
// models, as the CPU backend runs it (engine/model/gpt_moe.cpp, router.topk_permute): every mode is
// a chain of kernels, timed here as their CPU oracle (on a GPU they run on the device and the host
// waits only for the experts' row offsets):
//   the balancing kernel where the mode has one: moeSinkhorn (the sinkhorn router) or
//     moeQbDualUpdate (quantile balancing: the choice, and the microbatch's quantiles);
//   the choice and the plan: moeRouteTopK + moeRoutePlan, dropless here;
//   after them the aux losses' counts and statistics (moeRouterAuxCounts) and the backward's
//     coefficients (moeRouterProbsCoefficients).
// Median of --reps calls on random logits; prints a table and one JSON line. --device cuda times
// the CUDA kernels on GPU 0 instead (CUDA events, after 2 warm-up calls; a CUDA build and a GPU,
// else it says why and exits 1). Issue #17.
//
// usage: bench_moe_routing [--tokens T] [--reps N] [--device cpu|cuda]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/bench/bench_args.h"
#include "engine/model/moe_routing.h"
#include "kernels/cpu/ops.h"

#ifdef TS_HAVE_CUDA
#include "apps/bench/bench_cuda.h"
#include "kernels/cuda/ops_cuda.h"
#endif

using namespace ts::engine;

namespace {

enum class Balance { None, Sinkhorn, Quantile };

struct Shape {
    const char* name;
    int E, K;
    MoeScore score;
    int groups, groupTopk;
    double scale;
    bool bias;
    Balance balance;
};

template <typename F>
double medianMs(int reps, F f) {
    std::vector<double> ms;
    for (int i = 0; i < reps; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        f();
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
    const char* usage = "usage: bench_moe_routing [--tokens T] [--reps N] [--device cpu|cuda]";
    if (int rc = ts::bench::checkArgs(argc, argv, usage); rc >= 0) return rc;
    int T = 4096, reps = 5;
    std::string device = "cpu";
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string k = argv[i], v = argv[i + 1];
        if (k == "--tokens") T = std::max(1, std::stoi(v));
        else if (k == "--reps") reps = std::max(1, std::stoi(v));
        else if (k == "--device" && (v == "cpu" || v == "cuda")) device = v;
        else {
            std::fprintf(stderr, "bad option %s %s\n%s\n", k.c_str(), v.c_str(), usage);
            return 2;
        }
    }
    const bool onGpu = device == "cuda";
    std::string where = "the CPU oracle, one thread";
#ifdef TS_HAVE_CUDA
    namespace gpu = ts::bench::gpu;
    namespace kd = ts::kernels::cuda;
    gpu::program() = "bench_moe_routing";
    void* stream = nullptr;
    if (onGpu) {
        cudaDeviceProp prop{};
        if (!gpu::firstGpu(prop) || !gpu::ok(kd::streamCreate(&stream))) return 1;
        where = std::string("CUDA kernels on ") + prop.name;
    }
#else
    if (onGpu) {
        std::fprintf(stderr, "bench_moe_routing: built without CUDA (configure with the CUDA toolkit present)\n");
        return 1;
    }
#endif
    // Mixtral 8x7B; Qwen3-30B-A3B (128 experts, top-8); DeepSeek-V3 (256 experts, top-8, sigmoid
    // with the expert bias, 8 groups of which 4 are kept, scaling 2.5); a Switch-style top-1 of 8
    // experts under the sinkhorn router; Qwen3's router under quantile balancing.
    const Shape shapes[] = {{"mixtral_e8_k2", 8, 2, MoeScore::Softmax, 0, 0, 0, false, Balance::None},
                            {"qwen3_e128_k8", 128, 8, MoeScore::Softmax, 0, 0, 0, false, Balance::None},
                            {"deepseek_v3_e256_k8", 256, 8, MoeScore::Sigmoid, 8, 4, 2.5, true, Balance::None},
                            {"sinkhorn_e8_k1", 8, 1, MoeScore::Softmax, 0, 0, 0, false, Balance::Sinkhorn},
                            {"qb_e128_k8", 128, 8, MoeScore::Softmax, 0, 0, 0, false, Balance::Quantile}};
    nlohmann::json out = {{"bench", "moe_routing"}, {"tokens", T}, {"reps", reps}, {"device", device}};
    std::printf("%d tokens per microbatch (seq_length x micro_batch_size, this rank's); %s\n", T, where.c_str());
    std::printf("%-22s %14s %14s %14s %16s\n", "router", "balance ms", "route ms", "aux counts ms", "bwd coeffs ms");
    std::mt19937 rng(1);
    std::normal_distribution<float> nd(0.f, 1.f);
    namespace kc = ts::kernels::cpu;
    for (const Shape& s : shapes) {
        std::vector<float> logits(size_t(T) * s.E), bias(size_t(s.E)), beta(size_t(s.E));
        for (float& v : logits) v = nd(rng);
        for (float& v : bias) v = 0.01f * nd(rng);
        for (float& v : beta) v = 0.1f * nd(rng);
        MoeRouteOptions o;
        o.T = T;
        o.E = s.E;
        o.K = s.K;
        o.score = s.score;
        o.numGroups = s.groups;
        o.groupTopk = s.groupTopk;
        o.scale = s.scale;
        o.expertBias = s.bias ? bias.data() : nullptr;
        o.bf16Probs = true;
        o.sinkhorn = s.balance == Balance::Sinkhorn;
        const kc::MoeTopKSpec spec = o.topk();
        const int64_t TK = int64_t(T) * s.K;
        std::vector<int32_t> topi(static_cast<size_t>(TK)), chosen(static_cast<size_t>(TK)), offset(size_t(s.E) + 1),
            plan(size_t(4 * TK + T + 1));
        std::vector<float> probs(static_cast<size_t>(TK)), probT(static_cast<size_t>(TK)), counts(size_t(s.E)),
            stats(size_t(s.E) + 1), norm(size_t(T) * s.E), quantile(size_t(s.E));
        std::vector<float> a(static_cast<size_t>(TK)), b(a.size()), c(a.size()), full(size_t(T) * s.E);
        const float* sinkhorn = s.balance == Balance::Sinkhorn ? norm.data() : nullptr;
        const int32_t* given = s.balance == Balance::Quantile ? chosen.data() : nullptr;
        double balance = 0, route = 0, aux = 0, coeff = 0;
        if (!onGpu) {  // the CPU oracle (--device cuda times the kernels below instead)
            if (s.balance == Balance::Sinkhorn)
                balance = medianMs(reps, [&] { kc::moeSinkhorn(logits.data(), T, s.E, norm.data(), kMoeSinkhornTol); });
            else if (s.balance == Balance::Quantile)
                balance = medianMs(reps, [&] {
                    kc::moeQbDualUpdate(logits.data(), T, s.E, s.K, beta.data(), chosen.data(), quantile.data());
                });
            route = medianMs(reps, [&] {
                kc::moeRouteTopK(logits.data(), o.expertBias, sinkhorn, given, topi.data(), probs.data(), T, s.E, spec);
                kc::moeRoutePlan(topi.data(), probs.data(), T, s.K, s.E, kc::MoeCapacity{}, offset.data(), nullptr,
                                 plan.data(), plan.data() + TK, plan.data() + TK + T + 1, plan.data() + 2 * TK + T + 1,
                                 plan.data() + 3 * TK + T + 1, probT.data());
            });
            aux = medianMs(reps, [&] {
                kc::moeRouterAuxCounts(logits.data(), T, s.E, s.K, 1, 1, s.score, counts.data(), nullptr, stats.data());
            });
            coeff = medianMs(reps, [&] {
                kc::moeRouterProbsCoefficients(logits.data(), topi.data(), T, s.E, spec, o.sinkhorn, a.data(), b.data(),
                                               c.data(), full.data());
            });
        }
#ifdef TS_HAVE_CUDA
        if (onGpu) {
            // The chain on the device, from the same inputs.
            gpu::Dev<float> dl(logits), dbias(bias), dbeta(beta), dnorm(norm.size()), dq(quantile.size()),
                dprobs(probs.size()), dprobT(probT.size()), dcounts(counts.size()), dstats(stats.size()), da(a.size()),
                db(a.size()), dc(a.size()), dfull(full.size());
            gpu::Dev<int32_t> dtopi(topi.size()), dchosen(chosen.size()), doff(offset.size()), dplan(plan.size());
            if (!dl.p || !dbias.p || !dbeta.p || !dnorm.p || !dq.p || !dprobs.p || !dprobT.p || !dcounts.p ||
                !dstats.p || !da.p || !db.p || !dc.p || !dfull.p || !dtopi.p || !dchosen.p || !doff.p || !dplan.p) {
                std::fprintf(stderr, "bench_moe_routing: device memory for %s\n", s.name);
                return 1;
            }
            int32_t* pl = dplan.p;
            if (s.balance == Balance::Sinkhorn)
                balance = gpu::timeMs(stream, reps, [&] {
                    return gpu::ok(kd::moeSinkhorn(dl.p, T, s.E, dnorm.p, kMoeSinkhornTol, stream));
                });
            else if (s.balance == Balance::Quantile)
                balance = gpu::timeMs(stream, reps, [&] {
                    return gpu::ok(kd::moeQbDualUpdate(dl.p, T, s.E, s.K, dbeta.p, dchosen.p, dq.p, stream));
                });
            route = gpu::timeMs(stream, reps, [&] {
                return gpu::ok(kd::moeRouteTopK(dl.p, o.expertBias ? dbias.p : nullptr, sinkhorn ? dnorm.p : nullptr,
                                                given ? dchosen.p : nullptr, dtopi.p, dprobs.p, T, s.E, spec, stream)) &&
                       gpu::ok(kd::moeRoutePlan(dtopi.p, dprobs.p, T, s.K, s.E, kc::MoeCapacity{}, doff.p, nullptr, pl,
                                                pl + TK, pl + TK + T + 1, pl + 2 * TK + T + 1, pl + 3 * TK + T + 1,
                                                dprobT.p, stream));
            });
            aux = gpu::timeMs(stream, reps, [&] {
                return gpu::ok(kd::moeRouterAuxCounts(dl.p, T, s.E, s.K, 1, 1, s.score, dcounts.p, nullptr, dstats.p,
                                                      stream));
            });
            coeff = gpu::timeMs(stream, reps, [&] {
                return gpu::ok(kd::moeRouterProbsCoefficients(dl.p, dtopi.p, T, s.E, spec, o.sinkhorn, da.p, db.p,
                                                              dc.p, dfull.p, stream));
            });
            if (balance < 0 || route < 0 || aux < 0 || coeff < 0) return 1;
        }
#endif
        std::printf("%-22s %14.3f %14.3f %14.3f %16.3f\n", s.name, balance, route, aux, coeff);
        out[s.name] = {{"balance_ms", balance}, {"route_ms", route}, {"aux_counts_ms", aux},
                       {"bwd_coeff_ms", coeff}, {"experts", s.E},    {"topk", s.K}};
    }
#ifdef TS_HAVE_CUDA
    if (stream) (void)kd::streamDestroy(stream);
#endif
    std::printf("%s\n", out.dump().c_str());
    return 0;
}
