// CUDA kernels of ops_cuda.h's MoE sections (kernels/cuda/moe.cu, moe_route.cu) against the CPU oracle of the
// same name (kernels/cpu/moe.cpp) on random data with odd sizes: bit for bit (each output element
// is one thread in the oracle's order), except sigmoidGateForward's gate (double exp: 1e-6
// relative) and the router's probs backward (the CPU may fuse its multiply-adds: 1e-6 relative). Skips without a CUDA build or without a device.
#include <gtest/gtest.h>

#include <limits>

#include "tests/gpu/gpu_test_util.h"

#ifdef TS_HAVE_CUDA

#include "kernels/cpu/ops.h"
#include "kernels/cuda/ops_cuda.h"

#include <cstdint>
#include <random>
#include <vector>

namespace ts::kernels {
namespace {

using namespace gputest;

class CudaMoe : public CudaStreamTest {};

TEST_F(CudaMoe, GatherAndGatherSumRowsAreBitExact) {
    const int srcRows = 301, cols = 129, rows = 517, T = 211;
    const auto src = randomVec(size_t(srcRows) * cols, 1, -3, 3);
    std::mt19937 rng(7);
    std::vector<int32_t> idx(rows), tokenOf(srcRows);
    for (auto& i : idx) i = int32_t(rng() % (srcRows + 20)) - 20;  // some negative: zero rows
    for (auto& t : tokenOf) t = int32_t(rng() % T);
    std::vector<int32_t> start(T + 1, 0), inv;
    for (int t = 0; t < T; ++t) {
        for (int r = 0; r < srcRows; ++r)
            if (tokenOf[r] == t) inv.push_back(r);
        start[t + 1] = int32_t(inv.size());
    }
    DeviceVec<float> dsrc(src), ddst(size_t(rows) * cols);
    DeviceVec<int32_t> didx(idx), dstart(start), dinv(inv);
    TS_ASSERT_OK(cuda::gatherRows(dsrc.ptr, didx.ptr, ddst.ptr, rows, cols, m_stream));
    const auto init = randomVec(size_t(T) * cols, 2);
    DeviceVec<float> dsum(init);
    TS_ASSERT_OK(cuda::gatherSumRows(dsrc.ptr, dstart.ptr, dinv.ptr, dsum.ptr, T, cols, m_stream));
    sync();
    std::vector<float> want(size_t(rows) * cols), sum = init;
    cpu::gatherRows(src.data(), idx.data(), want.data(), rows, cols);
    cpu::gatherSumRows(src.data(), start.data(), inv.data(), sum.data(), T, cols);
    expectSameBits(ddst.download(), want, "gatherRows", {rows, cols});
    expectSameBits(dsum.download(), sum, "gatherSumRows", {T, cols});
}

TEST_F(CudaMoe, ScaleRowsProbGradAndWeightedColumnSumAreBitExact) {
    const int rows = 263, F = 97, h = 131;
    const auto x = randomVec(size_t(rows) * F, 3), s = randomVec(rows, 4, 0, 1), b = randomVec(h, 5);
    const auto da = randomVec(size_t(rows) * F, 6), dy = randomVec(size_t(rows) * h, 7), db0 = randomVec(h, 8);
    DeviceVec<float> dx(x), ds(s), db(b), dda(da), ddy(dy), dy1(size_t(rows) * F), dyb(size_t(rows) * h);
    DeviceVec<float> dact(size_t(rows) * F), dprob(rows), dact0(size_t(rows) * F), dprob0(rows), dsum(db0);
    TS_ASSERT_OK(cuda::scaleRows(dx.ptr, F, ds.ptr, dy1.ptr, rows, F, m_stream));
    TS_ASSERT_OK(cuda::scaleRows(db.ptr, 0, ds.ptr, dyb.ptr, rows, h, m_stream));
    TS_ASSERT_OK(cuda::moeProbGrad(dda.ptr, dx.ptr, ds.ptr, ddy.ptr, db.ptr, dact.ptr, dprob.ptr, rows, F, h, m_stream));
    TS_ASSERT_OK(
        cuda::moeProbGrad(dda.ptr, dx.ptr, ds.ptr, nullptr, nullptr, dact0.ptr, dprob0.ptr, rows, F, h, m_stream));
    TS_ASSERT_OK(cuda::weightedColumnSum(ddy.ptr, ds.ptr, dsum.ptr, rows, h, m_stream));
    sync();
    std::vector<float> y1(size_t(rows) * F), yb(size_t(rows) * h), act(size_t(rows) * F), prob(rows),
        act0(size_t(rows) * F), prob0(rows), sum = db0;
    cpu::scaleRows(x.data(), F, s.data(), y1.data(), rows, F);
    cpu::scaleRows(b.data(), 0, s.data(), yb.data(), rows, h);
    cpu::moeProbGrad(da.data(), x.data(), s.data(), dy.data(), b.data(), act.data(), prob.data(), rows, F, h);
    cpu::moeProbGrad(da.data(), x.data(), s.data(), nullptr, nullptr, act0.data(), prob0.data(), rows, F, h);
    cpu::weightedColumnSum(dy.data(), s.data(), sum.data(), rows, h);
    expectSameBits(dy1.download(), y1, "scaleRows", {rows, F});
    expectSameBits(dyb.download(), yb, "scaleRows (broadcast)", {rows, h});
    expectSameBits(dact.download(), act, "moeProbGrad dact", {rows, F});
    expectSameBits(dprob.download(), prob, "moeProbGrad dprob (bias)");
    expectSameBits(dprob0.download(), prob0, "moeProbGrad dprob");
    expectSameBits(dsum.download(), sum, "weightedColumnSum");
}

TEST_F(CudaMoe, SigmoidGateMatchesTheCpu) {
    const int T = 187, h = 133;
    const auto x = randomVec(size_t(T) * h, 9), w = randomVec(h, 10, -0.2f, 0.2f), y = randomVec(size_t(T) * h, 11);
    const auto dout = randomVec(size_t(T) * h, 12), dw0 = randomVec(h, 13);
    for (const bool bf : {false, true}) {
        DeviceVec<float> dx(x), dw(w), dyv(y), dgate(T), dout2(size_t(T) * h);
        TS_ASSERT_OK(cuda::sigmoidGateForward(dx.ptr, dw.ptr, dyv.ptr, dgate.ptr, dout2.ptr, T, h, bf, m_stream));
        sync();
        std::vector<float> gate(T), out(size_t(T) * h);
        cpu::sigmoidGateForward(x.data(), w.data(), y.data(), gate.data(), out.data(), T, h, bf);
        expectClose(dgate.download(), gate, bf ? 8e-3 : 1e-6, 0, bf ? "gate (bf16)" : "gate");
        expectClose(dout2.download(), out, bf ? 8e-3 : 1e-6, 1e-7, "gate out");
    }
    std::vector<float> gate(T), out(size_t(T) * h);
    cpu::sigmoidGateForward(x.data(), w.data(), y.data(), gate.data(), out.data(), T, h, false);
    DeviceVec<float> ddout(dout), dyv(y), dx(x), dgate(gate), dw(w), ddy(size_t(T) * h), ddx(size_t(T) * h), ddw(dw0);
    TS_ASSERT_OK(cuda::sigmoidGateBackward(ddout.ptr, dyv.ptr, dx.ptr, dgate.ptr, dw.ptr, ddy.ptr, ddx.ptr, ddw.ptr, T,
                                           h, m_stream));
    sync();
    std::vector<float> dy(size_t(T) * h), dxh(size_t(T) * h), dwh = dw0;
    cpu::sigmoidGateBackward(dout.data(), y.data(), x.data(), gate.data(), w.data(), dy.data(), dxh.data(), dwh.data(),
                             T, h);
    expectSameBits(ddy.download(), dy, "sigmoidGateBackward dy", {T, h});
    expectSameBits(ddx.download(), dxh, "sigmoidGateBackward dx", {T, h});
    expectSameBits(ddw.download(), dwh, "sigmoidGateBackward dw");
}

// The router's probs backward: tokens with dropped slots (row -1), with and without the softmax
// over all experts. The CPU's loops may fuse a multiply-add (-ffp-contract=fast): 1e-6 relative.
TEST_F(CudaMoe, RouterProbsBackwardMatchesTheCpu) {
    const int T = 203, K = 3, E = 37, rows = T * K - 40;
    std::mt19937 rng(11);
    const auto dprob = randomVec(size_t(rows), 21, -2, 2), a = randomVec(size_t(T) * K, 22),
               b = randomVec(size_t(T) * K, 23), c = randomVec(size_t(T) * K, 24),
               full = randomVec(size_t(T) * E, 25, 0, 1), dl0 = randomVec(size_t(T) * E, 26, -0.1f, 0.1f);
    std::vector<int32_t> rowOf(size_t(T) * K), sel(size_t(T) * K);
    for (int t = 0; t < T; ++t)
        for (int j = 0; j < K; ++j) {
            sel[size_t(t) * K + j] = int32_t((t * 7 + j * 11) % E);  // distinct within a token
            rowOf[size_t(t) * K + j] = int32_t(rng() % (rows + rows / 8)) - rows / 8;  // some dropped (< 0)
        }
    for (const bool withFull : {false, true}) {
        DeviceVec<float> ddp(dprob), da(a), db(b), dc(c), dfull(full), ddl(dl0);
        DeviceVec<int32_t> drow(rowOf), dsel(sel);
        TS_ASSERT_OK(cuda::moeRouterProbsBackward(ddp.ptr, drow.ptr, dsel.ptr, da.ptr, db.ptr, dc.ptr,
                                                  withFull ? dfull.ptr : nullptr, ddl.ptr, T, K, E, m_stream));
        sync();
        std::vector<float> dl = dl0;
        cpu::moeRouterProbsBackward(dprob.data(), rowOf.data(), sel.data(), a.data(), b.data(), c.data(),
                                    withFull ? full.data() : nullptr, dl.data(), T, K, E);
        expectClose(ddl.download(), dl, 1e-6, 1e-7, withFull ? "router probs backward (full softmax)"
                                                             : "router probs backward");
    }
}

// The router's aux and z losses' gradient: three groups of four sequences, every score function,
// with and without the counts and the global counts. Double math, exp/log1p on CUDA within 1-2 ulp of
// glibc's: 1e-6 relative.
TEST_F(CudaMoe, RouterAuxBackwardMatchesTheCpu) {
    const int T = 211, E = 29, G = 3, mbB = 4;
    const auto logits = randomVec(size_t(T) * E, 31, -4, 4), counts = randomVec(size_t(G) * E, 32, 0, 50),
               global = randomVec(size_t(E), 33, 0, 200);
    for (const cpu::MoeScore f : {cpu::MoeScore::Softmax, cpu::MoeScore::Sigmoid, cpu::MoeScore::SqrtSoftplus})
        for (const int with : {0, 1, 2, 3}) {  // bit 0: the counts, bit 1: the global counts
            DeviceVec<float> dlog(logits), dcounts(counts), dglobal(global), ddl(size_t(T) * E);
            const bool withCounts = with & 1, withGlobal = with & 2;
            TS_ASSERT_OK(cuda::moeRouterAuxBackward(dlog.ptr, withCounts ? dcounts.ptr : nullptr,
                                                    withGlobal ? dglobal.ptr : nullptr, ddl.ptr, T, E, G, mbB, f, 1e-3,
                                                    2e-3, 5e-4, 0.01, m_stream));
            sync();
            std::vector<float> dl(size_t(T) * E);
            cpu::moeRouterAuxBackward(logits.data(), withCounts ? counts.data() : nullptr,
                                      withGlobal ? global.data() : nullptr, dl.data(), T, E, G, mbB, f, 1e-3, 2e-3,
                                      5e-4, 0.01);
            expectClose(ddl.download(), dl, 1e-6, 1e-9,
                        "router aux backward, score " + std::to_string(int(f)) + (withCounts ? ", counts" : "") +
                            (withGlobal ? ", global" : "") + (with == 0 ? ", z only" : ""));
        }
}

// The router's choice, plan, aux counts, coefficients and routing map (moe_route.cu) against their
// oracle (kernels/cpu/moe_route.cpp). The choice on continuous logits is the CPU's (a tie within
// CUDA's exp ulp is vanishingly rare); the plan from the same choice is exact; the probs, sums and
// coefficients to 1e-6 (bf16 probs: one bf16 ulp).
TEST_F(CudaMoe, RouteKernelsMatchTheCpu) {
    const int T = 1031, E = 64, G = 3, mbB = 4;
    const auto logits = randomVec(size_t(T) * E, 41, -4, 4), bias = randomVec(size_t(E), 42, -0.05f, 0.05f);
    struct Mode {
        const char* name;
        cpu::MoeTopKSpec spec;
        bool bias;
    };
    std::vector<Mode> modes;
    const auto add = [&](const char* name, int K, cpu::MoeScore f, bool pre, double scale, int groups, int gk,
                         bool bf16, bool withBias) {
        cpu::MoeTopKSpec s;
        s.K = K;
        s.score = f;
        s.preSoftmax = pre;
        s.scale = scale;
        s.numGroups = groups;
        s.groupTopk = gk;
        s.bf16Probs = bf16;
        modes.push_back({name, s, withBias});
    };
    add("softmax k2", 2, cpu::MoeScore::Softmax, false, 0, 0, 0, false, false);
    add("softmax k8 bf16", 8, cpu::MoeScore::Softmax, false, 0, 0, 0, true, false);
    add("pre-softmax groups", 6, cpu::MoeScore::Softmax, true, 1.5, 8, 3, false, false);
    add("sigmoid bias groups", 8, cpu::MoeScore::Sigmoid, false, 2.5, 8, 4, false, true);
    add("sqrtsoftplus k1", 1, cpu::MoeScore::SqrtSoftplus, false, 0, 0, 0, false, false);
    for (const Mode& m : modes) {
        const int K = m.spec.K;
        const int64_t TK = int64_t(T) * K;
        DeviceVec<float> dlog(logits), dbias(bias), dprobs(static_cast<size_t>(TK));
        DeviceVec<int32_t> dtopi(static_cast<size_t>(TK));
        TS_ASSERT_OK(cuda::moeRouteTopK(dlog.ptr, m.bias ? dbias.ptr : nullptr, nullptr, nullptr, dtopi.ptr,
                                        dprobs.ptr, T, E, m.spec, m_stream));
        sync();
        std::vector<int32_t> topi(static_cast<size_t>(TK));
        std::vector<float> probs(static_cast<size_t>(TK));
        cpu::moeRouteTopK(logits.data(), m.bias ? bias.data() : nullptr, nullptr, nullptr, topi.data(), probs.data(),
                          T, E, m.spec);
        const std::string what = m.name;
        expectEqualInts(dtopi.download(), topi, what + ": choice", {T, K});
        expectClose(dprobs.download(), probs, m.spec.bf16Probs ? 8e-3 : 1e-6, 1e-9, what + ": probs", {T, K});
        // The plan from the CPU's choice, exactly.
        DeviceVec<int32_t> ctopi(topi), off(size_t(E) + 1), tok(static_cast<size_t>(TK)), start(size_t(T) + 1), inv(static_cast<size_t>(TK)),
            tokExp(static_cast<size_t>(TK)), rowOf(static_cast<size_t>(TK));
        DeviceVec<float> cprobs(probs), probT(static_cast<size_t>(TK));
        TS_ASSERT_OK(cuda::moeRoutePlan(ctopi.ptr, cprobs.ptr, T, K, E, cpu::MoeCapacity{}, off.ptr, nullptr, tok.ptr,
                                        start.ptr, inv.ptr, tokExp.ptr, rowOf.ptr, probT.ptr, m_stream));
        sync();
        std::vector<int32_t> hOff(size_t(E) + 1), hTok(static_cast<size_t>(TK)), hStart(size_t(T) + 1), hInv(static_cast<size_t>(TK)),
            hTokExp(static_cast<size_t>(TK)), hRowOf(static_cast<size_t>(TK));
        std::vector<float> hProbT(static_cast<size_t>(TK));
        cpu::moeRoutePlan(topi.data(), probs.data(), T, K, E, cpu::MoeCapacity{}, hOff.data(), nullptr, hTok.data(),
                          hStart.data(), hInv.data(), hTokExp.data(), hRowOf.data(), hProbT.data());
        expectEqualInts(off.download(), hOff, what + ": offsets");
        expectEqualInts(tok.download(), hTok, what + ": tokens");
        expectEqualInts(start.download(), hStart, what + ": starts");
        expectEqualInts(inv.download(), hInv, what + ": inverse");
        expectEqualInts(tokExp.download(), hTokExp, what + ": token-experts");
        expectEqualInts(rowOf.download(), hRowOf, what + ": rows of slots");
        expectSameBits(probT.download(), hProbT, what + ": row probs");
        // The backward's coefficients from the same choice.
        const bool full = m.spec.score == cpu::MoeScore::Softmax && m.spec.preSoftmax;
        DeviceVec<float> da(static_cast<size_t>(TK)), db(static_cast<size_t>(TK)), dc(static_cast<size_t>(TK)), dfull(size_t(T) * E);
        TS_ASSERT_OK(cuda::moeRouterProbsCoefficients(dlog.ptr, ctopi.ptr, T, E, m.spec, false, da.ptr, db.ptr, dc.ptr,
                                                      full ? dfull.ptr : nullptr, m_stream));
        sync();
        std::vector<float> a(static_cast<size_t>(TK)), b(static_cast<size_t>(TK)), c(static_cast<size_t>(TK)), f(size_t(T) * E);
        cpu::moeRouterProbsCoefficients(logits.data(), topi.data(), T, E, m.spec, false, a.data(), b.data(), c.data(),
                                        full ? f.data() : nullptr);
        expectClose(da.download(), a, 1e-6, 1e-12, what + ": a");
        expectClose(db.download(), b, 1e-6, 1e-12, what + ": b");
        expectClose(dc.download(), c, 1e-6, 1e-12, what + ": c");
        if (full) expectClose(dfull.download(), f, 1e-6, 1e-12, what + ": full softmax");
        // The dense routing map of the plan.
        const int64_t TE = int64_t(T) * E;
        DeviceVec<float> dmap(size_t(2 * TE));
        TS_ASSERT_OK(cuda::moeRoutingMap(tokExp.ptr, probT.ptr, int(TK), TE, dmap.ptr, m_stream));
        sync();
        std::vector<float> map(size_t(2 * TE));
        cpu::moeRoutingMap(hTokExp.data(), hProbT.data(), int(TK), TE, map.data());
        expectSameBits(dmap.download(), map, what + ": routing map");
        // The aux counts and statistics (the aux loss's plain top-k of the aux scores).
        DeviceVec<float> dcounts(size_t(G) * E), dtotal(static_cast<size_t>(E)), dstats(size_t(G) * E + 1);
        TS_ASSERT_OK(cuda::moeRouterAuxCounts(dlog.ptr, T, E, K, G, mbB, m.spec.score, dcounts.ptr, dtotal.ptr,
                                              dstats.ptr, m_stream));
        sync();
        std::vector<float> counts(size_t(G) * E), total(static_cast<size_t>(E)), stats(size_t(G) * E + 1);
        cpu::moeRouterAuxCounts(logits.data(), T, E, K, G, mbB, m.spec.score, counts.data(), total.data(), stats.data());
        expectSameBits(dcounts.download(), counts, what + ": aux counts", {G, E});
        expectSameBits(dtotal.download(), total, what + ": aux total");
        expectClose(dstats.download(), stats, 1e-6, 1e-9, what + ": aux statistics");
        // Untraced, as the engine calls it: the counts alone, or only the total (global_aux_loss);
        // and the statistics' chunked sums give the same bits run after run.
        DeviceVec<float> dcounts2(size_t(G) * E), dtotal2(static_cast<size_t>(E)), dstats2(size_t(G) * E + 1);
        TS_ASSERT_OK(cuda::moeRouterAuxCounts(dlog.ptr, T, E, K, G, mbB, m.spec.score, dcounts2.ptr, nullptr, nullptr,
                                              m_stream));
        TS_ASSERT_OK(cuda::moeRouterAuxCounts(dlog.ptr, T, E, K, G, mbB, m.spec.score, nullptr, dtotal2.ptr, nullptr,
                                              m_stream));
        TS_ASSERT_OK(cuda::moeRouterAuxCounts(dlog.ptr, T, E, K, G, mbB, m.spec.score, nullptr, nullptr, dstats2.ptr,
                                              m_stream));
        sync();
        expectSameBits(dcounts2.download(), counts, what + ": aux counts alone", {G, E});
        expectSameBits(dtotal2.download(), total, what + ": aux total alone");
        expectSameBits(dstats2.download(), dstats.download(), what + ": aux statistics again");
    }
}

// The balancing modes (moe_route.cu: moeSinkhorn, moeQbDualUpdate) against their oracle
// (kernels/cpu/moe_balance.cpp), bit for bit: sinkhorn's normalised logits (exp in double, every
// product and sum rounded in the oracle's order); quantile balancing's choice and quantiles, on
// continuous logits and on small integers (ties inside tokens and columns, zeros of both signs);
// then the router's choice and probs from them (moeRouteTopK's sinkhorn and given-choice paths).
// Shapes: more tokens than a block's threads and than one chunk of the column sums, E not a
// multiple of 32, the smallest.
TEST_F(CudaMoe, BalancingKernelsMatchTheCpu) {
    struct Shape {
        int T, E, K;
    };
    for (const Shape& sh : {Shape{611, 12, 2}, Shape{2500, 64, 8}, Shape{3, 2, 1}}) {
        const int T = sh.T, E = sh.E, K = sh.K;
        const int64_t TK = int64_t(T) * K;
        const std::string shape = "T " + std::to_string(T) + " E " + std::to_string(E) + " k " + std::to_string(K);
        for (bool ties : {false, true}) {
            std::vector<float> logits = randomVec(size_t(T) * E, uint32_t(43 + T), -4, 4);
            std::vector<float> beta = randomVec(size_t(E), uint32_t(44 + T), -0.5f, 0.5f);
            if (ties) {
                for (float& v : logits) v = std::round(v);
                for (float& b : beta) b = std::round(4 * b) / 4;
            }
            // Quantile balancing's scores: with ties, infinities and a NaN in the first token too
            // (inf - inf is a NaN whose sign differs between the CPU and the GPU; the keys make
            // every NaN one).
            std::vector<float> scores = logits;
            if (ties && E > 2) {
                const float inf = std::numeric_limits<float>::infinity();
                scores[0] = inf;
                scores[1] = -inf;
                scores[2] = std::numeric_limits<float>::quiet_NaN();
            }
            const std::string what = shape + (ties ? ", ties" : "");
            DeviceVec<float> dlog(logits), dscores(scores), dbeta(beta), dnorm(size_t(T) * E), dq(static_cast<size_t>(E));
            DeviceVec<int32_t> didx(static_cast<size_t>(TK)), dchoice(static_cast<size_t>(TK));
            TS_ASSERT_OK(cuda::moeSinkhorn(dlog.ptr, T, E, dnorm.ptr, 1e-4f, m_stream));
            TS_ASSERT_OK(cuda::moeQbDualUpdate(dscores.ptr, T, E, K, dbeta.ptr, didx.ptr, dq.ptr, m_stream));
            TS_ASSERT_OK(cuda::moeQbDualUpdate(dscores.ptr, T, E, K, dbeta.ptr, dchoice.ptr, nullptr, m_stream));
            sync();
            std::vector<float> norm(size_t(T) * E), q(static_cast<size_t>(E));
            std::vector<int32_t> idx(static_cast<size_t>(TK));
            cpu::moeSinkhorn(logits.data(), T, E, norm.data(), 1e-4f);
            cpu::moeQbDualUpdate(scores.data(), T, E, K, beta.data(), idx.data(), q.data());
            expectSameBits(dnorm.download(), norm, what + ": sinkhorn", {T, E}, &logits);
            expectEqualInts(didx.download(), idx, what + ": quantile balancing's choice", {T, K});
            expectEqualInts(dchoice.download(), idx, what + ": the choice alone", {T, K});
            expectSameBits(dq.download(), q, what + ": quantiles");
            // The router from them: the CPU's sinkhorn and choice on both sides.
            DeviceVec<float> cnorm(norm), dprobs(static_cast<size_t>(TK));
            DeviceVec<int32_t> cidx(idx), dtopi(static_cast<size_t>(TK));
            std::vector<float> probs(static_cast<size_t>(TK));
            std::vector<int32_t> topi(static_cast<size_t>(TK));
            cpu::MoeTopKSpec spec;
            spec.K = K;
            spec.bf16Probs = ties;
            TS_ASSERT_OK(
                cuda::moeRouteTopK(dlog.ptr, nullptr, cnorm.ptr, nullptr, dtopi.ptr, dprobs.ptr, T, E, spec, m_stream));
            sync();
            cpu::moeRouteTopK(logits.data(), nullptr, norm.data(), nullptr, topi.data(), probs.data(), T, E, spec);
            expectEqualInts(dtopi.download(), topi, what + ": sinkhorn's choice", {T, K});
            expectClose(dprobs.download(), probs, ties ? 8e-3 : 1e-6, 1e-9, what + ": sinkhorn's probs", {T, K});
            spec.score = cpu::MoeScore::Sigmoid;
            TS_ASSERT_OK(
                cuda::moeRouteTopK(dlog.ptr, nullptr, nullptr, cidx.ptr, dtopi.ptr, dprobs.ptr, T, E, spec, m_stream));
            sync();
            cpu::moeRouteTopK(logits.data(), nullptr, nullptr, idx.data(), topi.data(), probs.data(), T, E, spec);
            expectEqualInts(dtopi.download(), topi, what + ": a given choice", {T, K});
            expectClose(dprobs.download(), probs, ties ? 8e-3 : 1e-6, 1e-9, what + ": a given choice's probs", {T, K});
        }
    }
}

// The plan at a capacity (moe_route.cu's keep flags, per-expert rows and token index) against the
// oracle, exactly: skewed choices (expert 0 is most tokens' first), probs on a coarse grid (ties by
// token; NaNs in one shape), dropping by prob and by position, padded and not, caps from 0 to
// above T; shapes with fewer and more tokens than the start scan's 1024 threads, E not a multiple
// of 32, k = 1, and no tokens.
TEST_F(CudaMoe, CapacityPlanMatchesTheCpu) {
    struct Shape {
        int T, K, E;
        bool nans;
    };
    for (const Shape& sh : {Shape{777, 4, 16, false}, Shape{2500, 1, 20, false}, Shape{2500, 4, 20, true},
                            Shape{0, 2, 8, false}}) {
        const int T = sh.T, K = sh.K, E = sh.E;
        const int64_t TK = int64_t(T) * K;
        std::vector<int32_t> topi(size_t(std::max<int64_t>(TK, 1)));
        std::vector<float> probs(size_t(std::max<int64_t>(TK, 1)));
        uint32_t x = 12345;
        const auto next = [&] { return x = x * 1664525u + 1013904223u; };
        for (int t = 0; t < T; ++t) {
            std::vector<int> experts(static_cast<size_t>(E));
            for (int e = 0; e < E; ++e) experts[size_t(e)] = e;
            for (int e = E - 1; e > 1; --e) std::swap(experts[size_t(e)], experts[size_t(1 + next() % uint32_t(e))]);
            if (next() % 5 == 0) std::swap(experts[0], experts[size_t(1 + next() % uint32_t(E - 1))]);
            for (int j = 0; j < K; ++j) {
                topi[size_t(t) * K + j] = experts[size_t(j)];
                const uint32_t v = (next() >> 8) % 7;
                probs[size_t(t) * K + j] = sh.nans && v == 6 ? std::numeric_limits<float>::quiet_NaN() : float(v) / 16.f;
            }
        }
        DeviceVec<int32_t> dtopi(topi);
        DeviceVec<float> dprobs(probs);
        for (int cap : {0, 30, 200, 700, 3000})
            for (bool byProb : {true, false})
                for (bool pad : {false, true}) {
                    const std::string what = "T " + std::to_string(T) + " k " + std::to_string(K) + " E " +
                                             std::to_string(E) + ", cap " + std::to_string(cap) +
                                             (byProb ? " by prob" : " by position") + (pad ? ", padded" : "");
                    cpu::MoeCapacity c;
                    c.cap = cap;
                    c.pad = pad;
                    c.byProb = byProb;
                    const size_t rowsMax = size_t(std::max<int64_t>({TK, int64_t(E) * cap, 1}));
                    const size_t slots = size_t(std::max<int64_t>(TK, 1));
                    DeviceVec<int32_t> off(size_t(E) + 1), routed(static_cast<size_t>(E)), tok(rowsMax),
                        start(size_t(T) + 1), inv(rowsMax), tokExp(rowsMax), rowOf(slots);
                    DeviceVec<float> probT(rowsMax);
                    TS_ASSERT_OK(cuda::moeRoutePlan(dtopi.ptr, dprobs.ptr, T, K, E, c, off.ptr, routed.ptr, tok.ptr,
                                                    start.ptr, inv.ptr, tokExp.ptr, rowOf.ptr, probT.ptr, m_stream));
                    sync();
                    std::vector<int32_t> hOff(size_t(E) + 1), hRouted(static_cast<size_t>(E)), hTok(rowsMax),
                        hStart(size_t(T) + 1), hInv(rowsMax), hTokExp(rowsMax), hRowOf(slots);
                    std::vector<float> hProbT(rowsMax);
                    cpu::moeRoutePlan(topi.data(), probs.data(), T, K, E, c, hOff.data(), hRouted.data(), hTok.data(),
                                      hStart.data(), hInv.data(), hTokExp.data(), hRowOf.data(), hProbT.data());
                    expectEqualInts(off.download(), hOff, what + ": offsets");
                    expectEqualInts(routed.download(), hRouted, what + ": routed");
                    expectEqualInts(start.download(), hStart, what + ": starts");
                    const size_t rows = size_t(hOff[size_t(E)]);
                    const auto head = [](std::vector<int32_t> v, size_t n) {
                        v.resize(n);
                        return v;
                    };
                    expectEqualInts(head(rowOf.download(), size_t(TK)), head(hRowOf, size_t(TK)), what + ": rows of slots");
                    expectEqualInts(head(tok.download(), rows), head(hTok, rows), what + ": tokens");
                    expectEqualInts(head(inv.download(), rows), head(hInv, rows), what + ": inverse");
                    expectEqualInts(head(tokExp.download(), rows), head(hTokExp, rows), what + ": token-experts");
                    std::vector<float> gotP = probT.download(), wantP = hProbT;
                    gotP.resize(rows);
                    wantP.resize(rows);
                    expectSameBits(gotP, wantP, what + ": row probs");
                }
    }
}

}  // namespace
}  // namespace ts::kernels

#else
TEST(CudaMoe, Skipped) { GTEST_SKIP() << "built without CUDA"; }
#endif
