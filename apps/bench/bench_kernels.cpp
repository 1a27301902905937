// bench_kernels: measured sgemm peak (1 and 2 OpenBLAS threads, and two rank threads calling
// 1-thread sgemm concurrently), then per-op times of the CPU kernels at the shapes of the
// issue's tiny and small GPT configs, fused against unfused for every fusion. Prints a table
// and one JSON line (last line of stdout). Times are medians over repeated calls.
//   usage: bench_kernels [--quick]   (--quick: shorter timing windows)
#include "kernels/cpu/ops.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace cpu = ts::kernels::cpu;
using Clock = std::chrono::steady_clock;

namespace {

double g_window = 0.25;  // seconds of timing per (op, threads)

// Median seconds per call of fn, after one warm-up call.
double timeOp(const std::function<void()>& fn) {
    fn();
    std::vector<double> samples;
    const auto start = Clock::now();
    while (samples.size() < 3 ||
           (std::chrono::duration<double>(Clock::now() - start).count() < g_window &&
            samples.size() < 2000)) {
        const auto t0 = Clock::now();
        fn();
        samples.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    std::nth_element(samples.begin(), samples.begin() + samples.size() / 2, samples.end());
    return samples[samples.size() / 2];
}

std::vector<float> randomVec(size_t n, uint32_t seed, float scale = 1.0f) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> d(-scale, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng);
    return v;
}

struct Shape {
    const char* name;
    int s, b, h, heads, vocab;
    int T() const { return s * b; }
    int d() const { return h / heads; }
};

struct Row {
    std::string config, op, variant;
    int threads;
    double us;
    double gflops;  // 0 when not a flop-bound op
};

// Aggregate GFLOP/s of `nThreads` threads each running 1-thread sgemm (n x n) concurrently.
double concurrentSgemmGflops(int nThreads, int n, double seconds) {
    const int previous = cpu::numThreads();
    cpu::setNumThreads(1);
    std::vector<double> rate(nThreads, 0.0);
    std::vector<std::thread> threads;
    for (int r = 0; r < nThreads; ++r)
        threads.emplace_back([&, r] {
            const auto a = randomVec(static_cast<size_t>(n) * n, 1 + r);
            const auto b = randomVec(static_cast<size_t>(n) * n, 2 + r);
            std::vector<float> c(static_cast<size_t>(n) * n);
            int reps = 0;
            const auto t0 = Clock::now();
            double el = 0;
            do {
                cpu::gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
                ++reps;
                el = std::chrono::duration<double>(Clock::now() - t0).count();
            } while (el < seconds);
            rate[r] = 2.0 * n * n * static_cast<double>(n) * reps / el * 1e-9;
        });
    for (auto& t : threads) t.join();
    cpu::setNumThreads(previous);
    double total = 0;
    for (double x : rate) total += x;
    return total;
}

void benchShape(const Shape& sh, const std::vector<int>& threadCounts, std::vector<Row>& rows) {
    const int T = sh.T(), h = sh.h, ffn = 4 * h, V = sh.vocab, d = sh.d();
    const auto x = randomVec(static_cast<size_t>(T) * ffn, 1);
    const auto w = randomVec(static_cast<size_t>(ffn) * h, 2, 0.05f);
    const auto bias = randomVec(ffn, 3);
    const auto lnw = randomVec(h, 4), lnb = randomVec(h, 5);
    const auto dy = randomVec(static_cast<size_t>(T) * ffn, 6);
    std::vector<float> y(static_cast<size_t>(T) * ffn), dx(static_cast<size_t>(T) * ffn);
    std::vector<float> dW(static_cast<size_t>(ffn) * h), db(ffn), mean(T), rstd(T);
    std::vector<uint8_t> mask(static_cast<size_t>(T) * ffn);
    cpu::AttnDims ad;
    ad.s = sh.s;
    ad.b = sh.b;
    ad.nq = sh.heads;
    ad.nkv = sh.heads;
    ad.d = d;
    ad.scale = 1.0f / std::sqrt(static_cast<float>(d));
    const auto qkv = randomVec(static_cast<size_t>(T) * h * 3, 7);
    const float* q = qkv.data();
    const float* k = q + static_cast<size_t>(T) * h;
    const float* v = k + static_cast<size_t>(T) * h;
    std::vector<float> probs(cpu::attentionProbsSize(ad)), attOut(static_cast<size_t>(T) * h);
    std::vector<float> dq(static_cast<size_t>(T) * h), dk(dq.size()), dv(dq.size());
    std::vector<float> scratch(static_cast<size_t>(sh.s) * sh.s);
    std::vector<float> stats(cpu::attentionStatsSize(ad)), flashScratch(cpu::attentionFlashScratchSize(ad));
    const auto logits0 = randomVec(static_cast<size_t>(T) * V, 8, 4.0f);
    std::vector<float> logits(logits0.size()), ceProbs(logits0.size());
    std::vector<int32_t> targets(T);
    for (int t = 0; t < T; ++t) targets[t] = (t * 7919) % V;
    std::vector<float> dloss(T, 1.0f / T), loss(T), rowMax(T), tl(T), se(T);
    const int64_t nParams = 12LL * h * h * 4 + static_cast<int64_t>(V) * h;  // ~ tiny/small model
    auto param = randomVec(nParams, 9), grad = randomVec(nParams, 10);
    std::vector<float> m(nParams, 0.f), vv(nParams, 0.f);
    std::vector<uint16_t> bits(static_cast<size_t>(nParams));

    // attention flops: causal QK^T and PV each 2*s*s*d/2 per head (forward)
    const double attFwdFlops = 2.0 * 2.0 * sh.b * sh.heads * (sh.s * 0.5 * sh.s) * d;
    struct Op {
        const char* op;
        const char* variant;
        double flops;
        std::function<void()> fn;
    };
    std::vector<Op> ops = {
        {"linear_fwd h->4h", "", 2.0 * T * h * ffn,
         [&] { cpu::linearForward(x.data(), w.data(), bias.data(), y.data(), T, h, ffn); }},
        {"linear_bwd h->4h", "", 4.0 * T * h * ffn,
         [&] { cpu::linearBackward(dy.data(), x.data(), w.data(), dx.data(), dW.data(), db.data(), T, h, ffn); }},
        {"layernorm_fwd", "fused", 0,
         [&] { cpu::layerNormForwardFused(x.data(), lnw.data(), lnb.data(), y.data(), mean.data(), rstd.data(), T, h, 1e-5f); }},
        {"layernorm_fwd", "unfused", 0,
         [&] { cpu::layerNormForward(x.data(), lnw.data(), lnb.data(), y.data(), mean.data(), rstd.data(), T, h, 1e-5f); }},
        {"layernorm_bwd", "fused", 0,
         [&] { cpu::layerNormBackwardFused(dy.data(), x.data(), lnw.data(), mean.data(), rstd.data(), dx.data(), dW.data(), db.data(), T, h); }},
        {"layernorm_bwd", "unfused", 0,
         [&] { cpu::layerNormBackward(dy.data(), x.data(), lnw.data(), mean.data(), rstd.data(), dx.data(), dW.data(), db.data(), T, h); }},
        // A bf16 model's activations: the kernel stores bf16 values (roundBf16), or a rounding
        // pass after it (what the engine ran before).
        {"layernorm_fwd bf16 out", "fused", 0,
         [&] { cpu::layerNormForwardFused(x.data(), lnw.data(), lnb.data(), y.data(), mean.data(), rstd.data(), T, h, 1e-5f, true); }},
        {"layernorm_fwd bf16 out", "unfused", 0,
         [&] {
             cpu::layerNormForwardFused(x.data(), lnw.data(), lnb.data(), y.data(), mean.data(), rstd.data(), T, h, 1e-5f);
             cpu::roundToBf16(y.data(), int64_t(T) * h);
         }},
        {"bias_gelu_fwd [T,4h] bf16 out", "fused", 0,
         [&] { cpu::biasGeluForward(x.data(), bias.data(), y.data(), T, ffn, true); }},
        {"bias_gelu_fwd [T,4h] bf16 out", "unfused", 0,
         [&] {
             cpu::biasGeluForward(x.data(), bias.data(), y.data(), T, ffn);
             cpu::roundToBf16(y.data(), int64_t(T) * ffn);
         }},
        {"bias_gelu_fwd [T,4h]", "fused", 0,
         [&] { cpu::biasGeluForward(x.data(), bias.data(), y.data(), T, ffn); }},
        {"bias_gelu_fwd [T,4h]", "unfused", 0,
         [&] { cpu::biasGeluForwardUnfused(x.data(), bias.data(), y.data(), T, ffn); }},
        {"bias_gelu_bwd [T,4h]", "", 0,
         [&] { cpu::biasGeluBackward(dy.data(), x.data(), bias.data(), dx.data(), db.data(), T, ffn); }},
        {"swiglu_fwd [T,2h]->[T,h]", "", 0,
         [&] { cpu::swigluForward(x.data(), y.data(), T, h); }},
        {"bias_dropout_add p=0.1", "fused", 0,
         [&] { cpu::biasDropoutAddFused(x.data(), bias.data(), dy.data(), y.data(), mask.data(), T, h, 0.1f, 1, 0); }},
        {"bias_dropout_add p=0.1", "unfused", 0,
         [&] { cpu::biasDropoutAddUnfused(x.data(), bias.data(), dy.data(), y.data(), mask.data(), T, h, 0.1f, 1, 0); }},
        {"bias_dropout_add p=0", "fused", 0,
         [&] { cpu::biasDropoutAddFused(x.data(), bias.data(), dy.data(), y.data(), nullptr, T, h, 0.0f, 1, 0); }},
        {"bias_dropout_add p=0", "unfused", 0,
         [&] { cpu::biasDropoutAddUnfused(x.data(), bias.data(), dy.data(), y.data(), nullptr, T, h, 0.0f, 1, 0); }},
        {"rope q [s,b,n,d]", "fused",
         0, [&] { cpu::ropeForwardFused(y.data(), sh.s, sh.b, sh.heads, d, 10000.0f, 0); }},
        {"rope q [s,b,n,d]", "unfused",
         0, [&] { cpu::ropeForward(y.data(), sh.s, sh.b, sh.heads, d, 10000.0f, 0); }},
        {"attention_fwd", "fused", attFwdFlops,
         [&] { cpu::attentionForward(ad, q, k, v, probs.data(), attOut.data(), true); }},
        {"attention_fwd", "unfused", attFwdFlops,
         [&] { cpu::attentionForward(ad, q, k, v, probs.data(), attOut.data(), false); }},
        {"attention_bwd", "", 2.0 * attFwdFlops,
         [&] { cpu::attentionBackward(ad, q, k, v, probs.data(), attOut.data(), dq.data(), dk.data(), dv.data(), scratch.data()); }},
        // flash: nothing of s x s kept; the backward rebuilds the probabilities (one more GEMM)
        {"attention_fwd", "flash", attFwdFlops,
         [&] { cpu::attentionFlashForward(ad, q, k, v, stats.data(), attOut.data()); }},
        {"attention_bwd", "flash", 2.5 * attFwdFlops,
         [&] {
             cpu::attentionFlashBackward(ad, q, k, v, stats.data(), attOut.data(), dq.data(), dk.data(), dv.data(),
                                         flashScratch.data());
         }},
        {"cross_entropy fwd+bwd", "fused", 0,
         [&] {
             std::memcpy(logits.data(), logits0.data(), sizeof(float) * logits.size());
             cpu::crossEntropyFused(logits.data(), targets.data(), dloss.data(), loss.data(), T, V);
         }},
        {"cross_entropy fwd+bwd", "unfused", 0,
         [&] {
             std::memcpy(logits.data(), logits0.data(), sizeof(float) * logits.size());
             cpu::crossEntropyForwardUnfused(logits.data(), targets.data(), ceProbs.data(), loss.data(), T, V);
             cpu::crossEntropyBackwardUnfused(ceProbs.data(), targets.data(), dloss.data(), logits.data(), T, V);
         }},
        {"cross_entropy fwd+bwd", "staged(vocab-par)", 0,
         [&] {
             std::memcpy(logits.data(), logits0.data(), sizeof(float) * logits.size());
             cpu::crossEntropyRowMax(logits.data(), rowMax.data(), T, V);
             cpu::crossEntropyStats(logits.data(), targets.data(), rowMax.data(), tl.data(), se.data(), T, V, 0);
             cpu::crossEntropyLoss(tl.data(), se.data(), loss.data(), T);
             cpu::crossEntropyBackward(logits.data(), targets.data(), rowMax.data(), se.data(), dloss.data(), logits.data(), T, V, 0);
         }},
        {"adamw (model params)", "", 0,
         [&] {
             cpu::AdamParams hp;
             hp.weightDecay = 0.1f;
             cpu::adamwStep(param.data(), grad.data(), m.data(), vv.data(), nParams, hp);
         }},
        // a bf16 model's step: its bf16 copy written in the update's pass, or in a second one
        {"adamw + bf16 model bits", "fused", 0,
         [&] {
             cpu::AdamParams hp;
             hp.weightDecay = 0.1f;
             cpu::adamwStep(param.data(), grad.data(), m.data(), vv.data(), nParams, hp, bits.data());
         }},
        {"adamw + bf16 model bits", "unfused", 0,
         [&] {
             cpu::AdamParams hp;
             hp.weightDecay = 0.1f;
             cpu::adamwStep(param.data(), grad.data(), m.data(), vv.data(), nParams, hp);
             cpu::floatToBf16(param.data(), bits.data(), nParams);
         }},
    };
    for (int th : threadCounts) {
        cpu::setNumThreads(th);
        for (const auto& op : ops) {
            const double sec = timeOp(op.fn);
            rows.push_back({sh.name, op.op, op.variant, th, sec * 1e6,
                            op.flops > 0 ? op.flops / sec * 1e-9 : 0.0});
        }
    }
}

}  // namespace

int main(int argc, char** argv) {
    for (int i = 1; i < argc; ++i)
        if (std::strcmp(argv[i], "--quick") == 0) g_window = 0.05;
    const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
    std::vector<int> threadCounts = {1};
    if (hw >= 2) threadCounts.push_back(2);

    nlohmann::json out;
    out["bench"] = "kernels";
    out["hardware_threads"] = hw;
    std::printf("sgemm peak (n=1024):\n");
    for (int th : threadCounts) {
        const double g = cpu::measureSgemmPeakGflops(th, 1024, g_window * 4);
        std::printf("  %d thread(s): %8.1f GFLOP/s\n", th, g);
        out["sgemm_peak_gflops"][std::to_string(th)] = g;
    }
    if (hw >= 2) {
        // Rank threads each with 1-thread OpenBLAS: do their sgemms run in parallel?
        const double one = concurrentSgemmGflops(1, 512, g_window * 2);
        const double two = concurrentSgemmGflops(2, 512, g_window * 2);
        std::printf("  1-thread sgemm n=512: 1 caller %.1f GFLOP/s, 2 concurrent callers %.1f "
                    "GFLOP/s total (x%.2f)\n", one, two, two / one);
        out["concurrent_sgemm_gflops"] = {{"callers_1", one}, {"callers_2", two}};
    }

    const Shape shapes[] = {{"tiny", 128, 8, 256, 4, 4096}, {"small", 256, 8, 512, 8, 8192}};
    std::vector<Row> rows;
    for (const auto& sh : shapes) benchShape(sh, threadCounts, rows);

    std::printf("\n%-6s %-28s %-18s %3s %12s %9s\n", "config", "op", "variant", "thr", "us/call",
                "GFLOP/s");
    nlohmann::json jops = nlohmann::json::array();
    for (const auto& r : rows) {
        std::printf("%-6s %-28s %-18s %3d %12.1f %9s\n", r.config.c_str(), r.op.c_str(),
                    r.variant.c_str(), r.threads, r.us,
                    r.gflops > 0 ? std::to_string(static_cast<int>(std::lround(r.gflops))).c_str() : "");
        nlohmann::json j = {{"config", r.config}, {"op", r.op}, {"threads", r.threads}, {"us", r.us}};
        if (!r.variant.empty()) j["variant"] = r.variant;
        if (r.gflops > 0) j["gflops"] = r.gflops;
        jops.push_back(j);
    }
    // fused / unfused speedups, per config and thread count
    std::printf("\nfusion speedups (unfused time / fused time):\n");
    nlohmann::json jsp = nlohmann::json::array();
    for (const auto& f : rows) {
        if (f.variant != "fused") continue;
        for (const auto& u : rows)
            if (u.variant == "unfused" && u.op == f.op && u.config == f.config &&
                u.threads == f.threads) {
                std::printf("  %-6s %-28s thr %d: x%.2f\n", f.config.c_str(), f.op.c_str(),
                            f.threads, u.us / f.us);
                jsp.push_back({{"config", f.config}, {"op", f.op}, {"threads", f.threads},
                               {"speedup", u.us / f.us}});
            }
    }
    out["ops"] = jops;
    out["fusion_speedup"] = jsp;
    std::printf("%s\n", out.dump().c_str());
    return 0;
}
