// bench_moe_routing: the host's share of one MoE layer's routing for one microbatch at the
// router shapes of real models. On a GPU the forward's op router.topk_permute reads the logits
// back and routes on the host (moeRoute, moe_routing.h): the device idles from the read-back
// until the host has queued the next kernels, so this time is a lower bound of that gap per MoE
// layer and microbatch. The backward's host share (moeProbsBackwardCoefficients) delays only its
// own kernels' launch. Times each on random logits (median of --reps calls), the routing on one
// thread and on --threads (the engine's choice on a device: half the cores, at most 8), and
// prints a table and one JSON line. Issue #17: what the router on the device would save.
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
    std::printf("%-22s %14s %18s %16s %16s\n", "router", "route ms", "route ms, threads", "bwd coeffs ms",
                "us per token");
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
        MoeRouting r;
        const double route = medianMs(reps, [&] { r = moeRoute(logits.data(), o); });
        o.threads = threads;
        const double routeThreads = medianMs(reps, [&] { r = moeRoute(logits.data(), o); });
        std::vector<float> a(size_t(T) * s.K), b(a.size()), c(a.size()), full(size_t(T) * s.E);
        const double coeff = medianMs(reps, [&] {
            moeProbsBackwardCoefficients(logits.data(), r.topi.data(), o, a.data(), b.data(), c.data(), full.data());
        });
        std::printf("%-22s %14.3f %18.3f %16.3f %16.3f\n", s.name, route, routeThreads, coeff, 1e3 * route / T);
        out[s.name] = {{"route_ms", route},   {"route_ms_threads", routeThreads}, {"bwd_coeff_ms", coeff},
                       {"experts", s.E},      {"topk", s.K}};
    }
    std::printf("%s\n", out.dump().c_str());
    return 0;
}
