// Commands of the 'parallel' group: `layout` (which global rank has which tp/cp/dp/pp and
// expert coordinates, and its process groups) and `schedule` (the pipeline op order per rank).
#include <cstdio>
#include <nlohmann/json.hpp>

#include "apps/trainscope/commands.h"
#include "common/json_text.h"
#include "engine/config/knobs.h"
#include "engine/parallel/layout.h"
#include "engine/parallel/schedule.h"

namespace ts::cli {

using nlohmann::json;

namespace {

// `layout` prints one line per rank naming the members of each of its groups, so its output
// grows with the square of the world size (a data-parallel group of 4096 ranks is named on
// each of 4096 lines: ~300 MB). Larger layouts are refused instead of printing for minutes.
constexpr int64_t kMaxLayoutWorld = 4096;
// `schedule` without --rank prints every pipeline rank's op list: about four ops per
// microbatch and virtual stage per rank.
constexpr int64_t kMaxScheduleOpsShown = 4000000;

std::string listText(const std::vector<int>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
    return s + "]";
}

// Groups shown per rank (the rest are available with --json).
const char* kShownGroups[] = {"tp", "cp", "hcp-a2a", "hcp-p2p", "dp", "pp", "dp-cp", "embd", "ep", "etp", "edp"};

}  // namespace

int cmdLayout(const Args& a) {
    if (a.positional().size() != 1) return fail(2, "usage: trainscope layout CONFIG.yaml [--world-size N] [--json]");
    if (auto bad = a.unknownFlags({"--json", "--world-size"}); !bad.empty())
        return fail(2, "unknown option " + bad[0] + " for `layout`");
    const auto worldFlag = intFlag(a, "--world-size", 1, kMaxWorldSize);
    if (!worldFlag) return fail(2, worldFlag.status().message());

    auto loaded = engine::loadConfigFile(a.positional()[0]);
    if (loaded.ok() && *worldFlag) {
        loaded.config.world_size = int(**worldFlag);
        loaded.issues = engine::validateConfig(loaded.config);
    }
    if (!loaded.ok()) {
        for (const auto& i : loaded.issues) std::fprintf(stderr, "%s\n", i.toString().c_str());
        return fail(2, a.positional()[0] + ": invalid config (" + std::to_string(loaded.issues.size()) + " problem" +
                           (loaded.issues.size() == 1 ? "" : "s") + ")");
    }
    const engine::Config& c = loaded.config;
    engine::ParallelSizes sizes;
    sizes.tp = c.tensor_model_parallel_size;
    sizes.cp = c.context_parallel_size;
    sizes.pp = c.pipeline_model_parallel_size;
    sizes.dp = c.data_parallel_size;
    sizes.ep = c.expert_model_parallel_size;
    sizes.etp = c.expert_tensor_parallel_size;
    sizes.world = c.world_size;
    if (c.hierarchical_context_parallel_sizes.size() == 2) sizes.hcpA2a = c.hierarchical_context_parallel_sizes[0];
    auto layout = engine::ParallelLayout::create(sizes);
    if (!layout.isOk()) return fail(2, layout.status().message());
    const auto& l = layout.value();
    const auto& s = l.sizes();
    if (s.world > kMaxLayoutWorld)
        return fail(2, "world size " + std::to_string(s.world) + " is above the " + std::to_string(kMaxLayoutWorld) +
                           " ranks `layout` lists: it prints every rank with the members of its groups, which "
                           "grows with the square of the world size; the layout itself is valid (`trainscope "
                           "validate` checks it)");

    if (a.has("--json")) {
        json j;
        j["sizes"] = {{"world", s.world}, {"tp", s.tp}, {"cp", s.cp}, {"dp", s.dp}, {"pp", s.pp},
                      {"vpp", c.virtual_pipeline_model_parallel_size}, {"ep", s.ep}, {"etp", s.etp},
                      {"edp", l.expertDataParallelSize()}};
        j["order"] = "tp-cp-ep-dp-pp";
        json ranks = json::array();
        for (int r = 0; r < l.worldSize(); ++r) {
            const auto rc = l.coordsOf(r);
            json groups = json::object();
            for (const auto& name : engine::ParallelLayout::groupNames()) groups[name] = l.groupRanks(name, r);
            ranks.push_back({{"rank", r}, {"tp", rc.tp}, {"cp", rc.cp}, {"dp", rc.dp}, {"pp", rc.pp},
                             {"ep", rc.ep}, {"etp", rc.etp}, {"edp", rc.edp}, {"groups", groups}});
        }
        j["ranks"] = ranks;
        json all = json::object();
        for (const auto& name : engine::ParallelLayout::groupNames()) all[name] = l.allGroups(name);
        j["groups"] = all;
        std::printf("%s\n", dumpJson(j, 2).c_str());
        return 0;
    }
    std::printf("world %d = tp %d x cp %d x dp %d x pp %d (rank order tp-cp-ep-dp-pp)", s.world, s.tp, s.cp, s.dp,
                s.pp);
    if (c.virtual_pipeline_model_parallel_size > 1) std::printf(", vpp %d", c.virtual_pipeline_model_parallel_size);
    std::printf("\nexperts: etp %d x ep %d x edp %d x pp %d\n\n", s.etp, s.ep, l.expertDataParallelSize(), s.pp);
    std::printf("%5s %3s %3s %3s %3s  %3s %3s %3s  %s\n", "rank", "tp", "cp", "dp", "pp", "ep", "etp", "edp", "groups");
    for (int r = 0; r < l.worldSize(); ++r) {
        const auto rc = l.coordsOf(r);
        std::string groups;
        for (const char* name : kShownGroups) {
            const auto members = l.groupRanks(name, r);
            if (members.empty()) continue;
            groups += std::string(groups.empty() ? "" : " ") + name + "=" + listText(members);
        }
        std::printf("%5d %3d %3d %3d %3d  %3d %3d %3d  %s\n", r, rc.tp, rc.cp, rc.dp, rc.pp, rc.ep, rc.etp, rc.edp,
                    groups.c_str());
    }
    return 0;
}

int cmdSchedule(const Args& a) {
    const char* usage =
        "usage: trainscope schedule --pp P [--vpp V] --microbatches M [--rank R] [--group-size G] [--verbose] [--json]";
    if (auto bad = a.unknownFlags({"--pp", "--vpp", "--microbatches", "--rank", "--json", "--group-size", "--verbose"});
        !bad.empty())
        return fail(2, "unknown option " + bad[0] + " for `schedule`; " + usage);
    constexpr int64_t kIntMax = 2147483647;
    const auto ppR = intFlag(a, "--pp", 1, kIntMax);
    const auto vppR = intFlag(a, "--vpp", 1, kIntMax);
    const auto mR = intFlag(a, "--microbatches", 1, kIntMax);
    const auto rankR = intFlag(a, "--rank", 0, kIntMax);
    const auto gR = intFlag(a, "--group-size", 0, kIntMax);
    for (const auto* r : {&ppR, &vppR, &mR, &rankR, &gR})
        if (!*r) return fail(2, r->status().message());
    const auto pp = *ppR, vpp = *vppR, m = *mR, rank = *rankR, g = *gR;
    if (!pp || !m) return fail(2, usage);

    engine::ScheduleParams base;
    base.pp = int(*pp);
    base.vpp = int(vpp.value_or(1));
    base.microbatches = int(*m);
    base.microbatchGroupSize = int(g.value_or(0));
    // The per-rank bound (microbatches x vpp) is the engine's (validateSchedule); listing
    // every rank multiplies it by pp.
    if (auto v = engine::validateSchedule(base); !v) return fail(2, v.message());
    if (!rank && *pp * *m * base.vpp * 4 > kMaxScheduleOpsShown)
        return fail(2, "pp=" + std::to_string(*pp) + " ranks x " + std::to_string(*m) + " microbatches" +
                           (base.vpp > 1 ? " x vpp=" + std::to_string(base.vpp) : "") + " would print about " +
                           std::to_string(*pp * *m * base.vpp * 4) + " ops, above the " +
                           std::to_string(kMaxScheduleOpsShown) + " this command lists; pick one rank with --rank R");
    std::vector<int> ranks;
    if (rank) ranks.push_back(int(*rank));
    else
        for (int r = 0; r < base.pp; ++r) ranks.push_back(r);

    json out = json::array();
    for (int r : ranks) {
        engine::ScheduleParams p = base;
        p.rank = r;
        auto s = engine::buildSchedule(p);
        if (!s.isOk()) return fail(2, s.status().message());
        if (a.has("--json")) {
            json ops = json::array();
            for (const auto& op : s->ops) {
                json o = {{"op", engine::pipeOpKindName(op.kind)}, {"text", op.text()}};
                if (op.isCompute()) {
                    o["microbatch"] = op.microbatch;
                    o["chunk"] = op.chunk;
                    o["virtual_microbatch"] = op.virtualMicrobatch;
                    if (op.kind == engine::PipeOpKind::Backward) o["grad_sync"] = op.gradSync;
                } else {
                    auto ref = [](const engine::TensorRef& t) {
                        return t.valid() ? json{{"microbatch", t.microbatch}, {"chunk", t.chunk}} : json(nullptr);
                    };
                    o["send_forward"] = ref(op.sendForward);
                    o["recv_forward"] = ref(op.recvForward);
                    o["send_backward"] = ref(op.sendBackward);
                    o["recv_backward"] = ref(op.recvBackward);
                }
                ops.push_back(o);
            }
            out.push_back({{"rank", r}, {"schedule", s->name}, {"warmup", s->warmup}, {"steady", s->remaining},
                           {"total", s->total}, {"order", s->text(false)}, {"ops", ops}});
        } else {
            std::printf("rank %d (%s, warmup %d, steady %d): %s\n", r, s->name.c_str(), s->warmup, s->remaining,
                        s->text(a.has("--verbose")).c_str());
        }
    }
    if (a.has("--json")) std::printf("%s\n", dumpJson(out, 2).c_str());
    return 0;
}

}  // namespace ts::cli
