// The MoE router's choice and plan on device (ops_cuda.h; the oracle is kernels/cpu/moe_route.cpp),
// so a step waits for no host routing: the host reads back only the experts' row offsets.
//   moeRouteTopK: one thread per token, the oracle's moeRouteToken in double, its top-k an
//     insertion into the k best in increasing expert index (ties keep the lower index);
//   moeRoutePlan: each slot's rank among its expert's slots in token order (one block per expert,
//     a warp-ballot prefix count), the offsets (one thread), then the rows and each token's rows
//     sorted (one thread per slot / token): the oracle's permutation, exactly. At a capacity, each
//     slot's keep flag (its rank by prob among its expert's slots, or in token order), then one
//     block per expert over the tokens in order for its kept and padding rows (two block prefix
//     counts), each token's rows by a one-block scan, integer atomics and a per-token sort;
//   moeRouterAuxCounts: one thread per token for its aux scores' normaliser and top-k, counted by
//     integer atomics; traced, the statistics as per-chunk partial sums (a thread per chunk of 256
//     tokens and (group, expert) column), added in chunk order;
//   moeRouterProbsCoefficients: one thread per token, as the oracle;
//   moeSinkhorn (oracle kernels/cpu/moe_balance.cpp): the iteration in one block, the same bits;
//   moeQbDualUpdate (the same oracle): each token's choice by a thread, each expert's quantile by
//     a block's radix select, exact.
// Names carry a word classifyKernel knows (index, scatter, reduce, scale).
#include "kernels/common/bf16.h"
#include "kernels/common/moe_balance.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/ops_cuda.h"

#include <algorithm>
#include <string>

namespace ts::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxK = 64, kMaxGroups = 64;

using detail::globalThread;
using detail::gridThreads;

__device__ double routeSigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
__device__ double routeScore(cpu::MoeScore f, double x) {
    return f == cpu::MoeScore::Sigmoid ? routeSigmoid(x) : sqrt(x > 20 ? x : log1p(exp(x)));
}
__device__ double routeScoreGrad(cpu::MoeScore f, double x) {
    const double s = routeSigmoid(x);
    if (f == cpu::MoeScore::Sigmoid) return s * (1 - s);
    return s / (2 * sqrt(x > 20 ? x : log1p(exp(x))));
}

// x (index i) into the sorted k best so far (m of them kept): the oracle's moeTopKRange step.
__device__ void insertBest(double x, int i, int k, int& m, int* out, double* best) {
    if (k <= 0 || (m == k && !(x > best[k - 1]))) return;
    int j = m < k ? m++ : k - 1;
    for (; j > 0 && x > best[j - 1]; --j) {
        out[j] = out[j - 1];
        best[j] = best[j - 1];
    }
    out[j] = i;
    best[j] = x;
}

// The oracle's moeTopK over v(0..E-1): with groups, the gk groups whose top K/gk values sum highest
// (summed best first), then the k best of their experts in increasing index.
template <typename V>
__device__ void chooseTopK(V v, int E, int K, int G, int gk, int* sel, double* best) {
    int m = 0;
    if (!(gk > 0 && G > 0)) {
        for (int e = 0; e < E; ++e) insertBest(v(e), e, K, m, sel, best);
        return;
    }
    const int per = E / G, kk = min(K / gk, per);
    double groupScore[kMaxGroups];
    int idx[kMaxK];
    double top[kMaxK];
    for (int g = 0; g < G; ++g) {
        int n = 0;
        for (int i = 0; i < per; ++i) insertBest(v(g * per + i), i, kk, n, idx, top);
        double s = 0;
        for (int i = 0; i < kk; ++i) s += top[i];
        groupScore[g] = s;
    }
    int kept[kMaxGroups];
    double keptScore[kMaxGroups];
    int n = 0;
    for (int g = 0; g < G; ++g) insertBest(groupScore[g], g, gk, n, kept, keptScore);
    unsigned long long mask = 0;
    for (int i = 0; i < gk; ++i) mask |= 1ull << kept[i];
    for (int e = 0; e < G * per; ++e)
        if ((mask >> (e / per)) & 1ull) insertBest(v(e), e, K, m, sel, best);
}

// The max and the sum of exp(l - max) of a token's logits, in double in order (the oracle's moeSoftmax).
__device__ void softmaxStats(const float* l, int E, double& mx, double& se) {
    mx = static_cast<double>(l[0]);
    for (int e = 1; e < E; ++e) mx = detail::maxAsStd(mx, static_cast<double>(l[e]));
    se = 0;
    for (int e = 0; e < E; ++e) se += exp(static_cast<double>(l[e]) - mx);
}

__global__ void moeRouteTopKIndexKernel(const float* __restrict__ logits, const float* __restrict__ bias,
                                        const float* __restrict__ sinkhorn, const int32_t* __restrict__ chosen,
                                        int32_t* __restrict__ topi, float* __restrict__ probs, int T, int E,
                                        cpu::MoeTopKSpec s) {
    const int K = s.K;
    for (int64_t t = globalThread(); t < T; t += gridThreads()) {
        const float* l = logits + t * E;
        double mx, se;
        softmaxStats(l, E, mx, se);
        int sel[kMaxK] = {};  // (initialised: nvcc cannot tell the lambdas below run after the choice)
        double best[kMaxK], p[kMaxK];
        // The probs of the chosen experts (the oracle's moeRouteToken): a softmax over their
        // logits; the full softmax at them; or their scores, renormalised for K > 1.
        const auto softmaxOfChosen = [&] {
            double cm = static_cast<double>(l[sel[0]]);
            for (int j = 1; j < K; ++j) cm = detail::maxAsStd(cm, static_cast<double>(l[sel[j]]));
            double cs = 0;
            for (int j = 0; j < K; ++j) cs += (p[j] = exp(static_cast<double>(l[sel[j]]) - cm));
            for (int j = 0; j < K; ++j) p[j] /= cs;
        };
        const auto soft = [&](int e) { return exp(static_cast<double>(l[e]) - mx) / se; };
        const auto fullSoftmaxAtChosen = [&] {
            for (int j = 0; j < K; ++j) p[j] = soft(sel[j]);
        };
        const auto scoresOfChosen = [&] {
            double sum = 0;
            for (int j = 0; j < K; ++j) sum += (p[j] = routeScore(s.score, l[sel[j]]));
            if (K > 1)
                for (int j = 0; j < K; ++j) p[j] /= sum + 1e-20;
        };
        const bool softmax = s.score == cpu::MoeScore::Softmax;
        if (chosen) {
            for (int j = 0; j < K; ++j) sel[j] = chosen[t * K + j];
            if (softmax && !s.preSoftmax) softmaxOfChosen();
            else if (softmax) fullSoftmaxAtChosen();
            else scoresOfChosen();
        } else if (sinkhorn) {
            const float* row = sinkhorn + t * E;
            chooseTopK([&](int e) { return static_cast<double>(row[e]); }, E, K, 0, 0, sel, best);
            if (K == 1) p[0] = routeSigmoid(l[sel[0]]);
            else fullSoftmaxAtChosen();
        } else if (softmax && !s.preSoftmax) {
            chooseTopK([&](int e) { return static_cast<double>(l[e]); }, E, K, s.numGroups, s.groupTopk, sel, best);
            softmaxOfChosen();
        } else if (softmax) {
            chooseTopK(soft, E, K, s.numGroups, s.groupTopk, sel, best);
            fullSoftmaxAtChosen();
        } else {
            chooseTopK(
                [&](int e) {
                    return routeScore(s.score, l[e]) + (bias ? static_cast<double>(bias[e]) : 0.0);
                },
                E, K, s.numGroups, s.groupTopk, sel, best);
            scoresOfChosen();
        }
        if (!sinkhorn && s.scale != 0)
            for (int j = 0; j < K; ++j) p[j] *= s.scale;
        for (int j = 0; j < K; ++j) {
            const float q = static_cast<float>(p[j]);
            topi[t * K + j] = sel[j];
            probs[t * K + j] = s.bf16Probs ? hd::bf16RoundFloat(q) : q;
        }
    }
}

// Sinkhorn in one block (the oracle's iteration, kernels/cpu/moe_balance.cpp, the same bits): out
// holds exp(cost) until the last pass scales it; d0 [T], d1 and d1old [E], part [chunks, E] are
// global scratch, each pass's writes seen by the next after __syncthreads. Per pass: a thread per
// token for its row (expert order), a thread per (chunk, expert) for the column's partial sums,
// a thread per expert for the sum of its partials in chunk order; thread 0 the error and whether
// to go on. One block keeps the loop on the device (no host check per iteration, which Megatron's
// torch loop does): about T*E/1024 dependent adds per thread and pass.
__global__ void __launch_bounds__(1024) moeSinkhornReduceKernel(const float* __restrict__ cost, float* __restrict__ out,
                                        float* __restrict__ d0, float* __restrict__ d1, float* __restrict__ d1old,
                                        float* __restrict__ part, int T, int E, float tol) {
    __shared__ float error;
    __shared__ int more;
    const int tid = threadIdx.x, nt = blockDim.x;
    const int64_t n = int64_t(T) * E;
    const int chunks = (T + hd::kSinkhornChunk - 1) / hd::kSinkhornChunk;
    for (int64_t i = tid; i < n; i += nt) out[i] = static_cast<float>(exp(static_cast<double>(cost[i])));
    for (int e = tid; e < E; e += nt) d1[e] = d1old[e] = 1.f;
    for (int t = tid; t < T; t += nt) d0[t] = 0.f;  // as the oracle's, should no pass run
    if (tid == 0) error = 1e9f;
    const float invT = __fdiv_rn(1.f, static_cast<float>(T)), invE = __fdiv_rn(1.f, static_cast<float>(E));
    const float eps = hd::kSinkhornEps;
    for (int it = 0;; ++it) {
        __syncthreads();
        if (tid == 0) more = error > tol && it < hd::kSinkhornMaxIters;
        __syncthreads();
        if (!more) break;
        for (int t = tid; t < T; t += nt) {
            const float* c = out + int64_t(t) * E;
            float acc = 0;
            for (int e = 0; e < E; ++e) acc = __fadd_rn(acc, __fmul_rn(d1[e], c[e]));
            d0[t] = __fdiv_rn(invT, __fadd_rn(acc, eps));
        }
        __syncthreads();
        for (int w = tid; w < chunks * E; w += nt) {
            const int q = w / E, e = w % E;
            const int end = min(T, (q + 1) * hd::kSinkhornChunk);
            float acc = 0;
            for (int t = q * hd::kSinkhornChunk; t < end; ++t)
                acc = __fadd_rn(acc, __fmul_rn(d0[t], out[int64_t(t) * E + e]));
            part[w] = acc;
        }
        __syncthreads();
        for (int e = tid; e < E; e += nt) {
            float acc = 0;
            for (int q = 0; q < chunks; ++q) acc = __fadd_rn(acc, part[int64_t(q) * E + e]);
            d1[e] = __fdiv_rn(invE, __fadd_rn(acc, eps));
        }
        __syncthreads();
        if (tid == 0) {
            float diff = 0;
            for (int e = 0; e < E; ++e) diff = __fadd_rn(diff, fabsf(__fsub_rn(d1old[e], d1[e])));
            error = __fdiv_rn(diff, static_cast<float>(E));
            for (int e = 0; e < E; ++e) d1old[e] = d1[e];
        }
    }
    for (int64_t i = tid; i < n; i += nt)
        out[i] = __fmul_rn(__fmul_rn(d1[i % E], out[i]), d0[i / E]);
}

// Quantile balancing's choice, a thread per token: the k+1 best of scores - beta by their order
// keys, inserted in increasing expert index (ties keep the lower one); the first k into indices,
// the (k+1)-th value into alpha (either may be null).
__global__ void moeQbChoiceIndexKernel(const float* __restrict__ S, const float* __restrict__ beta, int m, int n,
                                       int k, int32_t* __restrict__ indices, float* __restrict__ alpha) {
    for (int64_t t = globalThread(); t < m; t += gridThreads()) {
        const float* s = S + t * n;
        int sel[kMaxK + 1];
        double best[kMaxK + 1];
        int kept = 0;
        for (int j = 0; j < n; ++j)
            insertBest(static_cast<double>(hd::floatOrderKey(__fsub_rn(s[j], beta[j]))), j, k + 1, kept, sel, best);
        if (indices)
            for (int j = 0; j < k; ++j) indices[t * k + j] = sel[j];
        if (alpha) alpha[t] = hd::floatOfOrderKey(static_cast<uint32_t>(best[k]));
    }
}

// Quantile balancing's quantile, a block per expert j: the c-th largest (from 0) of
// S[:, j] - alpha over the m tokens by a radix select on the order keys, 8 bits a pass from the
// top (a shared histogram of the keys that match the bits chosen so far), exact.
__global__ void moeQbQuantileReduceKernel(const float* __restrict__ S, const float* __restrict__ alpha, int m, int n,
                                          int c, float* __restrict__ quantile) {
    __shared__ int hist[256];
    __shared__ uint32_t prefixS;
    __shared__ int wantS;
    const int j = blockIdx.x;
    if (threadIdx.x == 0) {
        prefixS = 0;
        wantS = c;
    }
    uint32_t mask = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
        __syncthreads();
        const uint32_t prefix = prefixS;
        for (int t = threadIdx.x; t < m; t += blockDim.x) {
            const uint32_t key = hd::floatOrderKey(__fsub_rn(S[int64_t(t) * n + j], alpha[t]));
            if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int above = 0, want = wantS;
            for (int b = 255; b >= 0; --b) {
                if (above + hist[b] > want) {
                    prefixS = prefix | (static_cast<uint32_t>(b) << shift);
                    wantS = want - above;
                    break;
                }
                above += hist[b];
            }
        }
        mask |= 255u << shift;
        __syncthreads();
    }
    if (threadIdx.x == 0) quantile[j] = hd::floatOfOrderKey(prefixS);
}

// One block per expert: the rank of each of its slots among them in token-major order (into rank),
// and their number (into count[e], and routed[e] unless null).
__global__ void moeRoutePlanRankReduceKernel(const int32_t* __restrict__ topi, int64_t TK, int E,
                                             int32_t* __restrict__ rank, int32_t* __restrict__ count,
                                             int32_t* __restrict__ routed) {
    __shared__ int warpTotals[kThreads / 32];
    __shared__ int running;
    const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
    for (int e = static_cast<int>(blockIdx.x); e < E; e += static_cast<int>(gridDim.x)) {
        if (tid == 0) running = 0;
        __syncthreads();
        for (int64_t base = 0; base < TK; base += kThreads) {
            const int64_t i = base + tid;
            const bool mine = i < TK && topi[i] == e;
            const unsigned ballot = __ballot_sync(0xffffffffu, mine);
            if (lane == 0) warpTotals[warp] = __popc(ballot);
            __syncthreads();
            int before = running;
            for (int w = 0; w < warp; ++w) before += warpTotals[w];
            if (mine) rank[i] = before + __popc(ballot & ((1u << lane) - 1u));
            __syncthreads();
            if (tid == 0)
                for (int w = 0; w < kThreads / 32; ++w) running += warpTotals[w];
            __syncthreads();
        }
        if (tid == 0) {
            count[e] = running;
            if (routed) routed[e] = running;
        }
        __syncthreads();
    }
}

__global__ void moeRoutePlanOffsetsReduceKernel(int32_t* offset, int E) {
    if (globalThread() != 0) return;
    offset[0] = 0;
    for (int e = 0; e < E; ++e) offset[e + 1] += offset[e];
}

__global__ void moeRoutePlanRowsScatterKernel(const int32_t* __restrict__ topi, const float* __restrict__ probs,
                                              const int32_t* __restrict__ rank, const int32_t* __restrict__ offset,
                                              int64_t TK, int K, int E, int32_t* __restrict__ tok,
                                              int32_t* __restrict__ tokExp, int32_t* __restrict__ rowOf,
                                              float* __restrict__ probT) {
    for (int64_t i = globalThread(); i < TK; i += gridThreads()) {
        const int32_t e = topi[i], t = static_cast<int32_t>(i / K);
        const int32_t r = offset[e] + rank[i];
        tok[r] = t;
        tokExp[r] = t * E + e;
        probT[r] = probs[i];
        rowOf[i] = r;
    }
}

// Per token: its first row index (start) and its rows ascending (inv).
__global__ void moeRoutePlanTokenIndexKernel(const int32_t* __restrict__ rowOf, int T, int K,
                                             int32_t* __restrict__ start, int32_t* __restrict__ inv) {
    for (int64_t t = globalThread(); t <= T; t += gridThreads()) {
        start[t] = static_cast<int32_t>(t * K);
        if (t == T) continue;
        int32_t* rows = inv + t * K;
        for (int j = 0; j < K; ++j) {
            const int32_t r = rowOf[t * K + j];
            int i = j;
            for (; i > 0 && rows[i - 1] > r; --i) rows[i] = rows[i - 1];
            rows[i] = r;
        }
    }
}

// ---- the plan at a capacity ----

// The exclusive count of `flag` over the block's threads before this one, plus `running` (block
// shared), which then advances by the block's total. Every thread of the block calls it.
__device__ int blockPrefixCount(bool flag, int* warpTotals, int& running) {
    const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
    const unsigned ballot = __ballot_sync(0xffffffffu, flag);
    if (lane == 0) warpTotals[warp] = __popc(ballot);
    __syncthreads();
    int before = running + __popc(ballot & ((1u << lane) - 1u));
    for (int w = 0; w < warp; ++w) before += warpTotals[w];
    __syncthreads();
    if (tid == 0)
        for (int w = 0; w < kThreads / 32; ++w) running += warpTotals[w];
    __syncthreads();
    return before;
}

// Each expert's slots in token order, expert-major: list[base[e] + rank[i]] = i.
__global__ void moeRouteCapacityListScatterKernel(const int32_t* __restrict__ topi, const int32_t* __restrict__ rank,
                                                  const int32_t* __restrict__ base, int64_t TK,
                                                  int32_t* __restrict__ list) {
    for (int64_t i = globalThread(); i < TK; i += gridThreads()) list[base[topi[i]] + rank[i]] = static_cast<int32_t>(i);
}

// The oracle's moeCapacityKey: a NaN prob ranks as -inf.
__device__ float capacityKey(float p) { return p != p ? -INFINITY : p; }

// Whether the expert keeps slot i: all of its slots under the capacity; over it, the first `cap`
// in token order, or byProb the `cap` with the highest probs (ties: the earlier token), counted
// among the expert's slots (list).
__global__ void moeRouteCapacityKeepIndexKernel(const int32_t* __restrict__ topi, const float* __restrict__ probs,
                                                const int32_t* __restrict__ rank, const int32_t* __restrict__ base,
                                                const int32_t* __restrict__ list, int64_t TK, int cap, bool byProb,
                                                int32_t* __restrict__ keep) {
    for (int64_t i = globalThread(); i < TK; i += gridThreads()) {
        const int32_t e = topi[i], b = base[e], n = base[e + 1] - b;
        bool kept = n <= cap;
        if (!kept && !byProb) kept = rank[i] < cap;
        if (!kept && byProb) {
            const float p = capacityKey(probs[i]);
            int ahead = 0;
            for (int32_t q = 0; q < n && ahead < cap; ++q) {
                const int32_t other = list[b + q];
                const float po = capacityKey(probs[other]);
                ahead += po > p || (po == p && other < i);
            }
            kept = ahead < cap;
        }
        keep[i] = kept ? 1 : 0;
    }
}

// The experts' first rows: each keeps min(copies, cap) rows, padded min(cap, T).
__global__ void moeRouteCapacityOffsetsReduceKernel(const int32_t* __restrict__ base, int E, int T, int cap, bool pad,
                                                    int32_t* __restrict__ offset) {
    if (globalThread() != 0) return;
    offset[0] = 0;
    for (int e = 0; e < E; ++e) {
        const int n = base[e + 1] - base[e];
        offset[e + 1] = offset[e] + (pad ? min(cap, T) : min(n, cap));
    }
}

// One block per expert, over the tokens in order: a row for each token whose copy it keeps and,
// padded, for the earliest `cap - kept` tokens it does not keep (prob 0); each token's rows
// counted into tokenRows (integer atomics).
__global__ void moeRouteCapacityRowsScatterKernel(const int32_t* __restrict__ topi, const float* __restrict__ probs,
                                                  const int32_t* __restrict__ keep, const int32_t* __restrict__ base,
                                                  const int32_t* __restrict__ offset, int T, int K, int E, int cap,
                                                  bool pad, int32_t* __restrict__ tok, int32_t* __restrict__ tokExp,
                                                  int32_t* __restrict__ rowOf, float* __restrict__ probT,
                                                  int32_t* __restrict__ tokenRows) {
    __shared__ int warpTotals[kThreads / 32];
    __shared__ int others, rows;
    const int tid = static_cast<int>(threadIdx.x);
    for (int e = static_cast<int>(blockIdx.x); e < E; e += static_cast<int>(gridDim.x)) {
        const int kept = min(base[e + 1] - base[e], cap), need = pad ? cap - kept : 0;
        const int r0 = offset[e], rowsE = offset[e + 1] - r0;
        if (tid == 0) others = rows = 0;
        __syncthreads();
        for (int b = 0; b < T && rows < rowsE; b += kThreads) {  // rows: the same for the whole block
            const int t = b + tid;
            int64_t slot = -1;
            if (t < T)
                for (int j = 0; j < K; ++j) {
                    const int64_t i = static_cast<int64_t>(t) * K + j;
                    if (topi[i] == e) {
                        if (keep[i]) slot = i;
                        break;
                    }
                }
            const bool member = slot >= 0;
            const int other = blockPrefixCount(t < T && !member, warpTotals, others);
            const bool isRow = member || (t < T && other < need);
            const int pos = blockPrefixCount(isRow, warpTotals, rows);
            if (isRow && pos < rowsE) {  // (always, with the keep flags' total order)
                const int32_t r = r0 + pos;
                tok[r] = t;
                tokExp[r] = t * E + e;
                probT[r] = member ? probs[slot] : 0.f;
                if (member) rowOf[slot] = r;
                atomicAdd(tokenRows + t, 1);
            }
        }
        __syncthreads();
    }
}

// One block: start = the exclusive prefix sum of each token's rows, start[T] their total.
__global__ void moeRoutePlanStartIndexKernel(const int32_t* __restrict__ tokenRows, int T, int32_t* __restrict__ start) {
    __shared__ int32_t part[1024];
    const int tid = static_cast<int>(threadIdx.x), n = static_cast<int>(blockDim.x);
    const int per = (T + n - 1) / n, a = min(T, tid * per), b = min(T, a + per);
    int32_t sum = 0;
    for (int i = a; i < b; ++i) sum += tokenRows[i];
    part[tid] = sum;
    __syncthreads();
    if (tid == 0) {
        int32_t run = 0;
        for (int w = 0; w < n; ++w) {
            const int32_t v = part[w];
            part[w] = run;
            run += v;
        }
        start[T] = run;
    }
    __syncthreads();
    int32_t run = part[tid];
    for (int i = a; i < b; ++i) {
        start[i] = run;
        run += tokenRows[i];
    }
}

// Each of the start[T] rows into its token's entries of inv (any order: cursor's integer atomics),
// then each token's entries sorted ascending.
__global__ void moeRoutePlanRowsIndexKernel(const int32_t* __restrict__ tok, const int32_t* __restrict__ start, int T,
                                            int32_t* __restrict__ cursor, int32_t* __restrict__ inv) {
    const int32_t rows = start[T];
    for (int64_t r = globalThread(); r < rows; r += gridThreads()) {
        const int32_t t = tok[r];
        inv[start[t] + atomicAdd(cursor + t, 1)] = static_cast<int32_t>(r);
    }
}
__global__ void moeRoutePlanSortIndexKernel(const int32_t* __restrict__ start, int T, int32_t* __restrict__ inv) {
    for (int64_t t = globalThread(); t < T; t += gridThreads()) {
        int32_t* rows = inv + start[t];
        const int n = start[t + 1] - start[t];
        for (int j = 1; j < n; ++j) {
            const int32_t r = rows[j];
            int i = j;
            for (; i > 0 && rows[i - 1] > r; --i) rows[i] = rows[i - 1];
            rows[i] = r;
        }
    }
}

// Per token: the aux scores' normaliser (softmax: max and sum of exps; else the scores' sum) and
// logsumexp into norm, and the plain top-k of its aux scores counted into its group's icount
// (integer atomics: the same counts in any order).
__global__ void moeRouterAuxTopKIndexKernel(const float* __restrict__ logits, int T, int E, int K, int G,
                                            int microBatch, cpu::MoeScore score, double* __restrict__ norm,
                                            int* __restrict__ icount) {
    for (int64_t t = globalThread(); t < T; t += gridThreads()) {
        const float* l = logits + t * E;
        double mx, se;
        softmaxStats(l, E, mx, se);
        double S = 0;
        if (score != cpu::MoeScore::Softmax)
            for (int e = 0; e < E; ++e) S += routeScore(score, l[e]);
        int sel[kMaxK];
        double best[kMaxK];
        if (score == cpu::MoeScore::Softmax)
            chooseTopK([&](int e) { return exp(static_cast<double>(l[e]) - mx) / se; }, E, K, 0, 0, sel, best);
        else
            chooseTopK([&](int e) { return routeScore(score, l[e]) / (S + 1e-20); }, E, K, 0, 0, sel, best);
        if (icount) {
            const int64_t g = (t % microBatch) % G;
            for (int j = 0; j < K; ++j) atomicAdd(icount + g * E + sel[j], 1);
        }
        norm[t * 4 + 0] = mx;
        norm[t * 4 + 1] = se;
        norm[t * 4 + 2] = S;
        norm[t * 4 + 3] = mx + log(se);
    }
}

constexpr int kAuxChunk = 256;  // tokens per partial sum of the statistics

// The statistics' partial sums, one per chunk of kAuxChunk tokens (blockIdx.y) and column: column
// g*E + e sums group g's aux scores of expert e over the chunk's tokens in order (neighbouring
// threads read neighbouring logits), column G*E the lse^2.
__global__ void moeRouterAuxChunkReduceKernel(const float* __restrict__ logits, const double* __restrict__ norm,
                                              int T, int E, int G, int microBatch, cpu::MoeScore score,
                                              double* __restrict__ partial) {
    const int64_t GE = static_cast<int64_t>(G) * E;
    const int chunks = (T + kAuxChunk - 1) / kAuxChunk;
    for (int c = static_cast<int>(blockIdx.y); c < chunks; c += static_cast<int>(gridDim.y)) {
        const int t0 = c * kAuxChunk, t1 = min(T, t0 + kAuxChunk);
        for (int64_t i = globalThread(); i <= GE; i += gridThreads()) {
            double sum = 0;
            if (i == GE) {
                for (int t = t0; t < t1; ++t) sum += norm[t * 4 + 3] * norm[t * 4 + 3];
            } else {
                const int g = static_cast<int>(i / E), e = static_cast<int>(i % E);
                for (int t = t0; t < t1; ++t) {
                    if ((t % microBatch) % G != g) continue;
                    const double x = static_cast<double>(logits[static_cast<int64_t>(t) * E + e]);
                    sum += score == cpu::MoeScore::Softmax ? exp(x - norm[t * 4 + 0]) / norm[t * 4 + 1]
                                                           : routeScore(score, x) / (norm[t * 4 + 2] + 1e-20);
                }
            }
            partial[static_cast<int64_t>(c) * (GE + 1) + i] = sum;
        }
    }
}

// Per column: the chunks' partial sums added in chunk order (the same bits on every run), and the
// counts as floats.
__global__ void moeRouterAuxSumsReduceKernel(const double* __restrict__ partial, const int* __restrict__ icount,
                                             int chunks, int64_t GE, float* __restrict__ counts,
                                             float* __restrict__ stats) {
    for (int64_t i = globalThread(); i <= GE; i += gridThreads()) {
        if (counts && i < GE) counts[i] = static_cast<float>(icount[i]);
        if (!stats) continue;
        double sum = 0;
        for (int c = 0; c < chunks; ++c) sum += partial[static_cast<int64_t>(c) * (GE + 1) + i];
        stats[i] = static_cast<float>(sum);
    }
}

__global__ void moeRouterAuxTotalReduceKernel(const float* __restrict__ counts, int E, int G, float* __restrict__ total) {
    for (int64_t e = globalThread(); e < E; e += gridThreads()) {
        float c = 0;
        for (int g = 0; g < G; ++g) c += counts[static_cast<int64_t>(g) * E + e];
        total[e] = c;
    }
}

__global__ void moeRouterCoefficientsScaleKernel(const float* __restrict__ logits, const int32_t* __restrict__ topi,
                                                 int T, int E, cpu::MoeTopKSpec s, bool sinkhorn, float* __restrict__ a,
                                                 float* __restrict__ b, float* __restrict__ c, float* __restrict__ full) {
    const int K = s.K;
    const double scale = !sinkhorn && s.scale != 0 ? s.scale : 1.0;
    const bool fullSoftmax = sinkhorn ? K > 1 : s.score == cpu::MoeScore::Softmax && s.preSoftmax;
    for (int64_t t = globalThread(); t < T; t += gridThreads()) {
        const float* l = logits + t * E;
        const int32_t* sel = topi + t * K;
        float* at = a + t * K;
        float* bt = b + t * K;
        float* ct = c + t * K;
        if (fullSoftmax) {
            double mx, se;
            softmaxStats(l, E, mx, se);
            for (int e = 0; e < E; ++e) full[t * E + e] = static_cast<float>(exp(static_cast<double>(l[e]) - mx) / se);
            for (int j = 0; j < K; ++j) {
                at[j] = bt[j] = static_cast<float>(exp(static_cast<double>(l[sel[j]]) - mx) / se * scale);
                ct[j] = 0;
            }
        } else if (sinkhorn) {
            at[0] = static_cast<float>(routeScoreGrad(cpu::MoeScore::Sigmoid, l[sel[0]]));
            bt[0] = ct[0] = 0;
        } else if (s.score == cpu::MoeScore::Softmax) {
            double cm = static_cast<double>(l[sel[0]]);
            for (int j = 1; j < K; ++j) cm = detail::maxAsStd(cm, static_cast<double>(l[sel[j]]));
            double cs = 0;
            for (int j = 0; j < K; ++j) cs += exp(static_cast<double>(l[sel[j]]) - cm);
            for (int j = 0; j < K; ++j) {
                const double p = exp(static_cast<double>(l[sel[j]]) - cm) / cs;
                at[j] = bt[j] = static_cast<float>(p * scale);
                ct[j] = static_cast<float>(p);
            }
        } else {
            double S = 0;
            for (int j = 0; j < K; ++j) S += routeScore(s.score, l[sel[j]]);
            for (int j = 0; j < K; ++j) {
                const double ds = routeScoreGrad(s.score, l[sel[j]]);
                if (K > 1) {
                    at[j] = static_cast<float>(ds / (S + 1e-20) * scale);
                    bt[j] = static_cast<float>(routeScore(s.score, l[sel[j]]) / (S + 1e-20) * scale);
                    ct[j] = static_cast<float>(ds / (S + 1e-20));
                } else {
                    at[j] = static_cast<float>(ds * scale);
                    bt[j] = ct[j] = 0;
                }
            }
        }
    }
}

__global__ void moeRoutingMapScatterKernel(const int32_t* __restrict__ tokExp, const float* __restrict__ probT,
                                           int rows, int64_t TE, float* __restrict__ map) {
    for (int64_t r = globalThread(); r < rows; r += gridThreads()) {
        map[tokExp[r]] = 1.f;
        map[TE + tokExp[r]] = probT[r];
    }
}

Status checkSpec(const char* op, int T, int E, const cpu::MoeTopKSpec& s) {
    if (T < 0 || E < 1) return Status::invalid(std::string(op) + ": needs T >= 0 tokens and E >= 1 experts");
    if (s.K < 1 || s.K > kMaxK || s.K > E)
        return Status::invalid(std::string(op) + ": top-k " + std::to_string(s.K) + " outside 1.." +
                               std::to_string(std::min(kMaxK, E)));
    if (s.groupTopk > 0 && (s.numGroups < 1 || s.numGroups > kMaxGroups || s.groupTopk > s.numGroups))
        return Status::invalid(std::string(op) + ": group-limited routing needs 1 <= groupTopk <= numGroups <= " +
                               std::to_string(kMaxGroups));
    // (the config refuses these first: config_rules.cpp)
    if (s.groupTopk > 0 && (E % s.numGroups != 0 || s.K > s.groupTopk * (E / s.numGroups)))
        return Status::invalid(std::string(op) + ": group-limited routing needs the experts split evenly into the "
                                                 "groups and top-k at most the experts of groupTopk groups");
    return Status::ok();
}

// A device scratch of `bytes` from the stream-ordered allocator for the duration of `body`.
template <typename Body>
Status withScratch(const char* op, size_t bytes, cudaStream_t s, Body body) {
    void* p = nullptr;
    TS_RETURN_IF_ERROR(detail::fromCuda(cudaMallocAsync(&p, bytes, s), op));
    const Status ran = body(p);
    const Status freed = detail::fromCuda(cudaFreeAsync(p, s), op);
    return ran.isOk() ? freed : ran;
}

}  // namespace

Status moeRouteTopK(const float* logits, const float* bias, const float* sinkhorn, const int32_t* chosen,
                    int32_t* topi, float* probs, int T, int E, const cpu::MoeTopKSpec& spec, void* stream) {
    TS_RETURN_IF_ERROR(checkSpec("moeRouteTopK", T, E, spec));
    if (T == 0) return Status::ok();
    moeRouteTopKIndexKernel<<<detail::blocksFor(T, kThreads), kThreads, 0, detail::asStream(stream)>>>(
        logits, bias, sinkhorn, chosen, topi, probs, T, E, spec);
    return detail::launchStatus("moeRouteTopK launch");
}

Status moeSinkhorn(const float* cost, int T, int E, float* out, float tol, void* stream) {
    if (T < 0 || E < 0) return Status::invalid("moeSinkhorn: needs T >= 0 tokens and E >= 0 experts");
    if (T == 0 || E == 0) return Status::ok();
    cudaStream_t s = detail::asStream(stream);
    const int64_t chunks = (T + hd::kSinkhornChunk - 1) / hd::kSinkhornChunk;
    const size_t floats = size_t(T) + 2 * size_t(E) + size_t(chunks) * size_t(E);
    return withScratch("moeSinkhorn", floats * sizeof(float), s, [&](void* p) {
        float* d0 = static_cast<float*>(p);
        float* d1 = d0 + T;
        float* d1old = d1 + E;
        float* part = d1old + E;
        moeSinkhornReduceKernel<<<1, 1024, 0, s>>>(cost, out, d0, d1, d1old, part, T, E, tol);
        return detail::launchStatus("moeSinkhorn launch");
    });
}

Status moeQbDualUpdate(const float* scores, int m, int n, int k, const float* beta, int32_t* indices,
                       float* quantile, void* stream) {
    if (m < 0 || n < 1 || k < 1 || k >= n || k > kMaxK)
        return Status::invalid("moeQbDualUpdate: needs m >= 0 tokens and 1 <= k < n experts, k <= " +
                               std::to_string(kMaxK));
    if (m == 0) return Status::ok();
    cudaStream_t s = detail::asStream(stream);
    if (!quantile) {
        moeQbChoiceIndexKernel<<<detail::blocksFor(m, kThreads), kThreads, 0, s>>>(scores, beta, m, n, k, indices,
                                                                                 nullptr);
        return detail::launchStatus("moeQbDualUpdate choice launch");
    }
    const int c = static_cast<int>(int64_t(m) * k / n);
    return withScratch("moeQbDualUpdate", size_t(m) * sizeof(float), s, [&](void* p) {
        float* alpha = static_cast<float*>(p);
        moeQbChoiceIndexKernel<<<detail::blocksFor(m, kThreads), kThreads, 0, s>>>(scores, beta, m, n, k, indices,
                                                                                 alpha);
        TS_RETURN_IF_ERROR(detail::launchStatus("moeQbDualUpdate choice launch"));
        moeQbQuantileReduceKernel<<<n, kThreads, 0, s>>>(scores, alpha, m, n, c, quantile);
        return detail::launchStatus("moeQbDualUpdate quantile launch");
    });
}

Status moeRoutePlan(const int32_t* topi, const float* probs, int T, int K, int E, const cpu::MoeCapacity& capacity,
                    int32_t* offset, int32_t* routed, int32_t* tok, int32_t* start, int32_t* inv, int32_t* tokExp,
                    int32_t* rowOf, float* probT, void* stream) {
    if (T < 0 || K < 1 || E < 1) return Status::invalid("moeRoutePlan: needs T >= 0, K >= 1, E >= 1");
    cudaStream_t s = detail::asStream(stream);
    const int64_t TK = static_cast<int64_t>(T) * K;
    const int cap = capacity.cap;
    if (cap < 0) {
        // Dropless. inv holds each slot's rank until the last kernel writes the tokens' rows into it.
        moeRoutePlanRankReduceKernel<<<std::min(E, 65535), kThreads, 0, s>>>(topi, TK, E, inv, offset + 1, routed);
        TS_RETURN_IF_ERROR(detail::launchStatus("moeRoutePlan rank launch"));
        moeRoutePlanOffsetsReduceKernel<<<1, 1, 0, s>>>(offset, E);
        TS_RETURN_IF_ERROR(detail::launchStatus("moeRoutePlan offsets launch"));
        if (TK > 0) {
            moeRoutePlanRowsScatterKernel<<<detail::blocksFor(TK, kThreads), kThreads, 0, s>>>(
                topi, probs, inv, offset, TK, K, E, tok, tokExp, rowOf, probT);
            TS_RETURN_IF_ERROR(detail::launchStatus("moeRoutePlan rows launch"));
        }
        moeRoutePlanTokenIndexKernel<<<detail::blocksFor(int64_t(T) + 1, kThreads), kThreads, 0, s>>>(rowOf, T, K,
                                                                                                      start, inv);
        return detail::launchStatus("moeRoutePlan tokens launch");
    }
    // At a capacity. Scratch: each slot's rank in its expert [TK], keep flag [TK] and the slots
    // expert-major [TK]; the experts' first slots [E+1]; each token's rows [T].
    const size_t slots = size_t(std::max<int64_t>(TK, 1));
    const size_t bytes = sizeof(int32_t) * (3 * slots + size_t(E) + 1 + size_t(std::max(T, 1)));
    return withScratch("moeRoutePlan scratch", bytes, s, [&](void* p) {
        int32_t* rank = static_cast<int32_t*>(p);
        int32_t* keep = rank + slots;
        int32_t* list = keep + slots;
        int32_t* base = list + slots;
        int32_t* tokenRows = base + E + 1;
        const char* op = "moeRoutePlan (cudaMemsetAsync)";
        TS_RETURN_IF_ERROR(detail::fromCuda(cudaMemsetAsync(tokenRows, 0, sizeof(int32_t) * size_t(T), s), op));
        if (TK > 0)  // every slot's row -1 (dropped) until kept
            TS_RETURN_IF_ERROR(detail::fromCuda(cudaMemsetAsync(rowOf, 0xff, sizeof(int32_t) * size_t(TK), s), op));
        moeRoutePlanRankReduceKernel<<<std::min(E, 65535), kThreads, 0, s>>>(topi, TK, E, rank, base + 1, routed);
        TS_RETURN_IF_ERROR(detail::launchStatus("moeRoutePlan rank launch"));
        moeRoutePlanOffsetsReduceKernel<<<1, 1, 0, s>>>(base, E);
        TS_RETURN_IF_ERROR(detail::launchStatus("moeRoutePlan bases launch"));
        if (TK > 0) {
            moeRouteCapacityListScatterKernel<<<detail::blocksFor(TK, kThreads), kThreads, 0, s>>>(topi, rank, base, TK,
                                                                                                 list);
            TS_RETURN_IF_ERROR(detail::launchStatus("moeRoutePlan list launch"));
            moeRouteCapacityKeepIndexKernel<<<detail::blocksFor(TK, kThreads), kThreads, 0, s>>>(
                topi, probs, rank, base, list, TK, cap, capacity.byProb, keep);
            TS_RETURN_IF_ERROR(detail::launchStatus("moeRoutePlan keep launch"));
        }
        moeRouteCapacityOffsetsReduceKernel<<<1, 1, 0, s>>>(base, E, T, cap, capacity.pad, offset);
        TS_RETURN_IF_ERROR(detail::launchStatus("moeRoutePlan offsets launch"));
        if (T > 0) {
            moeRouteCapacityRowsScatterKernel<<<std::min(E, 65535), kThreads, 0, s>>>(
                topi, probs, keep, base, offset, T, K, E, cap, capacity.pad, tok, tokExp, rowOf, probT, tokenRows);
            TS_RETURN_IF_ERROR(detail::launchStatus("moeRoutePlan rows launch"));
        }
        moeRoutePlanStartIndexKernel<<<1, 1024, 0, s>>>(tokenRows, T, start);
        TS_RETURN_IF_ERROR(detail::launchStatus("moeRoutePlan starts launch"));
        if (T == 0) return Status::ok();
        // A grid over the rows' bound (their number, start[T], is on the device).
        const int64_t rowsMax = std::min<int64_t>(capacity.pad ? int64_t(E) * cap : TK, int64_t(E) * T);
        TS_RETURN_IF_ERROR(detail::fromCuda(cudaMemsetAsync(tokenRows, 0, sizeof(int32_t) * size_t(T), s), op));
        if (rowsMax > 0) {
            moeRoutePlanRowsIndexKernel<<<detail::blocksFor(rowsMax, kThreads), kThreads, 0, s>>>(tok, start, T,
                                                                                                tokenRows, inv);
            TS_RETURN_IF_ERROR(detail::launchStatus("moeRoutePlan inverse launch"));
        }
        moeRoutePlanSortIndexKernel<<<detail::blocksFor(T, kThreads), kThreads, 0, s>>>(start, T, inv);
        return detail::launchStatus("moeRoutePlan sort launch");
    });
}

Status moeRouterAuxCounts(const float* logits, int T, int E, int K, int G, int microBatch, cpu::MoeScore score,
                          float* counts, float* total, float* stats, void* stream) {
    if (T < 0 || E < 1 || K < 1 || K > kMaxK || K > E || G < 1 || microBatch < 1)
        return Status::invalid("moeRouterAuxCounts: needs T >= 0, 1 <= K <= min(E, 64), G >= 1, microBatch >= 1");
    if (!counts && !total && !stats) return Status::ok();
    cudaStream_t s = detail::asStream(stream);
    const int64_t GE = static_cast<int64_t>(G) * E;
    const int chunks = (T + kAuxChunk - 1) / kAuxChunk;
    // Scratch: norm [T][4], the statistics' partial sums [chunks][GE+1] (traced only), the integer
    // counts [GE], and their float copy when the caller wants only the total.
    const size_t normBytes = sizeof(double) * 4 * size_t(std::max(T, 1));
    const size_t partialBytes = stats ? sizeof(double) * size_t(std::max(chunks, 1)) * size_t(GE + 1) : 0;
    const size_t countBytes = sizeof(int) * size_t(GE);
    const size_t bytes = normBytes + partialBytes + countBytes + (counts ? 0 : sizeof(float) * size_t(GE));
    return withScratch("moeRouterAuxCounts scratch", bytes, s, [&](void* p) {
        char* at = static_cast<char*>(p);
        double* norm = reinterpret_cast<double*>(at);
        double* partial = reinterpret_cast<double*>(at + normBytes);
        int* icount = reinterpret_cast<int*>(at + normBytes + partialBytes);
        float* c = counts ? counts
                          : (total ? reinterpret_cast<float*>(at + normBytes + partialBytes + countBytes) : nullptr);
        TS_RETURN_IF_ERROR(
            detail::fromCuda(cudaMemsetAsync(icount, 0, countBytes, s), "moeRouterAuxCounts (cudaMemsetAsync)"));
        if (T > 0) {
            moeRouterAuxTopKIndexKernel<<<detail::blocksFor(T, kThreads), kThreads, 0, s>>>(
                logits, T, E, K, G, microBatch, score, norm, icount);
            TS_RETURN_IF_ERROR(detail::launchStatus("moeRouterAuxCounts top-k launch"));
        }
        if (stats && chunks > 0) {
            const dim3 grid(static_cast<unsigned>(detail::blocksFor(GE + 1, kThreads)),
                            static_cast<unsigned>(std::min(chunks, 65535)));
            moeRouterAuxChunkReduceKernel<<<grid, kThreads, 0, s>>>(logits, norm, T, E, G, microBatch, score, partial);
            TS_RETURN_IF_ERROR(detail::launchStatus("moeRouterAuxCounts chunk sums launch"));
        }
        moeRouterAuxSumsReduceKernel<<<detail::blocksFor(GE + 1, kThreads), kThreads, 0, s>>>(partial, icount, chunks,
                                                                                             GE, c, stats);
        TS_RETURN_IF_ERROR(detail::launchStatus("moeRouterAuxCounts sums launch"));
        if (total) {
            moeRouterAuxTotalReduceKernel<<<detail::blocksFor(E, kThreads), kThreads, 0, s>>>(c, E, G, total);
            TS_RETURN_IF_ERROR(detail::launchStatus("moeRouterAuxCounts total launch"));
        }
        return Status::ok();
    });
}

Status moeRouterProbsCoefficients(const float* logits, const int32_t* topi, int T, int E, const cpu::MoeTopKSpec& spec,
                                  bool sinkhorn, float* a, float* b, float* c, float* full, void* stream) {
    TS_RETURN_IF_ERROR(checkSpec("moeRouterProbsCoefficients", T, E, spec));
    if (T == 0) return Status::ok();
    moeRouterCoefficientsScaleKernel<<<detail::blocksFor(T, kThreads), kThreads, 0, detail::asStream(stream)>>>(
        logits, topi, T, E, spec, sinkhorn, a, b, c, full);
    return detail::launchStatus("moeRouterProbsCoefficients launch");
}

Status moeRoutingMap(const int32_t* tokExp, const float* probT, int rows, int64_t TE, float* map, void* stream) {
    if (rows < 0 || TE < 0) return Status::invalid("moeRoutingMap: negative size");
    cudaStream_t s = detail::asStream(stream);
    TS_RETURN_IF_ERROR(detail::fromCuda(cudaMemsetAsync(map, 0, sizeof(float) * size_t(2 * TE), s),
                                        "moeRoutingMap (cudaMemsetAsync)"));
    if (rows == 0) return Status::ok();
    moeRoutingMapScatterKernel<<<detail::blocksFor(rows, kThreads), kThreads, 0, s>>>(tokExp, probT, rows, TE, map);
    return detail::launchStatus("moeRoutingMap launch");
}

}  // namespace ts::kernels::cuda
