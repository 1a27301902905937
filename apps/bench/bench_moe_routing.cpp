// bench_moe_routing: one MoE layer's routing for one microbatch at the router shapes of real
// models, on the host. Two paths route (engine/model/gpt_moe.cpp, router.topk_permute):
//   the kernels (moeRouteTopK + moeRoutePlan): every router but sinkhorn and quantile balancing,
//     dropless here; timed as their CPU oracle, what the CPU backend spends (on a GPU they run on
//     the device and the host waits only for the experts' row offsets);
//   the host's moeRoute (sinkhorn, quantile balancing; timed here on the same routers): on a GPU the device idles
//     from the logits' read-back until the host has queued the next kernels, so this time is a
//     lower bound of that gap per MoE layer and microbatch; on one thread and on --threads (the
//     engine's choice on a device: half the cores, at most 8).
// After either: the aux losses' counts and statistics (moeRouterAuxCounts' oracle, a kernel on a
// GPU) and the backward's coefficients (moeRouterProbsCoefficients'). Median of --reps calls on
// random logits; prints a table and one JSON line. Issue #17.
//
// usage: bench_moe_routing [--tokens T] [--reps N] [--threads N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/bench/bench_args.h"
#include "engine/model/moe_routing.h"
#include "kernels/cpu/ops.h"

using namespace ts::engine;

namespace {

struct Shape {
    const char* name;
    int E, K;
    MoeScore score;
    int groups, groupTopk;
    double scale;
    bool bias;
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
    const char* usage = "usage: bench_moe_routing [--tokens T] [--reps N] [--threads N]";
    if (int rc = ts::bench::checkArgs(argc, argv, usage); rc >= 0) return rc;
    int T = 4096, reps = 5, threads = std::clamp(int(std::thread::hardware_concurrency()) / 2, 1, 8);
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string k = argv[i], v = argv[i + 1];
        if (k == "--tokens") T = std::max(1, std::stoi(v));
        else if (k == "--reps") reps = std::max(1, std::stoi(v));
        else if (k == "--threads") threads = std::max(1, std::stoi(v));
        else {
            std::fprintf(stderr, "unknown option %s\n%s\n", k.c_str(), usage);
            return 2;
        }
    }
    // Mixtral 8x7B; Qwen3-30B-A3B (128 experts, top-8); DeepSeek-V3 (256 experts, top-8, sigmoid
    // with the expert bias, 8 groups of which 4 are kept, scaling 2.5).
    const Shape shapes[] = {{"mixtral_e8_k2", 8, 2, MoeScore::Softmax, 0, 0, 0, false},
                            {"qwen3_e128_k8", 128, 8, MoeScore::Softmax, 0, 0, 0, false},
                            {"deepseek_v3_e256_k8", 256, 8, MoeScore::Sigmoid, 8, 4, 2.5, true}};
    nlohmann::json out = {{"bench", "moe_routing"}, {"tokens", T}, {"reps", reps}, {"threads", threads}};
    std::printf("%d tokens per microbatch (seq_length x micro_batch_size, this rank's)\n", T);
    std::printf("%-22s %14s %14s %18s %14s %16s\n", "router", "kernels ms", "host ms", "host ms, threads",
                "aux counts ms", "bwd coeffs ms");
    std::mt19937 rng(1);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (const Shape& s : shapes) {
        std::vector<float> logits(size_t(T) * s.E), bias(size_t(s.E));
        for (float& v : logits) v = nd(rng);
        for (float& v : bias) v = 0.01f * nd(rng);
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
        namespace kc = ts::kernels::cpu;
        const kc::MoeTopKSpec spec = o.topk();
        const int64_t TK = int64_t(T) * s.K;
        std::vector<int32_t> topi(static_cast<size_t>(TK)), offset(size_t(s.E) + 1), plan(size_t(4 * TK + T + 1));
        std::vector<float> probs(static_cast<size_t>(TK)), probT(static_cast<size_t>(TK)), counts(size_t(s.E)), stats(size_t(s.E) + 1);
        const double kernels = medianMs(reps, [&] {
            kc::moeRouteTopK(logits.data(), o.expertBias, topi.data(), probs.data(), T, s.E, spec);
            kc::moeRoutePlan(topi.data(), probs.data(), T, s.K, s.E, kc::MoeCapacity{}, offset.data(), nullptr,
                             plan.data(), plan.data() + TK,
                             plan.data() + TK + T + 1, plan.data() + 2 * TK + T + 1, plan.data() + 3 * TK + T + 1,
                             probT.data());
        });
        const double aux = medianMs(reps, [&] {
            kc::moeRouterAuxCounts(logits.data(), T, s.E, s.K, 1, 1, s.score, counts.data(), nullptr, stats.data());
        });
        MoeRouting r;
        const double route = medianMs(reps, [&] { r = moeRoute(logits.data(), o); });
        o.threads = threads;
        const double routeThreads = medianMs(reps, [&] { r = moeRoute(logits.data(), o); });
        std::vector<float> a(static_cast<size_t>(TK)), b(a.size()), c(a.size()), full(size_t(T) * s.E);
        const double coeff = medianMs(reps, [&] {
            kc::moeRouterProbsCoefficients(logits.data(), topi.data(), T, s.E, spec, false, a.data(), b.data(),
                                           c.data(), full.data());
        });
        std::printf("%-22s %14.3f %14.3f %18.3f %14.3f %16.3f\n", s.name, kernels, route, routeThreads, aux, coeff);
        out[s.name] = {{"kernels_ms", kernels}, {"route_ms", route},  {"route_ms_threads", routeThreads},
                       {"aux_counts_ms", aux},  {"bwd_coeff_ms", coeff}, {"experts", s.E}, {"topk", s.K}};
    }
    std::printf("%s\n", out.dump().c_str());
    return 0;
}
