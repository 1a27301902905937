// The MoE router's balancing modes (ops.h: moeSinkhorn, moeQbDualUpdate), the oracle of their
// CUDA kernels (kernels/cuda/moe_route.cu), which compute the same bits: every product and sum
// rounded as written (this file is compiled with -ffp-contract=off, the kernels use __fmul_rn /
// __fadd_rn), the sums in the orders kernels/common/moe_balance.h fixes, exp in double rounded
// to float (CUDA's and glibc's double exp are within an ulp of a double, so they round to
// different floats only where the exact value lies within a double ulp of a float's rounding
// boundary; the gpu test compares the bits), the selections by exact keys.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "kernels/common/moe_balance.h"
#include "kernels/cpu/ops.h"

namespace ts::kernels::cpu {

void moeSinkhorn(const float* cost, int T, int E, float* out, float tol) {
    if (T <= 0 || E <= 0) return;
    const size_t n = size_t(T) * size_t(E);
    for (size_t i = 0; i < n; ++i) out[i] = float(std::exp(double(cost[i])));
    const int chunks = (T + hd::kSinkhornChunk - 1) / hd::kSinkhornChunk;
    std::vector<float> d0(static_cast<size_t>(T), 0.f), d1(size_t(E), 1.f), d1old(size_t(E), 1.f), part(size_t(chunks) * size_t(E));
    const float invT = 1.f / float(T), invE = 1.f / float(E), eps = hd::kSinkhornEps;
    float error = 1e9f;
    for (int it = 0; error > tol && it < hd::kSinkhornMaxIters; ++it) {
        // d0: each token's row against the expert factors, in expert order
        for (int t = 0; t < T; ++t) {
            const float* c = out + size_t(t) * E;
            float s = 0;
            for (int e = 0; e < E; ++e) s += d1[size_t(e)] * c[e];
            d0[size_t(t)] = invT / (s + eps);
        }
        // d1: each expert's column against the token factors, in chunks of tokens, then the chunks
        for (int q = 0; q < chunks; ++q)
            for (int e = 0; e < E; ++e) {
                float s = 0;
                for (int t = q * hd::kSinkhornChunk; t < std::min(T, (q + 1) * hd::kSinkhornChunk); ++t)
                    s += d0[size_t(t)] * out[size_t(t) * E + size_t(e)];
                part[size_t(q) * E + size_t(e)] = s;
            }
        for (int e = 0; e < E; ++e) {
            float s = 0;
            for (int q = 0; q < chunks; ++q) s += part[size_t(q) * E + size_t(e)];
            d1[size_t(e)] = invE / (s + eps);
        }
        float diff = 0;
        for (int e = 0; e < E; ++e) diff += std::fabs(d1old[size_t(e)] - d1[size_t(e)]);
        error = diff / float(E);
        d1old = d1;
    }
    for (int t = 0; t < T; ++t)
        for (int e = 0; e < E; ++e) {
            float& v = out[size_t(t) * E + size_t(e)];
            v = d1[size_t(e)] * v * d0[size_t(t)];
        }
}

void moeQbDualUpdate(const float* S, int m, int n, int k, const float* beta, int32_t* indices, float* quantile) {
    if (m <= 0 || n <= 0) return;
    if (k < 1 || k >= n) {  // the engine's config checks refuse these (the CUDA kernel says so)
        std::fprintf(stderr, "moeQbDualUpdate: needs 1 <= k < n, got k %d of n %d\n", k, n);
        std::abort();
    }
    // per token: the k+1 best of scores - beta (torch.topk(k + 1, dim=1)); alpha = the (k+1)-th value
    std::vector<uint32_t> key(static_cast<size_t>(n));
    std::vector<float> alpha(static_cast<size_t>(m));
    std::vector<int> order(static_cast<size_t>(n));
    for (int t = 0; t < m; ++t) {
        const float* s = S + size_t(t) * n;
        for (int j = 0; j < n; ++j) {
            key[size_t(j)] = hd::floatOrderKey(s[j] - beta[j]);
            order[size_t(j)] = j;
        }
        std::partial_sort(order.begin(), order.begin() + k + 1, order.end(), [&](int a, int b) {
            return key[size_t(a)] > key[size_t(b)] || (key[size_t(a)] == key[size_t(b)] && a < b);
        });
        if (indices)
            for (int j = 0; j < k; ++j) indices[size_t(t) * k + size_t(j)] = order[size_t(j)];
        alpha[size_t(t)] = hd::floatOfOrderKey(key[size_t(order[size_t(k)])]);
    }
    if (!quantile) return;
    // per expert: the (m*k/n + 1)-th largest of scores[:, j] - alpha (torch.topk(c + 1, dim=0).values[-1])
    const int c = int(int64_t(m) * k / n);
    std::vector<uint32_t> col(static_cast<size_t>(m));
    for (int j = 0; j < n; ++j) {
        for (int t = 0; t < m; ++t) col[size_t(t)] = hd::floatOrderKey(S[size_t(t) * n + size_t(j)] - alpha[size_t(t)]);
        std::nth_element(col.begin(), col.begin() + c, col.end(), std::greater<uint32_t>());
        quantile[j] = hd::floatOfOrderKey(col[size_t(c)]);
    }
}

}  // namespace ts::kernels::cpu
