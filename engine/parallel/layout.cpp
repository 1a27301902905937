// Parallel layout: rank <-> coordinates and Megatron-named process groups (see layout.h).
#include "engine/parallel/layout.h"

#include <algorithm>
#include <array>
#include <set>
#include <sstream>

namespace ts::engine {

namespace {

// The order string "tp-cp-ep-dp-pp": dimension 0 varies fastest.
constexpr int kDims = 5;
enum Dim { kTp = 0, kCp = 1, kEp = 2, kDp = 3, kPp = 4 };

struct Generator {
    std::array<int, kDims> size{};
    std::array<int, kDims> stride{};
    void finish() {
        int s = 1;
        for (int i = 0; i < kDims; ++i) {
            stride[size_t(i)] = s;
            s *= size[size_t(i)];
        }
    }
    std::array<int, kDims> decompose(int g) const {
        std::array<int, kDims> c{};
        for (int i = 0; i < kDims; ++i) c[size_t(i)] = (g / stride[size_t(i)]) % size[size_t(i)];
        return c;
    }
    // Members of the group over the masked dims containing `g`; masked dims enumerate with the
    // lowest dim fastest (Megatron's generate_masked_orthogonal_rank_groups order).
    std::vector<int> group(int g, const std::array<bool, kDims>& mask) const {
        const auto c = decompose(g);
        int base = 0, groupSize = 1;
        for (int i = 0; i < kDims; ++i) {
            if (mask[size_t(i)]) groupSize *= size[size_t(i)];
            else base += c[size_t(i)] * stride[size_t(i)];
        }
        std::vector<int> out;
        out.reserve(size_t(groupSize));
        for (int k = 0; k < groupSize; ++k) {
            int rem = k, rank = base;
            for (int i = 0; i < kDims; ++i) {
                if (!mask[size_t(i)]) continue;
                rank += (rem % size[size_t(i)]) * stride[size_t(i)];
                rem /= size[size_t(i)];
            }
            out.push_back(rank);
        }
        return out;
    }
};

std::vector<std::string> split(const std::string& s) {
    std::vector<std::string> out;
    std::stringstream ss(s);
    std::string tok;
    while (std::getline(ss, tok, '-')) out.push_back(tok);
    return out;
}

// Parses a group name into (expert?, mask). False when unknown.
bool parseGroup(const std::string& rawName, bool& expert, std::array<bool, kDims>& mask) {
    std::string name = rawName;
    if (name == "mp") name = "tp-pp";
    if (name == "world") name = "tp-cp-dp-pp";
    mask.fill(false);
    const auto toks = split(name);
    if (toks.empty()) return false;
    bool anyExpert = false, anyDense = false;
    std::set<std::string> seen;
    for (const auto& t : toks) {
        if (!seen.insert(t).second) return false;
        if (t == "tp") { anyDense = true; mask[kTp] = true; }
        else if (t == "cp") { anyDense = true; mask[kCp] = true; }
        else if (t == "dp") { anyDense = true; mask[kDp] = true; }
        else if (t == "etp") { anyExpert = true; mask[kTp] = true; }
        else if (t == "ep") { anyExpert = true; mask[kEp] = true; }
        else if (t == "edp") { anyExpert = true; mask[kDp] = true; }
        else if (t == "pp") { mask[kPp] = true; }
        else return false;
    }
    if (anyExpert && anyDense) return false;
    expert = anyExpert;
    return true;
}

}  // namespace

Result<ParallelLayout> ParallelLayout::create(const ParallelSizes& in) {
    ParallelSizes s = in;
    auto positive = [](int v, const char* knob) -> Status {
        if (v < 1) return Status::invalid(std::string(knob) + "=" + std::to_string(v) + " must be at least 1");
        return Status::ok();
    };
    TS_RETURN_IF_ERROR(positive(s.tp, "tensor_model_parallel_size"));
    TS_RETURN_IF_ERROR(positive(s.cp, "context_parallel_size"));
    TS_RETURN_IF_ERROR(positive(s.pp, "pipeline_model_parallel_size"));
    TS_RETURN_IF_ERROR(positive(s.ep, "expert_model_parallel_size"));
    if (s.etp == 0) s.etp = s.tp;
    TS_RETURN_IF_ERROR(positive(s.etp, "expert_tensor_parallel_size"));
    if (s.dp < 0) return Status::invalid("data_parallel_size=" + std::to_string(s.dp) + " must be at least 1 (or 0 = derived)");
    if (s.world < 0) return Status::invalid("world size " + std::to_string(s.world) + " must be at least 1");
    const int64_t modelParallel = int64_t(s.tp) * s.cp * s.pp;
    if (s.world == 0) {
        if (s.dp == 0) s.dp = 1;
        s.world = int(modelParallel * s.dp);
    } else if (s.dp == 0) {
        if (s.world % modelParallel != 0)
            return Status::invalid("world size " + std::to_string(s.world) +
                                   " is not divisible by tensor_model_parallel_size (" + std::to_string(s.tp) +
                                   ") x context_parallel_size (" + std::to_string(s.cp) +
                                   ") x pipeline_model_parallel_size (" + std::to_string(s.pp) +
                                   ") = " + std::to_string(modelParallel));
        s.dp = int(s.world / modelParallel);
    } else if (modelParallel * s.dp != s.world) {
        return Status::invalid("world size " + std::to_string(s.world) + " is not equal to tensor_model_parallel_size (" +
                               std::to_string(s.tp) + ") x context_parallel_size (" + std::to_string(s.cp) +
                               ") x data_parallel_size (" + std::to_string(s.dp) + ") x pipeline_model_parallel_size (" +
                               std::to_string(s.pp) + ") = " + std::to_string(modelParallel * s.dp));
    }
    if (s.hcpA2a < 0 || (s.hcpA2a > 0 && s.cp % s.hcpA2a != 0))
        return Status::invalid("hierarchical_context_parallel_sizes: the a2a size " + std::to_string(s.hcpA2a) +
                               " does not divide context_parallel_size=" + std::to_string(s.cp));
    const int64_t expertModel = int64_t(s.etp) * s.ep * s.pp;
    if (s.world % expertModel != 0)
        return Status::invalid("world size " + std::to_string(s.world) +
                               " is not divisible by expert_tensor_parallel_size (" + std::to_string(s.etp) +
                               ") x expert_model_parallel_size (" + std::to_string(s.ep) +
                               ") x pipeline_model_parallel_size (" + std::to_string(s.pp) +
                               ") = " + std::to_string(expertModel));
    ParallelLayout l;
    l.m_sizes = s;
    l.m_edp = int(s.world / expertModel);
    return l;
}

RankCoords ParallelLayout::coordsOf(int g) const {
    const ParallelSizes& s = m_sizes;
    RankCoords c;
    c.global = g;
    c.tp = g % s.tp;
    c.cp = (g / s.tp) % s.cp;
    c.dp = (g / (s.tp * s.cp)) % s.dp;
    c.pp = g / (s.tp * s.cp * s.dp);
    c.etp = g % s.etp;
    c.ep = (g / s.etp) % s.ep;
    c.edp = (g / (s.etp * s.ep)) % m_edp;
    return c;
}

int ParallelLayout::globalRank(int tp, int cp, int dp, int pp) const {
    const ParallelSizes& s = m_sizes;
    return tp + s.tp * (cp + s.cp * (dp + s.dp * pp));
}

std::vector<int> ParallelLayout::groupRanks(const std::string& name, int g) const {
    if (g < 0 || g >= m_sizes.world) return {};
    if (name == "embd" || name == "pos-embd") {
        std::vector<int> pp = groupRanks("pp", g);
        std::vector<int> out = {pp.front()};
        if (name == "embd" && pp.size() > 1) out.push_back(pp.back());
        // Ranks in the middle of a pipeline belong to no embedding group.
        if (std::find(out.begin(), out.end(), g) == out.end()) return {};
        return out;
    }
    if (name == "hcp-a2a" || name == "hcp-p2p") {
        if (m_sizes.hcpA2a <= 0) return {};
        const std::vector<int> cp = groupRanks("cp", g);  // cp index order
        const int a = m_sizes.hcpA2a, idx = coordsOf(g).cp;
        std::vector<int> out;
        if (name == "hcp-a2a")
            for (int i = idx / a * a; i < idx / a * a + a; ++i) out.push_back(cp[size_t(i)]);
        else
            for (int i = idx % a; i < int(cp.size()); i += a) out.push_back(cp[size_t(i)]);
        return out;
    }
    bool expert = false;
    std::array<bool, kDims> mask{};
    if (!parseGroup(name, expert, mask)) return {};
    Generator gen;
    if (expert) gen.size = {m_sizes.etp, 1, m_sizes.ep, m_edp, m_sizes.pp};
    else gen.size = {m_sizes.tp, m_sizes.cp, 1, m_sizes.dp, m_sizes.pp};
    gen.finish();
    return gen.group(g, mask);
}

std::vector<std::vector<int>> ParallelLayout::allGroups(const std::string& name) const {
    std::vector<std::vector<int>> out;
    std::vector<bool> seen(size_t(m_sizes.world), false);
    for (int g = 0; g < m_sizes.world; ++g) {
        if (seen[size_t(g)]) continue;
        auto members = groupRanks(name, g);
        if (members.empty()) continue;
        for (int m : members) seen[size_t(m)] = true;
        out.push_back(std::move(members));
    }
    return out;
}

const std::vector<std::string>& ParallelLayout::groupNames() {
    static const std::vector<std::string> kNames = {"tp",       "cp",  "dp",       "pp",  "dp-cp",  "tp-cp",
                                                    "tp-dp-cp", "mp",  "embd",     "pos-embd", "ep", "etp",
                                                    "edp",      "etp-ep", "etp-ep-pp", "world",
                                                    "hcp-a2a",  "hcp-p2p"};
    return kNames;
}

bool ParallelLayout::isKnownGroup(const std::string& name) {
    if (name == "embd" || name == "pos-embd" || name == "hcp-a2a" || name == "hcp-p2p") return true;
    bool expert = false;
    std::array<bool, kDims> mask{};
    return parseGroup(name, expert, mask);
}

}  // namespace ts::engine
