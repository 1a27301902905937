// Context parallel sharding (see context_parallel.h).
#include "engine/parallel/context_parallel.h"

namespace ts::engine {

Microbatch cpShard(const Microbatch& full, int seq, int b, int cp, int rank) {
    Microbatch out;
    const std::vector<int> pos = cpLocalPositions(seq, cp, rank);
    for (int p : pos)
        for (int bi = 0; bi < b; ++bi) {
            const size_t t = size_t(p) * size_t(b) + size_t(bi);
            out.tokens.push_back(full.tokens[t]);
            out.labels.push_back(full.labels[t]);
            if (!full.lossMask.empty()) out.lossMask.push_back(full.lossMask[t]);
        }
    double total = 0;
    if (full.lossMask.empty()) total = double(seq) * b;
    else for (float w : full.lossMask) total += w;
    out.tokensTotal = total;
    return out;
}

}  // namespace ts::engine
