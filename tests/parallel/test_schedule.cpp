// Pipeline schedules: compute order against an independent re-implementation of Megatron's
// loops (FIFO lists, as schedules.py keeps them), hand-derived paper examples, constraint
// messages, and a whole-pipeline simulation that executes every rank's op list with batched
// p2p semantics: no deadlock, every transfer matches (same microbatch/chunk on both ends),
// nothing is sent before it is computed, and stage k's forward of a microbatch comes after
// stage k-1's.
#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "engine/parallel/schedule.h"

using namespace ts;
using namespace ts::engine;

namespace {

struct C {  // compute op as the reference sees it
    char kind;
    int mb, chunk;
    bool operator==(const C&) const = default;
};

std::string str(const std::vector<C>& ops) {
    std::string s;
    for (auto& o : ops) s += std::string(s.empty() ? "" : " ") + o.kind + std::to_string(o.mb) + ".c" + std::to_string(o.chunk);
    return s;
}

std::vector<C> computeOf(const PipelineSchedule& s) {
    std::vector<C> out;
    for (auto& op : s.computeOps()) out.push_back({op.kind == PipeOpKind::Forward ? 'F' : 'B', op.microbatch, op.chunk});
    return out;
}

PipelineSchedule build(int pp, int vpp, int m, int rank, int g = 0) {
    auto s = buildSchedule({.pp = pp, .vpp = vpp, .microbatches = m, .rank = rank, .microbatchGroupSize = g});
    EXPECT_TRUE(s.isOk()) << s.status().toString();
    return s.value();
}

// --- independent reference: Megatron's loops with FIFO lists -----------------------------------

// Table by formula instead of loops: groups of g microbatches (last one may be shorter s),
// inside a group all chunks in order, each over the group's microbatches.
std::pair<int, int> tableAt(int k, int m, int v, int g) {
    int lo = 0;
    for (;;) {
        const int size = std::min(g, m - lo);
        if (k < size * v) return {lo + k % size, k / size};
        k -= size * v;
        lo += size;
    }
}

int refWarmup(int p, int v, int m, int r, int g) {
    if (v == 1) return std::min(p - r - 1, m);
    return std::min((p - r - 1) * 2 + (v - 1) * g, m * v);
}

std::vector<C> reference(int p, int v, int m, int r, int g) {
    if (g == 0) g = p;
    std::vector<C> out;
    const int total = m * v;
    const int W = p == 1 ? 0 : refWarmup(p, v, m, r, g);
    std::vector<std::deque<int>> outputs(static_cast<size_t>(v));  // per chunk: microbatches forwarded, not yet backwarded
    auto fwd = [&](int k) {
        auto [mb, c] = v == 1 ? std::pair<int, int>{k, 0} : tableAt(k, m, v, g);
        outputs[size_t(c)].push_back(mb);
        out.push_back({'F', mb, c});
    };
    auto bwd = [&](int k) {
        const int c = v == 1 ? 0 : v - 1 - tableAt(k, m, v, g).second;
        const int mb = outputs[size_t(c)].front();  // FIFO pop(0), as backward_step_helper does
        outputs[size_t(c)].pop_front();
        out.push_back({'B', mb, c});
    };
    if (p == 1) {
        for (int i = 0; i < m; ++i) { fwd(i); bwd(i); }
        return out;
    }
    for (int k = 0; k < W; ++k) fwd(k);
    for (int k = 0; k < total - W; ++k) { fwd(k + W); bwd(k); }
    for (int k = total - W; k < total; ++k) bwd(k);
    return out;
}

}  // namespace

TEST(Schedule, MatchesReferenceLoops1F1B) {
    for (int p : {1, 2, 3, 4, 8})
        for (int m = 1; m <= 12; ++m)
            for (int r = 0; r < p; ++r) {
                auto s = build(p, 1, m, r);
                EXPECT_EQ(str(computeOf(s)), str(reference(p, 1, m, r, 0))) << "p=" << p << " m=" << m << " r=" << r;
                if (p > 1) {
                    EXPECT_EQ(s.warmup, std::min(p - r - 1, m));
                }
            }
}

TEST(Schedule, MatchesReferenceLoopsInterleaved) {
    for (int p : {3, 4, 8})
        for (int v : {2, 3, 4})
            for (int mult = 1; mult <= 5; ++mult) {
                const int m = p * mult;
                for (int r = 0; r < p; ++r) {
                    auto s = build(p, v, m, r);
                    EXPECT_EQ(str(computeOf(s)), str(reference(p, v, m, r, 0)))
                        << "p=" << p << " v=" << v << " m=" << m << " r=" << r;
                    EXPECT_EQ(s.warmup, refWarmup(p, v, m, r, p));
                    EXPECT_EQ(s.total, m * v);
                }
            }
    // Tunable group size g != p (incl. a shorter final group with m % g >= p).
    for (auto [p, v, m, g] : std::vector<std::tuple<int, int, int, int>>{{3, 2, 7, 4}, {4, 2, 10, 6}, {3, 3, 8, 5}}) {
        for (int r = 0; r < p; ++r) {
            auto s = build(p, v, m, r, g);
            EXPECT_EQ(str(computeOf(s)), str(reference(p, v, m, r, g))) << p << v << m << g << " r=" << r;
        }
    }
}

TEST(Schedule, MegatronTableExampleAndWarmupCounts) {
    // schedules.py comment: PP2 N3 M5 VP2 -> mb 0 1 2 0 1 2 3 4 3 4, chunk 0 0 0 1 1 1 0 0 1 1.
    auto t = scheduleTable(5, 2, 3);
    std::string mbs, chunks;
    for (auto& e : t) {
        mbs += std::to_string(e.microbatch);
        chunks += std::to_string(e.chunk);
    }
    EXPECT_EQ(mbs, "0120123434");
    EXPECT_EQ(chunks, "0001110011");
    // REFERENCE.md §1.3: p=4, m=4, v=2 gives W = 8, 8, 6, 4 for ranks 0..3.
    const int expected[] = {8, 8, 6, 4};
    for (int r = 0; r < 4; ++r) EXPECT_EQ(build(4, 2, 4, r).warmup, expected[r]) << r;
    EXPECT_TRUE(build(4, 2, 4, 0).allWarmup);
    EXPECT_FALSE(build(4, 2, 4, 2).allWarmup);
}

TEST(Schedule, PaperExamples) {
    // Narayanan et al. 2021 Fig. 4 (top), 1F1B p=4 m=8, device 1 (1-indexed in the paper).
    EXPECT_EQ(build(4, 1, 8, 0).text(), "F0.c0 F1.c0 F2.c0 F3.c0 B0.c0 F4.c0 B1.c0 F5.c0 B2.c0 F6.c0 B3.c0 F7.c0 B4.c0 "
                                        "B5.c0 B6.c0 B7.c0");
    // Last device: strict alternation.
    EXPECT_EQ(build(4, 1, 3, 3).text(), "F0.c0 B0.c0 F1.c0 B1.c0 F2.c0 B2.c0");
    // Interleaved p=4 v=2 m=8, last device, derived by hand from the table (g=4) and W=4.
    EXPECT_EQ(build(4, 2, 8, 3).text(),
              "F0.c0 F1.c0 F2.c0 F3.c0 F0.c1 B0.c1 F1.c1 B1.c1 F2.c1 B2.c1 F3.c1 B3.c1 F4.c0 B0.c0 F5.c0 B1.c0 "
              "F6.c0 B2.c0 F7.c0 B3.c0 F4.c1 B4.c1 F5.c1 B5.c1 F6.c1 B6.c1 F7.c1 B7.c1 B4.c0 B5.c0 B6.c0 B7.c0");
    // No pipelining.
    EXPECT_EQ(build(1, 1, 3, 0).text(), "F0.c0 B0.c0 F1.c0 B1.c0 F2.c0 B2.c0");
}

TEST(Schedule, ConstraintsUseMegatronMessages) {
    auto a = buildSchedule({.pp = 4, .vpp = 2, .microbatches = 6, .rank = 0});
    ASSERT_FALSE(a.isOk());
    EXPECT_NE(a.status().message().find("The remainder of M (the total micro-batches) divided by N"), std::string::npos)
        << a.status().message();
    auto b = buildSchedule({.pp = 4, .vpp = 2, .microbatches = 3, .rank = 0});
    ASSERT_FALSE(b.isOk());
    EXPECT_NE(b.status().message().find("should range in [PP=4 , M=3]"), std::string::npos) << b.status().message();
    auto c = buildSchedule({.pp = 2, .vpp = 2, .microbatches = 4, .rank = 0});
    ASSERT_FALSE(c.isOk());
    EXPECT_NE(c.status().message().find("greater than 2"), std::string::npos);
    EXPECT_TRUE(buildSchedule({.pp = 2, .vpp = 2, .microbatches = 4, .rank = 0, .overlapP2PComm = true}).isOk());
    EXPECT_FALSE(buildSchedule({.pp = 1, .vpp = 2, .microbatches = 4, .rank = 0}).isOk());
    EXPECT_FALSE(buildSchedule({.pp = 4, .vpp = 1, .microbatches = 4, .rank = 4}).isOk());
    EXPECT_FALSE(buildSchedule({.pp = 4, .vpp = 1, .microbatches = 0, .rank = 0}).isOk());
    EXPECT_EQ(layerOffset(16, 4, 2, 0, 1).value(), 8);  // REFERENCE.md: rank0 has layers 0-1 and 8-9
    EXPECT_EQ(layerOffset(16, 4, 2, 3, 0).value(), 6);
    EXPECT_FALSE(layerOffset(10, 4, 2, 0, 0).isOk());
}

TEST(Schedule, EveryRankRunsEachMicrobatchChunkOnceForwardThenBackward) {
    for (int p : {1, 2, 4})
        for (int v : {1, 2})
            for (int m : {4, 8}) {
                if (v > 1 && p < 3) continue;
                for (int r = 0; r < p; ++r) {
                    auto s = build(p, v, m, r);
                    std::map<std::pair<int, int>, int> fwdAt, bwdAt;
                    int i = 0, gradSyncs = 0;
                    for (auto& op : s.computeOps()) {
                        auto key = std::make_pair(op.microbatch, op.chunk);
                        auto& slot = op.kind == PipeOpKind::Forward ? fwdAt : bwdAt;
                        EXPECT_EQ(slot.count(key), 0u) << "duplicate " << op.text();
                        slot[key] = i++;
                        if (op.gradSync) {
                            ++gradSyncs;
                            EXPECT_EQ(op.microbatch, m - 1);
                        }
                    }
                    EXPECT_EQ(fwdAt.size(), size_t(m * v));
                    EXPECT_EQ(bwdAt.size(), size_t(m * v));
                    for (auto& [key, at] : bwdAt) EXPECT_LT(fwdAt.at(key), at);
                    EXPECT_EQ(gradSyncs, v);  // one per model chunk
                }
            }
}

// Executes all ranks' op lists together. Channels carry TensorRefs; a p2p op is a batch that
// completes when all its receives got a message and all its sends were received.
void simulate(int p, int v, int m, bool overlap) {
    SCOPED_TRACE("p=" + std::to_string(p) + " v=" + std::to_string(v) + " m=" + std::to_string(m) +
                 (overlap ? " overlap" : ""));
    std::vector<PipelineSchedule> sched;
    for (int r = 0; r < p; ++r) {
        auto s = buildSchedule({.pp = p, .vpp = v, .microbatches = m, .rank = r, .overlapP2PComm = overlap});
        ASSERT_TRUE(s.isOk()) << s.status().toString();
        sched.push_back(s.value());
    }
    struct Msg { TensorRef ref; int id; };
    // fwd[r]: activations travelling r -> (r+1)%p; bwd[r]: grads travelling r -> (r-1+p)%p.
    std::vector<std::deque<Msg>> fwd(static_cast<size_t>(p)), bwd(static_cast<size_t>(p));
    std::set<int> consumed;
    int nextId = 0;
    struct RankState {
        size_t pc = 0;
        bool posted = false;
        std::vector<int> pendingSends;
        bool recvFDone = false, recvBDone = false;
        std::set<std::pair<int, int>> haveAct, haveGrad, doneF, doneB;
    };
    std::vector<RankState> st(static_cast<size_t>(p));
    // Global forward completion order per (mb, virtual stage), for cross-rank causality.
    std::map<std::pair<int, int>, int> fwdTime;
    int clock = 0;
    bool progress = true;
    while (progress) {
        progress = false;
        for (int r = 0; r < p; ++r) {
            RankState& s = st[size_t(r)];
            const auto& ops = sched[size_t(r)].ops;
            while (s.pc < ops.size()) {
                const PipeOp& op = ops[s.pc];
                if (op.kind == PipeOpKind::Forward) {
                    const auto key = std::make_pair(op.microbatch, op.chunk);
                    if (!(r == 0 && op.chunk == 0)) {
                        ASSERT_TRUE(s.haveAct.count(key)) << "rank " << r << " " << op.text() << " without its input";
                    }
                    const int stage = op.chunk * p + r;
                    if (stage > 0) {
                        ASSERT_LT(fwdTime.at({op.microbatch, stage - 1}), clock) << op.text();
                    }
                    fwdTime[{op.microbatch, stage}] = clock++;
                    s.doneF.insert(key);
                } else if (op.kind == PipeOpKind::Backward) {
                    const auto key = std::make_pair(op.microbatch, op.chunk);
                    ASSERT_TRUE(s.doneF.count(key)) << op.text();
                    if (!(r == p - 1 && op.chunk == v - 1)) {
                        ASSERT_TRUE(s.haveGrad.count(key)) << "rank " << r << " " << op.text() << " without its grad";
                    }
                    s.doneB.insert(key);
                    ++clock;
                } else {
                    if (!s.posted) {
                        if (op.sendForward.valid()) {
                            ASSERT_TRUE(s.doneF.count({op.sendForward.microbatch, op.sendForward.chunk})) << op.text();
                            fwd[size_t(r)].push_back({op.sendForward, nextId});
                            s.pendingSends.push_back(nextId++);
                        }
                        if (op.sendBackward.valid()) {
                            ASSERT_TRUE(s.doneB.count({op.sendBackward.microbatch, op.sendBackward.chunk})) << op.text();
                            bwd[size_t(r)].push_back({op.sendBackward, nextId});
                            s.pendingSends.push_back(nextId++);
                        }
                        s.posted = true;
                        s.recvFDone = !op.recvForward.valid();
                        s.recvBDone = !op.recvBackward.valid();
                        progress = true;
                    }
                    if (!s.recvFDone) {
                        auto& ch = fwd[size_t((r - 1 + p) % p)];
                        if (!ch.empty()) {
                            const Msg msg = ch.front();
                            ch.pop_front();
                            // Wrapping from the last rank to rank 0 feeds the next chunk.
                            const TensorRef expect{msg.ref.microbatch, msg.ref.chunk + (r == 0 ? 1 : 0)};
                            ASSERT_EQ(op.recvForward, expect) << "rank " << r << " " << op.text();
                            s.haveAct.insert({expect.microbatch, expect.chunk});
                            consumed.insert(msg.id);
                            s.recvFDone = true;
                            progress = true;
                        }
                    }
                    if (!s.recvBDone) {
                        auto& ch = bwd[size_t((r + 1) % p)];
                        if (!ch.empty()) {
                            const Msg msg = ch.front();
                            ch.pop_front();
                            const TensorRef expect{msg.ref.microbatch, msg.ref.chunk - (r == p - 1 ? 1 : 0)};
                            ASSERT_EQ(op.recvBackward, expect) << "rank " << r << " " << op.text();
                            s.haveGrad.insert({expect.microbatch, expect.chunk});
                            consumed.insert(msg.id);
                            s.recvBDone = true;
                            progress = true;
                        }
                    }
                    bool sendsDone = true;
                    for (int id : s.pendingSends) sendsDone = sendsDone && consumed.count(id);
                    if (!(s.recvFDone && s.recvBDone && sendsDone)) break;  // blocked in this batch
                    s.posted = false;
                    s.pendingSends.clear();
                }
                ++s.pc;
                progress = true;
            }
        }
    }
    for (int r = 0; r < p; ++r) {
        EXPECT_EQ(st[size_t(r)].pc, sched[size_t(r)].ops.size()) << "rank " << r << " deadlocked at "
                                                                  << sched[size_t(r)].ops[st[size_t(r)].pc].text();
        EXPECT_TRUE(fwd[size_t(r)].empty()) << "unreceived activations from rank " << r;
        EXPECT_TRUE(bwd[size_t(r)].empty()) << "unreceived grads from rank " << r;
    }
}

TEST(Schedule, WholePipelineSimulationHasMatchingP2PAndCausality) {
    for (int p : {2, 3, 4, 8})
        for (int m : {1, 2, 5, 8, 16}) simulate(p, 1, m, false);
    for (int p : {3, 4})
        for (int v : {2, 3})
            for (int mult : {1, 2, 3}) {
                simulate(p, v, p * mult, false);
                simulate(p, v, p * mult, true);
            }
    simulate(2, 2, 4, true);
    simulate(8, 2, 16, false);
}

TEST(Schedule, P2POpsNameTheTensorsTheyMove) {
    // 1F1B p=2 m=2, rank 0: F0 send(0) F1 send_forward_recv_backward(1 / grad 0) B0 ... 
    auto s = build(2, 1, 2, 0);
    ASSERT_GE(s.ops.size(), 6u);
    EXPECT_EQ(s.text(true),
              "F0.c0 send_forward(send act 0.c0) F1.c0 send_forward_recv_backward(send act 1.c0, recv grad 0.c0) "
              "B0.c0 recv_backward(recv grad 1.c0) B1.c0");
    auto last = build(2, 1, 2, 1);
    EXPECT_EQ(last.text(true),
              "recv_forward(recv act 0.c0) F0.c0 B0.c0 send_backward_recv_forward(recv act 1.c0, send grad 0.c0) "
              "F1.c0 B1.c0 send_backward(send grad 1.c0)");
}
