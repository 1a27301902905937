// Parallel layout: rank order and group membership against tables derived by hand from
// Megatron-Core's rank generator (order tp-cp-ep-dp-pp), including the example in the
// initialize_model_parallel docstring; every rank in exactly one group of each kind; errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "engine/parallel/layout.h"

using namespace ts;
using namespace ts::engine;

namespace {

using Groups = std::vector<std::vector<int>>;

ParallelLayout make(ParallelSizes s) {
    auto l = ParallelLayout::create(s);
    EXPECT_TRUE(l.isOk()) << l.status().toString();
    return l.value();
}

// Every rank is in exactly one group, and each member's group is that same group.
void expectPartition(const ParallelLayout& l, const std::string& name) {
    std::vector<int> hits(size_t(l.worldSize()), 0);
    for (const auto& g : l.allGroups(name)) {
        for (int r : g) {
            ++hits[size_t(r)];
            EXPECT_EQ(l.groupRanks(name, r), g) << name << " rank " << r;
        }
    }
    for (int r = 0; r < l.worldSize(); ++r) EXPECT_EQ(hits[size_t(r)], 1) << name << " rank " << r;
}

}  // namespace

TEST(Layout, Tp2Pp2Dp2) {
    // Hand table: global = tp + 2*(dp + 2*pp).
    auto l = make({.tp = 2, .pp = 2, .world = 8});
    EXPECT_EQ(l.sizes().dp, 2);
    struct Row { int g, tp, dp, pp; };
    const Row rows[] = {{0, 0, 0, 0}, {1, 1, 0, 0}, {2, 0, 1, 0}, {3, 1, 1, 0},
                        {4, 0, 0, 1}, {5, 1, 0, 1}, {6, 0, 1, 1}, {7, 1, 1, 1}};
    for (const Row& r : rows) {
        const RankCoords c = l.coordsOf(r.g);
        EXPECT_EQ(c.tp, r.tp) << r.g;
        EXPECT_EQ(c.dp, r.dp) << r.g;
        EXPECT_EQ(c.pp, r.pp) << r.g;
        EXPECT_EQ(c.cp, 0);
        EXPECT_EQ(l.globalRank(r.tp, 0, r.dp, r.pp), r.g);
    }
    EXPECT_EQ(l.allGroups("tp"), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
    EXPECT_EQ(l.allGroups("dp"), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
    EXPECT_EQ(l.allGroups("pp"), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
    EXPECT_EQ(l.allGroups("mp"), (Groups{{0, 1, 4, 5}, {2, 3, 6, 7}}));
    EXPECT_EQ(l.allGroups("tp-pp"), l.allGroups("mp"));
    EXPECT_EQ(l.allGroups("dp-cp"), l.allGroups("dp"));
    EXPECT_EQ(l.allGroups("cp"), (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
    EXPECT_EQ(l.allGroups("tp-dp-cp"), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
    EXPECT_EQ(l.allGroups("embd"), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
    EXPECT_EQ(l.allGroups("pos-embd"), (Groups{{0}, {1}, {2}, {3}}));
    EXPECT_EQ(l.allGroups("world"), (Groups{{0, 1, 2, 3, 4, 5, 6, 7}}));
    EXPECT_EQ(l.groupRanks("dp", 5), (std::vector<int>{5, 7}));
}

TEST(Layout, MegatronDocstringExample16Gpus) {
    // parallel_state.initialize_model_parallel: 16 GPUs, tp=2, pp=4 -> 8 dp groups
    // [g0,g2],[g1,g3],[g4,g6],...; 8 tp groups [g0,g1],...; 4 pp groups [g0,g4,g8,g12],...
    auto l = make({.tp = 2, .pp = 4, .world = 16});
    EXPECT_EQ(l.allGroups("dp"), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
    EXPECT_EQ(l.allGroups("tp"), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
    EXPECT_EQ(l.allGroups("pp"), (Groups{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}));
    // Embedding group: first and last stage of each pipeline; middle stages have none.
    EXPECT_EQ(l.groupRanks("embd", 12), (std::vector<int>{0, 12}));
    EXPECT_TRUE(l.groupRanks("embd", 4).empty());
}

TEST(Layout, Tp2Cp2Dp2) {
    // global = tp + 2*(cp + 2*dp).
    auto l = make({.tp = 2, .cp = 2, .dp = 2});
    EXPECT_EQ(l.worldSize(), 8);
    const RankCoords c6 = l.coordsOf(6);  // tp0 cp1 dp1
    EXPECT_EQ(c6.tp, 0);
    EXPECT_EQ(c6.cp, 1);
    EXPECT_EQ(c6.dp, 1);
    EXPECT_EQ(l.allGroups("cp"), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
    EXPECT_EQ(l.allGroups("dp"), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
    // dp-cp: cp varies fastest, then dp.
    EXPECT_EQ(l.allGroups("dp-cp"), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
    EXPECT_EQ(l.allGroups("tp-cp"), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
    EXPECT_EQ(l.allGroups("embd"), (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
}

TEST(Layout, ExpertGroupsWithEp2Etp1) {
    // Dense tp=2 dp=2 (world 4); experts: etp=1, ep=2, edp = 4/(1*2*1) = 2;
    // expert global = etp + 1*(ep + 2*edp) = ep + 2*edp.
    auto l = make({.tp = 2, .ep = 2, .etp = 1, .world = 4});
    EXPECT_EQ(l.expertDataParallelSize(), 2);
    EXPECT_EQ(l.allGroups("tp"), (Groups{{0, 1}, {2, 3}}));
    EXPECT_EQ(l.allGroups("dp"), (Groups{{0, 2}, {1, 3}}));
    EXPECT_EQ(l.allGroups("ep"), (Groups{{0, 1}, {2, 3}}));
    EXPECT_EQ(l.allGroups("edp"), (Groups{{0, 2}, {1, 3}}));
    EXPECT_EQ(l.allGroups("etp"), (Groups{{0}, {1}, {2}, {3}}));
    const RankCoords c3 = l.coordsOf(3);
    EXPECT_EQ(c3.ep, 1);
    EXPECT_EQ(c3.edp, 1);
    EXPECT_EQ(c3.etp, 0);
}

TEST(Layout, ExpertGroupsWithEp4Etp2Pp2) {
    // world 16, tp=2 pp=2 -> dp=4. Experts: etp=2 ep=4 pp=2 -> edp=1;
    // expert global = etp + 2*(ep + 4*pp).
    auto l = make({.tp = 2, .pp = 2, .ep = 4, .etp = 2, .world = 16});
    EXPECT_EQ(l.expertDataParallelSize(), 1);
    EXPECT_EQ(l.allGroups("ep"), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
    EXPECT_EQ(l.allGroups("etp-ep"), (Groups{{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 15}}));
    EXPECT_EQ(l.allGroups("edp").size(), 16u);
    // The expert and dense generators agree on the pipeline groups.
    EXPECT_EQ(l.allGroups("etp-ep-pp"), (Groups{{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}}));
    for (int r = 0; r < 16; ++r) EXPECT_EQ(l.coordsOf(r).pp, r / 8);
}

TEST(Layout, EveryRankInExactlyOneGroupOfEachKind) {
    const ParallelSizes layouts[] = {
        {.tp = 2, .pp = 2, .world = 8},   {.tp = 2, .cp = 2, .world = 8},       {.pp = 4, .world = 8},
        {.tp = 4, .world = 8},            {.tp = 2, .ep = 2, .etp = 1, .world = 8}, {.tp = 1, .world = 1},
        {.tp = 2, .cp = 2, .pp = 2, .world = 16, }, {.tp = 2, .pp = 2, .ep = 2, .world = 8}};
    for (const auto& s : layouts) {
        auto l = make(s);
        for (const auto& name : ParallelLayout::groupNames()) {
            if (name == "embd" || name == "pos-embd") continue;  // middle stages have none
            if (name.rfind("hcp-", 0) == 0) continue;  // only with hierarchical CP sizes (test_context_parallel)
            SCOPED_TRACE(name);
            expectPartition(l, name);
        }
        // Sizes of the groups are the products of their dimensions.
        const auto& z = l.sizes();
        EXPECT_EQ(l.groupRanks("tp", 0).size(), size_t(z.tp));
        EXPECT_EQ(l.groupRanks("dp-cp", 0).size(), size_t(z.dp * z.cp));
        EXPECT_EQ(l.groupRanks("mp", 0).size(), size_t(z.tp * z.pp));
        EXPECT_EQ(l.groupRanks("ep", 0).size(), size_t(z.ep));
        EXPECT_EQ(l.groupRanks("edp", 0).size(), size_t(l.expertDataParallelSize()));
        for (int r = 0; r < l.worldSize(); ++r) {
            const RankCoords c = l.coordsOf(r);
            EXPECT_EQ(l.globalRank(c.tp, c.cp, c.dp, c.pp), r);
        }
    }
}

TEST(Layout, InvalidSizesGiveClearErrors) {
    auto a = ParallelLayout::create({.tp = 4, .world = 6});
    ASSERT_FALSE(a.isOk());
    EXPECT_NE(a.status().message().find("world size 6 is not divisible by tensor_model_parallel_size (4)"),
              std::string::npos)
        << a.status().message();
    auto b = ParallelLayout::create({.tp = 2, .dp = 2, .world = 8});
    ASSERT_FALSE(b.isOk());
    EXPECT_NE(b.status().message().find("world size 8 is not equal to"), std::string::npos) << b.status().message();
    auto c = ParallelLayout::create({.tp = 2, .ep = 3, .world = 4});
    ASSERT_FALSE(c.isOk());
    EXPECT_NE(c.status().message().find("expert_model_parallel_size (3)"), std::string::npos) << c.status().message();
    auto d = ParallelLayout::create({.tp = 0});
    ASSERT_FALSE(d.isOk());
    EXPECT_NE(d.status().message().find("tensor_model_parallel_size=0"), std::string::npos);
    EXPECT_TRUE(make({.tp = 2, .world = 2}).groupRanks("nonsense", 0).empty());
    EXPECT_TRUE(make({.tp = 2, .world = 2}).groupRanks("tp-etp", 0).empty());
    EXPECT_FALSE(ParallelLayout::isKnownGroup("tp-etp"));
    EXPECT_TRUE(ParallelLayout::isKnownGroup("tp-cp-pp"));
}
