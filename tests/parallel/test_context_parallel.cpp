// Context parallelism (REFERENCE.md §4): the load-balanced split against §4.1 computed here, the
// CP attention kernel against full attention (forward rows, dQ rows, dK/dV summed over ranks),
// also with attention dropout, and parallel layouts with CP (with and without dropout, every
// cp_comm_type including the hierarchical a2a+p2p) against the single-device run.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "engine/config/knobs.h"
#include "engine/parallel/context_parallel.h"
#include "engine/parallel/layout.h"
#include "kernels/cpu/ops.h"
#include "tests/parallel/fake_recorder.h"
#include "tests/parallel/parallel_test_util.h"

namespace ts::test {
namespace {

TEST(ContextParallel, SplitKeepsChunksRAnd2cMinus1MinusR) {
    // §4.1: 2c chunks, rank r keeps chunk r then chunk 2c-1-r.
    for (int c : {1, 2, 4}) {
        const int s = 16 * c;
        std::vector<int> owner(size_t(s), -1);
        for (int r = 0; r < c; ++r) {
            const auto pos = engine::cpLocalPositions(s, c, r);
            ASSERT_EQ(pos.size(), size_t(s / c));
            const int chunk = s / (2 * c);
            for (int i = 0; i < chunk; ++i) {
                EXPECT_EQ(pos[size_t(i)], r * chunk + i);
                EXPECT_EQ(pos[size_t(chunk + i)], (2 * c - 1 - r) * chunk + i);
            }
            for (int p : pos) {
                EXPECT_EQ(owner[size_t(p)], -1) << "position " << p << " owned twice";
                owner[size_t(p)] = r;
            }
        }
        for (int p = 0; p < s; ++p) EXPECT_GE(owner[size_t(p)], 0) << "position " << p << " lost";
    }
    // The shard of a sequence-first [s, b] microbatch and its inverse.
    engine::Microbatch full;
    const int s = 8, b = 3, c = 2;
    for (int t = 0; t < s * b; ++t) {
        full.tokens.push_back(t);
        full.labels.push_back(1000 + t);
        full.lossMask.push_back(t % 5 == 0 ? 0.f : 1.f);
    }
    double total = 0;
    for (float w : full.lossMask) total += w;
    std::vector<int> back(size_t(s * b), -1);
    for (int r = 0; r < c; ++r) {
        const engine::Microbatch sh = engine::cpShard(full, s, b, c, r);
        EXPECT_EQ(sh.tokensTotal, total);
        const auto pos = engine::cpLocalPositions(s, c, r);
        for (size_t i = 0; i < pos.size(); ++i)
            for (int bi = 0; bi < b; ++bi) {
                const int t = sh.tokens[i * size_t(b) + size_t(bi)];
                EXPECT_EQ(t, pos[i] * b + bi);
                EXPECT_EQ(sh.labels[i * size_t(b) + size_t(bi)], 1000 + t);
                back[size_t(t)] = t;
            }
    }
    for (int t = 0; t < s * b; ++t) EXPECT_EQ(back[size_t(t)], t);
}

TEST(ContextParallel, AttentionOfEveryRankEqualsFullAttention) {
    namespace k = kernels::cpu;
    const int S = 16, b = 2, nq = 4, ng = 2, d = 8, cp = 2;
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.f, 1.f);
    auto randv = [&](size_t n) {
        std::vector<float> v(n);
        for (auto& x : v) x = nd(rng);
        return v;
    };
    const auto q = randv(size_t(S) * b * nq * d), kk = randv(size_t(S) * b * ng * d), v = randv(size_t(S) * b * ng * d);
    const auto dout = randv(size_t(S) * b * nq * d);
    k::AttnDims ad{S, b, nq, ng, d, 1.0f / std::sqrt(float(d))};
    std::vector<float> probs(k::attentionProbsSize(ad)), out(q.size()), dq(q.size()), dk(kk.size()), dv(v.size()),
        scratch(k::attentionScratchSize(ad));
    k::attentionForward(ad, q.data(), kk.data(), v.data(), probs.data(), out.data(), true);
    k::attentionBackward(ad, q.data(), kk.data(), v.data(), probs.data(), dout.data(), dq.data(), dk.data(), dv.data(),
                         scratch.data(), true);
    std::vector<float> dkSum(dk.size(), 0.f), dvSum(dv.size(), 0.f);
    const size_t qrow = size_t(b) * nq * d;
    for (int r = 0; r < cp; ++r) {
        const auto pos = engine::cpLocalPositions(S, cp, r);
        const int sl = int(pos.size());
        std::vector<float> ql, gl;
        for (int p : pos) {
            ql.insert(ql.end(), q.begin() + long(size_t(p) * qrow), q.begin() + long(size_t(p + 1) * qrow));
            gl.insert(gl.end(), dout.begin() + long(size_t(p) * qrow), dout.begin() + long(size_t(p + 1) * qrow));
        }
        k::CpAttnDims cd{sl, S, b, nq, ng, d, ad.scale};
        std::vector<float> pl(size_t(b) * nq * sl * S), ol(ql.size()), dql(ql.size()), dkg(kk.size()), dvg(v.size());
        k::cpAttentionForward(cd, pos.data(), ql.data(), kk.data(), v.data(), pl.data(), ol.data());
        k::cpAttentionBackward(cd, pos.data(), ql.data(), kk.data(), v.data(), pl.data(), gl.data(), dql.data(),
                               dkg.data(), dvg.data());
        for (int i = 0; i < sl; ++i)
            for (size_t e = 0; e < qrow; ++e) {
                ASSERT_NEAR(ol[size_t(i) * qrow + e], out[size_t(pos[size_t(i)]) * qrow + e], 1e-5) << "rank " << r;
                ASSERT_NEAR(dql[size_t(i) * qrow + e], dq[size_t(pos[size_t(i)]) * qrow + e], 1e-5) << "rank " << r;
            }
        for (size_t i = 0; i < dk.size(); ++i) {
            dkSum[i] += dkg[i];
            dvSum[i] += dvg[i];
        }
    }
    for (size_t i = 0; i < dk.size(); ++i) {
        ASSERT_NEAR(dkSum[i], dk[i], 1e-5) << i;
        ASSERT_NEAR(dvSum[i], dv[i], 1e-5) << i;
    }
}

// Rows `pos` of a [S, row] tensor.
std::vector<float> rowsAt(const std::vector<float>& src, const std::vector<int>& pos, size_t row) {
    std::vector<float> o;
    for (int p : pos) o.insert(o.end(), src.begin() + long(size_t(p) * row), src.begin() + long(size_t(p + 1) * row));
    return o;
}

// CP rank r's ring attention (p2p) on its rows `pos` (queries ql, output gradients gl), with the
// K/V blocks merged in the order the ring delivers them (its own first, then ranks r-1, r-2, ...)
// and the backward from the final out/lse only: returns its out and dQ rows, and adds each
// block's dK/dV at the block's global positions into dkSum/dvSum.
std::pair<std::vector<float>, std::vector<float>> ringRankInRingOrder(
    const kernels::cpu::CpAttnDims& cd, int S, int cp, int r, const std::vector<int>& pos, const std::vector<float>& ql,
    const std::vector<float>& gl, const std::vector<float>& kk, const std::vector<float>& v, size_t kvrow,
    std::vector<float>& dkSum, std::vector<float>& dvSum) {
    namespace k = kernels::cpu;
    std::vector<float> ol(ql.size()), lse(size_t(cd.b) * cd.nq * cd.sq), delta(lse.size()), dql(ql.size(), 0.f);
    for (int i = 0; i < cp; ++i) {
        const auto kp = engine::cpLocalPositions(S, cp, (r - i + cp) % cp);
        const auto kl = rowsAt(kk, kp, kvrow), vl = rowsAt(v, kp, kvrow);
        k::cpRingAttentionForward(cd, pos.data(), kp.data(), ql.data(), kl.data(), vl.data(), ol.data(), lse.data(),
                                  i == 0);
    }
    k::cpRingAttentionDelta(cd, ol.data(), gl.data(), delta.data());
    for (int i = 0; i < cp; ++i) {
        const auto kp = engine::cpLocalPositions(S, cp, (r - i + cp) % cp);
        const auto kl = rowsAt(kk, kp, kvrow), vl = rowsAt(v, kp, kvrow);
        std::vector<float> dkl(kl.size()), dvl(vl.size());
        k::cpRingAttentionBackward(cd, pos.data(), kp.data(), ql.data(), kl.data(), vl.data(), lse.data(), delta.data(),
                                   gl.data(), dql.data(), dkl.data(), dvl.data());
        for (size_t j = 0; j < kp.size(); ++j)
            for (size_t e = 0; e < kvrow; ++e) {
                dkSum[size_t(kp[j]) * kvrow + e] += dkl[j * kvrow + e];
                dvSum[size_t(kp[j]) * kvrow + e] += dvl[j * kvrow + e];
            }
    }
    return {std::move(ol), std::move(dql)};
}

// Ring attention (p2p): each rank merges the blocks in the order the ring delivers them (own block
// first, then ranks r-1, r-2, ...), the backward uses only the final out/lse; the result must equal
// full attention for every rank's rows, for c = 2 and 4 (every section kind: diagonal, the
// lower and upper halves of the load-balanced split), and the dK/dV of every block summed over the
// ranks that computed it must equal the full dK/dV.
TEST(ContextParallel, RingBlocksMergedEqualFullAttention) {
    namespace k = kernels::cpu;
    for (int cp : {2, 4}) {
        const int S = 8 * cp, b = 2, nq = 4, ng = 2, d = 8;
        std::mt19937 rng(11 + cp);
        std::normal_distribution<float> nd(0.f, 1.f);
        auto randv = [&](size_t n) {
            std::vector<float> v(n);
            for (auto& x : v) x = nd(rng);
            return v;
        };
        const auto q = randv(size_t(S) * b * nq * d), kk = randv(size_t(S) * b * ng * d),
                   v = randv(size_t(S) * b * ng * d), dout = randv(size_t(S) * b * nq * d);
        k::AttnDims ad{S, b, nq, ng, d, 1.0f / std::sqrt(float(d))};
        std::vector<float> probs(k::attentionProbsSize(ad)), out(q.size()), dq(q.size()), dk(kk.size()),
            dv(v.size()), scratch(k::attentionScratchSize(ad));
        k::attentionForward(ad, q.data(), kk.data(), v.data(), probs.data(), out.data(), true);
        k::attentionBackward(ad, q.data(), kk.data(), v.data(), probs.data(), dout.data(), dq.data(), dk.data(),
                             dv.data(), scratch.data(), true);
        const size_t qrow = size_t(b) * nq * d, kvrow = size_t(b) * ng * d;
        std::vector<float> dkSum(dk.size(), 0.f), dvSum(dv.size(), 0.f);
        for (int r = 0; r < cp; ++r) {
            const auto pos = engine::cpLocalPositions(S, cp, r);
            const int sl = int(pos.size());
            const auto ql = rowsAt(q, pos, qrow), gl = rowsAt(dout, pos, qrow);
            const k::CpAttnDims cd{sl, sl, b, nq, ng, d, ad.scale};
            const auto [ol, dql] = ringRankInRingOrder(cd, S, cp, r, pos, ql, gl, kk, v, kvrow, dkSum, dvSum);
            for (int i = 0; i < sl; ++i)
                for (size_t e = 0; e < qrow; ++e) {
                    ASSERT_NEAR(ol[size_t(i) * qrow + e], out[size_t(pos[size_t(i)]) * qrow + e], 1e-5)
                        << "cp " << cp << " rank " << r;
                    ASSERT_NEAR(dql[size_t(i) * qrow + e], dq[size_t(pos[size_t(i)]) * qrow + e], 1e-5)
                        << "cp " << cp << " rank " << r;
                }
        }
        for (size_t i = 0; i < dk.size(); ++i) {
            ASSERT_NEAR(dkSum[i], dk[i], 1e-5) << "cp " << cp << " " << i;
            ASSERT_NEAR(dvSum[i], dv[i], 1e-5) << "cp " << cp << " " << i;
        }
    }
}

// Attention dropout with CP: the ring blocks (p2p) and the all-gather kernel draw the mask of
// each (head, query, key) from global positions, so with the same seed they equal the
// single-device dropout(softmax(S)) V and its backward, for c = 2 and 4; this rank's heads are
// heads 4..7 of 8 (a TP rank's head offset) to check the head numbering too.
TEST(ContextParallel, RingAndAllGatherWithDropoutEqualFullAttentionWithDropout) {
    namespace k = kernels::cpu;
    for (int cp : {2, 4}) {
        const int S = 8 * cp, b = 2, nq = 4, ng = 2, d = 8;
        std::mt19937 rng(29 + cp);
        std::normal_distribution<float> nd(0.f, 1.f);
        auto randv = [&](size_t n) {
            std::vector<float> v(n);
            for (auto& x : v) x = nd(rng);
            return v;
        };
        const auto q = randv(size_t(S) * b * nq * d), kk = randv(size_t(S) * b * ng * d),
                   v = randv(size_t(S) * b * ng * d), dout = randv(size_t(S) * b * nq * d);
        k::AttnDims ad{S, b, nq, ng, d, 1.0f / std::sqrt(float(d))};
        ad.dropout = 0.3f;
        ad.dropoutSeed = 4242;
        ad.headOffset = 4;
        ad.nqTotal = 8;
        std::vector<float> probs(k::attentionProbsSize(ad)), out(q.size()), dq(q.size()), dk(kk.size()),
            dv(v.size()), scratch(k::attentionScratchSize(ad)), outNoDrop(q.size());
        k::attentionForward(ad, q.data(), kk.data(), v.data(), probs.data(), out.data(), true);
        k::attentionBackward(ad, q.data(), kk.data(), v.data(), probs.data(), dout.data(), dq.data(), dk.data(),
                             dv.data(), scratch.data(), true);
        {
            k::AttnDims plain = ad;
            plain.dropout = 0;
            std::vector<float> pr(probs.size());
            k::attentionForward(plain, q.data(), kk.data(), v.data(), pr.data(), outNoDrop.data(), true);
            double diff = 0;
            for (size_t i = 0; i < out.size(); ++i) diff = std::max(diff, double(std::fabs(out[i] - outNoDrop[i])));
            ASSERT_GT(diff, 0.1) << "dropout did not change the reference output";
        }
        const size_t qrow = size_t(b) * nq * d, kvrow = size_t(b) * ng * d;
        auto withDropout = [&](k::CpAttnDims cd) {
            cd.dropout = ad.dropout;
            cd.dropoutSeed = ad.dropoutSeed;
            cd.headOffset = ad.headOffset;
            cd.nqTotal = ad.nqTotal;
            cd.sTotal = S;
            return cd;
        };
        std::vector<float> dkRing(dk.size(), 0.f), dvRing(dv.size(), 0.f), dkAg(dk.size(), 0.f),
            dvAg(dv.size(), 0.f);
        for (int r = 0; r < cp; ++r) {
            const auto pos = engine::cpLocalPositions(S, cp, r);
            const int sl = int(pos.size());
            const auto ql = rowsAt(q, pos, qrow), gl = rowsAt(dout, pos, qrow);
            // p2p: blocks in ring order
            const k::CpAttnDims cd = withDropout({sl, sl, b, nq, ng, d, ad.scale});
            const auto [ol, dql] = ringRankInRingOrder(cd, S, cp, r, pos, ql, gl, kk, v, kvrow, dkRing, dvRing);
            // all_gather: the whole sequence's K/V at once
            const k::CpAttnDims ca = withDropout({sl, S, b, nq, ng, d, ad.scale});
            std::vector<float> pl(size_t(b) * nq * sl * S), oa(ql.size()), dqa(ql.size()), dkg(kk.size()),
                dvg(v.size());
            k::cpAttentionForward(ca, pos.data(), ql.data(), kk.data(), v.data(), pl.data(), oa.data());
            k::cpAttentionBackward(ca, pos.data(), ql.data(), kk.data(), v.data(), pl.data(), gl.data(), dqa.data(),
                                   dkg.data(), dvg.data());
            for (size_t i = 0; i < dk.size(); ++i) {
                dkAg[i] += dkg[i];
                dvAg[i] += dvg[i];
            }
            for (int i = 0; i < sl; ++i)
                for (size_t e = 0; e < qrow; ++e) {
                    const size_t g = size_t(pos[size_t(i)]) * qrow + e, l = size_t(i) * qrow + e;
                    ASSERT_NEAR(ol[l], out[g], 1e-5) << "p2p cp " << cp << " rank " << r;
                    ASSERT_NEAR(dql[l], dq[g], 1e-5) << "p2p cp " << cp << " rank " << r;
                    ASSERT_NEAR(oa[l], out[g], 1e-5) << "all_gather cp " << cp << " rank " << r;
                    ASSERT_NEAR(dqa[l], dq[g], 1e-5) << "all_gather cp " << cp << " rank " << r;
                }
        }
        for (size_t i = 0; i < dk.size(); ++i) {
            ASSERT_NEAR(dkRing[i], dk[i], 1e-5) << "p2p cp " << cp << " " << i;
            ASSERT_NEAR(dvRing[i], dv[i], 1e-5) << "p2p cp " << cp << " " << i;
            ASSERT_NEAR(dkAg[i], dk[i], 1e-5) << "all_gather cp " << cp << " " << i;
            ASSERT_NEAR(dvAg[i], dv[i], 1e-5) << "all_gather cp " << cp << " " << i;
        }
    }
}

TEST(ContextParallel, RingBlockWithNoVisibleKeyLeavesRowsUntouched) {
    namespace k = kernels::cpu;
    // Rank 0 of c=2 holds positions 0-1 and 6-7; rank 1's block (2-3, 4-5) is invisible to rows
    // 0-1 and fully visible to rows 6-7.
    const int S = 8, cp = 2, b = 1, nq = 1, ng = 1, d = 2;
    const auto pos = engine::cpLocalPositions(S, cp, 0), kp = engine::cpLocalPositions(S, cp, 1);
    const k::CpAttnDims cd{4, 4, b, nq, ng, d, 1.0f};
    const std::vector<float> q(8, 0.5f), kv(8, 0.25f);
    std::vector<float> out(8, 0.f), lse(4, 0.f);
    k::cpRingAttentionForward(cd, pos.data(), kp.data(), q.data(), kv.data(), kv.data(), out.data(), lse.data(), true);
    EXPECT_EQ(lse[0], -INFINITY);
    EXPECT_EQ(lse[1], -INFINITY);
    EXPECT_EQ(out[0], 0.f);
    // Rows 2-3 (positions 6-7) see 4 equal scores 0.5*0.25*2 = 0.25: lse = 0.25 + log 4, out = v.
    EXPECT_NEAR(lse[2], 0.25 + std::log(4.0), 1e-6);
    EXPECT_NEAR(out[4], 0.25f, 1e-7);
}

struct CpLayout {
    const char* name;
    const char* comm;  // cp_comm_type
    int tp, cp, pp, vpp, dp;
    bool sp, distOpt;
    const char* recompute;
    const char* attention;  // attention_backend: auto (flash) or unfused (probabilities kept)
};
class ContextParallelLayouts : public ::testing::TestWithParam<CpLayout> {};

TEST_P(ContextParallelLayouts, EqualSingleDevice) {
    const CpLayout L = GetParam();
    engine::Config c = withLayout(tinyConfig(2), Layout{L.tp, L.pp, L.vpp, L.dp, 2});
    c.context_parallel_size = L.cp;
    c.cp_comm_type = L.comm;
    c.sequence_parallel = L.sp;
    c.use_distributed_optimizer = L.distOpt;
    if (L.vpp > 1) c.overlap_p2p_comm = true;
    c.recompute_granularity = L.recompute;
    c.attention_backend = L.attention;
    // The attention key bias's gradient is 0 in exact arithmetic (softmax ignores a shift of all
    // keys); with CP its dK is summed over the CP ranks in another order, so its fp32 noise differs
    // and Adam turns noise into updates of up to lr*noise/eps. A larger eps than tinyConfig's
    // keeps that noise below the comparison's 1e-5 while every real gradient (|g| >> eps) still
    // gets the sign-like Adam update.
    c.adam_eps = 1e-5;
    if (std::string(L.recompute) == "full") {
        c.recompute_method = "uniform";
        c.recompute_num_layers = 1;
    }
    const RunResult ref = runSingle(singleDevice(c), 3);
    auto par = runParallel(c, 3);
    ASSERT_TRUE(par.isOk()) << par.status().toString();
    expectSame(*par, ref, 1e-5, L.name);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, ContextParallelLayouts,
    ::testing::Values(CpLayout{"cp2", "all_gather", 1, 2, 1, 1, 1, false, false, "", "auto"},
                      CpLayout{"cp4_selective", "all_gather", 1, 4, 1, 1, 1, false, false, "selective", "auto"},
                      CpLayout{"tp2_cp2_sp", "all_gather", 2, 2, 1, 1, 1, true, false, "", "auto"},
                      CpLayout{"cp2_dp2_distopt", "all_gather", 1, 2, 1, 1, 2, false, true, "", "auto"},
                      CpLayout{"cp2_pp2_vpp2_full", "all_gather", 1, 2, 2, 2, 1, false, false, "full", "auto"},
                      CpLayout{"tp2_cp2_dp2", "all_gather", 2, 2, 1, 1, 2, true, true, "", "auto"},
                      CpLayout{"p2p_cp2", "p2p", 1, 2, 1, 1, 1, false, false, "", "auto"},
                      CpLayout{"p2p_cp4_selective", "p2p", 1, 4, 1, 1, 1, false, false, "selective", "auto"},
                      CpLayout{"p2p_tp2_cp2_dp2", "p2p", 2, 2, 1, 1, 2, true, true, "", "auto"},
                      CpLayout{"p2p_cp2_pp2_vpp2_full", "p2p", 1, 2, 2, 2, 1, false, false, "full", "auto"},
                      CpLayout{"a2a_cp2", "a2a", 1, 2, 1, 1, 1, false, false, "", "auto"},
                      CpLayout{"a2a_cp4_selective", "a2a", 1, 4, 1, 1, 1, false, false, "selective", "auto"},
                      CpLayout{"a2a_tp2_cp2_dp2", "a2a", 2, 2, 1, 1, 2, true, true, "", "auto"},
                      CpLayout{"a2a_cp2_pp2_vpp2_full", "a2a", 1, 2, 2, 2, 1, false, false, "full", "auto"},
                      // the probabilities kept (and dropped by selective recompute)
                      CpLayout{"cp2_unfused", "all_gather", 1, 2, 1, 1, 1, false, false, "", "unfused"},
                      CpLayout{"cp4_selective_unfused", "all_gather", 1, 4, 1, 1, 1, false, false, "selective", "unfused"},
                      CpLayout{"a2a_cp2_selective_unfused", "a2a", 1, 2, 1, 1, 1, false, false, "selective", "unfused"}),
    [](const auto& info) { return std::string(info.param.name); });

// tp_comm_overlap works on the CP-local rows like any other: tp2·cp2 with the overlapped SP
// collectives and ring attention equals the single device.
TEST(ContextParallel, TpCommOverlapWithRingAttentionEqualsSingleDevice) {
    engine::Config c = withLayout(tinyConfig(2), Layout{2, 1, 1, 1, 2});
    c.context_parallel_size = 2;
    c.cp_comm_type = "p2p";
    c.sequence_parallel = true;
    c.tp_comm_overlap = true;
    c.adam_eps = 1e-5;
    const RunResult ref = runSingle(singleDevice(c), 3);
    auto par = runParallel(c, 3);
    ASSERT_TRUE(par.isOk()) << par.status().toString();
    expectSame(*par, ref, 1e-5, "tp2 cp2 p2p tp_comm_overlap");
}

// Megatron's default learned_absolute position embedding: each CP rank adds (and, backward,
// accumulates into) the table rows of its chunks' global positions.
TEST(ContextParallel, LearnedAbsolutePositionsEqualSingleDevice) {
    for (const char* comm : {"p2p", "all_gather", "a2a"}) {
        engine::Config c = withLayout(tinyConfig(2), Layout{1, 1, 1, 2, 2});
        c.position_embedding_type = "learned_absolute";
        c.context_parallel_size = 2;
        c.cp_comm_type = comm;
        c.adam_eps = 1e-5;
        const RunResult ref = runSingle(singleDevice(c), 3);
        auto par = runParallel(c, 3);
        ASSERT_TRUE(par.isOk()) << par.status().toString();
        expectSame(*par, ref, 1e-5, std::string("learned_absolute cp2 dp2 ") + comm);
    }
}

TEST(ContextParallel, CheckpointOfCp2Dp2ResumesOnOneDevice) {
    engine::Config c = withLayout(tinyConfig(2), Layout{1, 1, 1, 2, 2});
    c.context_parallel_size = 2;
    c.cp_comm_type = "all_gather";
    c.use_distributed_optimizer = true;  // the Adam state is sharded over dp-cp
    c.adam_eps = 1e-5;
    expectCheckpointResumesOnOneDevice(c, "cp2_dp2");
    // The ring variant saves the same state.
    c.cp_comm_type = "p2p";
    expectCheckpointResumesOnOneDevice(c, "cp2_dp2_p2p");
}

// Dropout with CP (Megatron's defaults: hidden_dropout 0.1, attention_dropout 0.1): every mask
// element is a function of its global position (token, head, key), so each cp_comm_type, at
// cp 2 and 4, with TP+SP, DP, recompute, equals the cp=1 run with the same seed.
struct CpDropoutLayout {
    const char* name;
    const char* comm;
    int tp, cp, dp;
    const char* recompute;
};
class ContextParallelDropout : public ::testing::TestWithParam<CpDropoutLayout> {};

engine::Config cpDropoutConfig(const CpDropoutLayout& L) {
    engine::Config c = withLayout(tinyConfig(2), Layout{L.tp, 1, 1, L.dp, 2});
    c.context_parallel_size = L.cp;
    c.cp_comm_type = L.comm;
    c.sequence_parallel = L.tp > 1;
    c.hidden_dropout = 0.1;
    c.attention_dropout = 0.1;
    c.adam_eps = 1e-5;  // see ContextParallelLayouts
    c.recompute_granularity = L.recompute;
    if (std::string(L.recompute) == "full") {
        c.recompute_method = "uniform";
        c.recompute_num_layers = 1;
    }
    return c;
}

TEST_P(ContextParallelDropout, EqualsTheCp1RunWithDropout) {
    const CpDropoutLayout L = GetParam();
    const engine::Config c = cpDropoutConfig(L);
    const RunResult ref = runSingle(singleDevice(c), 3);
    auto par = runParallel(c, 3);
    ASSERT_TRUE(par.isOk()) << par.status().toString();
    expectSame(*par, ref, 1e-5, L.name);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, ContextParallelDropout,
    ::testing::Values(CpDropoutLayout{"p2p_cp2", "p2p", 1, 2, 1, ""},
                      CpDropoutLayout{"p2p_cp4", "p2p", 1, 4, 1, ""},
                      CpDropoutLayout{"all_gather_cp2", "all_gather", 1, 2, 1, ""},
                      CpDropoutLayout{"all_gather_cp4_selective", "all_gather", 1, 4, 1, "selective"},
                      CpDropoutLayout{"a2a_cp2", "a2a", 1, 2, 1, ""},
                      CpDropoutLayout{"a2a_cp4_selective", "a2a", 1, 4, 1, "selective"},
                      CpDropoutLayout{"p2p_tp2_cp2_sp", "p2p", 2, 2, 1, ""},
                      CpDropoutLayout{"all_gather_tp2_cp2_sp", "all_gather", 2, 2, 1, ""},
                      CpDropoutLayout{"a2a_tp2_cp2_sp", "a2a", 2, 2, 1, ""},
                      CpDropoutLayout{"p2p_cp2_dp2_full", "p2p", 1, 2, 2, "full"}),
    [](const auto& info) { return std::string(info.param.name); });

// The equality above is not vacuous: each dropout on its own (hidden, attention) changes the
// CP run's loss and weights far beyond the 1e-5 of the comparison, and the run with it still
// equals the cp=1 run with it.
TEST(ContextParallel, DropoutChangesTheRun) {
    engine::Config base = cpDropoutConfig({"", "p2p", 1, 2, 1, ""});
    base.hidden_dropout = base.attention_dropout = 0;
    auto none = runParallel(base, 3);
    ASSERT_TRUE(none.isOk()) << none.status().toString();
    for (const char* which : {"hidden", "attention"}) {
        engine::Config c = base;
        (std::string(which) == "hidden" ? c.hidden_dropout : c.attention_dropout) = 0.1;
        auto par = runParallel(c, 3);
        ASSERT_TRUE(par.isOk()) << par.status().toString();
        // measured: hidden 1.4e-3, attention 4.9e-5 relative in the first step (2 layers, p 0.1)
        EXPECT_GT(std::fabs(par->losses[0] - none->losses[0]), 2e-5 * std::fabs(none->losses[0]))
            << which << " dropout did not change the loss";
        double maxRel = 0;
        for (const auto& [name, w] : none->params) maxRel = std::max(maxRel, relError(par->params.at(name), w));
        EXPECT_GT(maxRel, 1e-3) << which << " dropout did not change the weights";
        // weights: as the TP dropout layouts (test_parallel_trainer.cpp), Adam on a zero-initialised
        // bias whose gradient nearly cancels (measured 1.4e-5 on one, the rest well below 1e-5)
        expectSame(*par, runSingle(singleDevice(c), 3), 1e-5, std::string(which) + " dropout cp2", 5e-5);
    }
}

TEST(ContextParallel, WhatIsNotExecutedIsNamed) {
    // a2a scatters heads: 4 heads over cp 8 cannot be split.
    engine::Config a = withLayout(tinyConfig(2), Layout{1, 1, 1, 1, 2});
    a.seq_length = 32;
    a.context_parallel_size = 8;
    a.cp_comm_type = "a2a";
    auto w = engine::ParallelTrainer::create(a);
    ASSERT_FALSE(w.isOk());
    EXPECT_NE(w.status().message().find("num_attention_heads=4"), std::string::npos) << w.status().message();
    EXPECT_NE(w.status().message().find("use p2p or all_gather"), std::string::npos) << w.status().message();
}

// Hierarchical CP (cp_comm_type=a2a+p2p, hierarchical_context_parallel_sizes [a, p]): an
// all-to-all over "hcp-a2a", ring attention over "hcp-p2p", all-to-all back. Every layout, with
// and without dropout, equals the cp=1 run; [4, 1] and [1, 4] are TE's fallbacks to a2a / p2p
// over the sub-group.
struct HcpLayout {
    const char* name;
    int tp, cp, pp, dp, a2a, p2p;
    const char* recompute;
    bool dropout = false, distOpt = false;
};
class HierarchicalContextParallel : public ::testing::TestWithParam<HcpLayout> {};

engine::Config hcpConfig(const HcpLayout& L) {
    engine::Config c = withLayout(tinyConfig(2), Layout{L.tp, L.pp, 1, L.dp, 2});
    c.context_parallel_size = L.cp;
    c.cp_comm_type = "a2a+p2p";
    c.hierarchical_context_parallel_sizes = {L.a2a, L.p2p};
    c.sequence_parallel = L.tp > 1;
    c.use_distributed_optimizer = L.distOpt;
    c.adam_eps = 1e-5;  // see ContextParallelLayouts
    c.recompute_granularity = L.recompute;
    if (std::string(L.recompute) == "full") {
        c.recompute_method = "uniform";
        c.recompute_num_layers = 1;
    }
    if (L.dropout) c.hidden_dropout = c.attention_dropout = 0.1;
    return c;
}

TEST_P(HierarchicalContextParallel, EqualsSingleDevice) {
    const HcpLayout L = GetParam();
    const engine::Config c = hcpConfig(L);
    const RunResult ref = runSingle(singleDevice(c), 3);
    auto par = runParallel(c, 3);
    ASSERT_TRUE(par.isOk()) << par.status().toString();
    expectSame(*par, ref, 1e-5, L.name);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, HierarchicalContextParallel,
    ::testing::Values(HcpLayout{"cp4_2x2", 1, 4, 1, 1, 2, 2, ""},
                      HcpLayout{"cp4_2x2_selective", 1, 4, 1, 1, 2, 2, "selective"},
                      HcpLayout{"cp4_4x1", 1, 4, 1, 1, 4, 1, ""},
                      HcpLayout{"cp4_1x4", 1, 4, 1, 1, 1, 4, ""},
                      HcpLayout{"cp2_2x1", 1, 2, 1, 1, 2, 1, ""},
                      HcpLayout{"tp2_cp4_2x2_sp", 2, 4, 1, 1, 2, 2, ""},
                      HcpLayout{"cp4_2x2_pp2_full", 1, 4, 2, 1, 2, 2, "full"},
                      HcpLayout{"cp2_2x1_dp2_distopt", 1, 2, 1, 2, 2, 1, "", false, true},
                      HcpLayout{"cp4_2x2_dropout", 1, 4, 1, 1, 2, 2, "", true},
                      HcpLayout{"cp4_1x4_dropout_selective", 1, 4, 1, 1, 1, 4, "selective", true},
                      HcpLayout{"tp2_cp4_2x2_sp_dropout", 2, 4, 1, 1, 2, 2, "", true}),
    [](const auto& info) { return std::string(info.param.name); });

// The groups follow Megatron's create_hierarchical_groups over each CP group (a2a level: CP
// ranks consecutive in the cp index; p2p level: every a2a-th), and the run's traffic is on them:
// the all-to-alls on "hcp-a2a" (compute stream), the ring's blocks on "hcp-p2p" (the CP comm
// stream), none on "cp" in attention.
TEST(ContextParallel, HierarchicalGroupsAndTheirTraffic) {
    engine::ParallelSizes s;
    s.tp = 2;
    s.cp = 4;
    s.world = 8;
    s.hcpA2a = 2;
    auto l = engine::ParallelLayout::create(s);
    ASSERT_TRUE(l.isOk()) << l.status().toString();
    using Groups = std::vector<std::vector<int>>;
    EXPECT_EQ(l->allGroups("cp"), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
    EXPECT_EQ(l->allGroups("hcp-a2a"), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
    EXPECT_EQ(l->allGroups("hcp-p2p"), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
    s.hcpA2a = 3;
    EXPECT_FALSE(engine::ParallelLayout::create(s).isOk());
    s.hcpA2a = 0;
    EXPECT_TRUE(l->groupRanks("hcp-a2a", 0).size() == 2);
    EXPECT_TRUE(engine::ParallelLayout::create(s)->groupRanks("hcp-a2a", 0).empty());

    const engine::Config c = hcpConfig({"", 1, 4, 1, 1, 2, 2, ""});
    FakeRecorder rec;
    auto par = runParallel(c, 1, &rec);
    ASSERT_TRUE(par.isOk()) << par.status().toString();
    int a2aCompute = 0, a2aElsewhere = 0, p2pCpComm = 0, p2pElsewhere = 0, cpTraffic = 0;
    for (const auto& sl : rec.slices) {
        const trace::TrackDesc& t = rec.trackDesc(sl.track);
        if (t.kind == trace::TrackKind::HostThread || sl.bytes == 0) continue;
        const std::string g = rec.str(sl.group);
        const bool compute = t.kind == trace::TrackKind::Compute;
        const bool cpComm = t.name.find("cp_comm") != std::string::npos;
        if (g == "hcp-a2a") ++(compute ? a2aCompute : a2aElsewhere);
        if (g == "hcp-p2p") ++(cpComm ? p2pCpComm : p2pElsewhere);
        if (g == "cp") ++cpTraffic;
    }
    EXPECT_GT(a2aCompute, 0);
    EXPECT_EQ(a2aElsewhere, 0) << "all-to-alls off the compute stream";
    EXPECT_GT(p2pCpComm, 0);
    EXPECT_EQ(p2pElsewhere, 0) << "ring blocks off the CP comm stream";
    EXPECT_EQ(cpTraffic, 0) << "attention traffic on \"cp\"";
}

TEST(ContextParallel, CheckpointOfHierarchicalCpResumesOnOneDevice) {
    engine::Config c = hcpConfig({"", 1, 4, 1, 1, 2, 2, ""});
    expectCheckpointResumesOnOneDevice(c, "cp4_a2a_p2p");
}

TEST(ContextParallel, HierarchicalRefusalsAreNamed) {
    auto refused = [](const engine::Config& c, const std::string& needle) {
        auto w = engine::ParallelTrainer::create(c);
        ASSERT_FALSE(w.isOk()) << needle;
        EXPECT_NE(w.status().message().find(needle), std::string::npos) << w.status().message();
    };
    engine::Config c = hcpConfig({"", 1, 4, 1, 1, 2, 2, ""});
    c.hierarchical_context_parallel_sizes = {};
    refused(c, "cp_comm_type=a2a+p2p needs hierarchical_context_parallel_sizes");
    c.hierarchical_context_parallel_sizes = {2, 3};
    refused(c, "multiplies to 6, not context_parallel_size=4");
    // Transformer Engine's a2a+p2p takes exactly two groups; other cp_comm_types do not use the
    // levels (Megatron builds them regardless), so three are accepted there.
    c.hierarchical_context_parallel_sizes = {2, 1, 2};
    refused(c, "takes two levels of hierarchical_context_parallel_sizes");
    c.cp_comm_type = "p2p";
    {
        auto w = engine::ParallelTrainer::create(c);
        EXPECT_TRUE(w.isOk()) << w.status().toString();
    }
    c.cp_comm_type = "a2a+p2p";
    // 4 heads over tp 2 x a2a 4 cannot be split.
    c = hcpConfig({"", 2, 4, 1, 1, 4, 1, ""});
    refused(c, "tensor_model_parallel_size x hierarchical_context_parallel_sizes[0] = 8");
    // The knob takes positive integers only.
    const engine::KnobDef* k = engine::findKnob("hierarchical_context_parallel_sizes");
    ASSERT_NE(k, nullptr);
    engine::Config d;
    EXPECT_NE(k->set(d, nlohmann::json::array({2, 0})), "");
    EXPECT_NE(k->set(d, nlohmann::json("2,2")), "");
    EXPECT_EQ(k->set(d, nlohmann::json::array({2, 2})), "");
    EXPECT_EQ(d.hierarchical_context_parallel_sizes, (std::vector<int>{2, 2}));
}

}  // namespace
}  // namespace ts::test
