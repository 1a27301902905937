// MoE row movement and the experts' elementwise parts on device (ops_cuda.h; the oracle is
// kernels/cpu/moe.cpp). Each output element is produced by one thread in the oracle's order:
// gathers are copies; gatherSumRows adds a token's rows in index order; the dot products of
// moeProbGrad and sigmoidGate* and the column sums of weightedColumnSum and the gate's dw run
// sequentially in double, one thread per row or column. So all of them are bit-identical to the
// CPU, except exp() in sigmoidGateForward (CUDA's double exp is correctly rounded to within 1
// ulp, as glibc's: equal to ~1e-16 before the float conversion). Simple, not tuned: one thread
// per row for the row dots is the next thing to speed up. moeRouterProbsBackward (one thread per
// token) rounds every double step; its CPU twin may fuse multiply-adds, so the two agree to ~1e-16
// before the float conversion.
#include "kernels/common/bf16.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace ts::kernels::cuda {

namespace {

constexpr int kThreads = 256;

using detail::globalThread;
using detail::gridThreads;

__global__ void gatherRowsKernel(const float* __restrict__ src, const int32_t* __restrict__ idx,
                                 float* __restrict__ dst, int rows, int cols) {
    const int64_t n = static_cast<int64_t>(rows) * cols;
    for (int64_t i = globalThread(); i < n; i += gridThreads()) {
        const int64_t r = i / cols, c = i % cols;
        const int32_t from = idx[r];
        dst[i] = from < 0 ? 0.0f : src[static_cast<int64_t>(from) * cols + c];
    }
}

__global__ void gatherSumRowsKernel(const float* __restrict__ src, const int32_t* __restrict__ start,
                                    const int32_t* __restrict__ idx, float* __restrict__ dst, int outRows,
                                    int cols) {
    const int64_t n = static_cast<int64_t>(outRows) * cols;
    for (int64_t i = globalThread(); i < n; i += gridThreads()) {
        const int64_t t = i / cols, c = i % cols;
        float acc = dst[i];
        for (int j = start[t]; j < start[t + 1]; ++j) acc = __fadd_rn(acc, src[static_cast<int64_t>(idx[j]) * cols + c]);
        dst[i] = acc;
    }
}

__global__ void scaleRowsKernel(const float* __restrict__ x, int64_t xRowStride, const float* __restrict__ s,
                                float* __restrict__ y, int rows, int cols) {
    const int64_t n = static_cast<int64_t>(rows) * cols;
    for (int64_t i = globalThread(); i < n; i += gridThreads()) {
        const int64_t r = i / cols, c = i % cols;
        y[i] = __fmul_rn(x[r * xRowStride + c], s[r]);
    }
}

// One thread per row: the dots in double in index order, dact elementwise.
__global__ void moeProbGradReduceKernel(const float* __restrict__ da, const float* __restrict__ act,
                                        const float* __restrict__ prob, const float* __restrict__ dy,
                                        const float* __restrict__ b2, float* __restrict__ dact,
                                        float* __restrict__ dprob, int rows, int F, int h) {
    for (int64_t r = globalThread(); r < rows; r += gridThreads()) {
        const float* d = da + r * F;
        const float* a = act + r * F;
        float* o = dact + r * F;
        const float p = prob[r];
        double dp = 0;
        for (int f = 0; f < F; ++f) {
            dp = __dadd_rn(dp, __dmul_rn(static_cast<double>(d[f]), static_cast<double>(a[f])));
            o[f] = __fmul_rn(d[f], p);
        }
        if (b2) {
            const float* g = dy + r * h;
            double bias = 0;
            for (int i = 0; i < h; ++i)
                bias = __dadd_rn(bias, __dmul_rn(static_cast<double>(g[i]), static_cast<double>(b2[i])));
            dp = __dadd_rn(dp, bias);
        }
        dprob[r] = static_cast<float>(dp);
    }
}

// One thread per column, rows in order.
__global__ void weightedColumnSumReduceKernel(const float* __restrict__ dy, const float* __restrict__ w,
                                              float* __restrict__ db, int rows, int cols) {
    for (int64_t c = globalThread(); c < cols; c += gridThreads()) {
        double acc = 0;
        for (int r = 0; r < rows; ++r)
            acc = __dadd_rn(acc, __dmul_rn(static_cast<double>(dy[static_cast<int64_t>(r) * cols + c]),
                                           static_cast<double>(w[r])));
        db[c] = __fadd_rn(db[c], static_cast<float>(acc));
    }
}

__global__ void sigmoidGateForwardKernel(const float* __restrict__ x, const float* __restrict__ w,
                                         const float* __restrict__ y, float* __restrict__ gate,
                                         float* __restrict__ out, int T, int h, bool bf16Gate) {
    for (int64_t t = globalThread(); t < T; t += gridThreads()) {
        const float* xt = x + t * h;
        double z = 0;
        for (int i = 0; i < h; ++i)
            z = __dadd_rn(z, __dmul_rn(static_cast<double>(xt[i]), static_cast<double>(w[i])));
        float g = static_cast<float>(1.0 / (1.0 + exp(-z)));
        if (bf16Gate) g = hd::bf16RoundFloat(g);
        gate[t] = g;
        const float* yt = y + t * h;
        float* o = out + t * h;
        for (int i = 0; i < h; ++i) o[i] = __fmul_rn(yt[i], g);
    }
}

// Per token: dz into the scratch, dy and dx.
__global__ void sigmoidGateRowsKernel(const float* __restrict__ dout, const float* __restrict__ y,
                                      const float* __restrict__ gate, const float* __restrict__ w,
                                      float* __restrict__ dyOut, float* __restrict__ dx, double* __restrict__ dz,
                                      int T, int h) {
    for (int64_t t = globalThread(); t < T; t += gridThreads()) {
        const float* d = dout + t * h;
        const float* yt = y + t * h;
        const float g = gate[t];
        double dg = 0;
        for (int i = 0; i < h; ++i)
            dg = __dadd_rn(dg, __dmul_rn(static_cast<double>(d[i]), static_cast<double>(yt[i])));
        const double z = __dmul_rn(__dmul_rn(dg, static_cast<double>(g)), __dadd_rn(1.0, -static_cast<double>(g)));
        dz[t] = z;
        float* o = dyOut + t * h;
        float* dxt = dx + t * h;
        for (int i = 0; i < h; ++i) {
            o[i] = __fmul_rn(d[i], g);
            dxt[i] = static_cast<float>(__dmul_rn(z, static_cast<double>(w[i])));
        }
    }
}

// dw[i] += sum_t dz_t x[t, i], one thread per column.
__global__ void sigmoidGateWeightKernel(const float* __restrict__ x, const double* __restrict__ dz,
                                        float* __restrict__ dw, int T, int h) {
    for (int64_t i = globalThread(); i < h; i += gridThreads()) {
        double acc = 0;
        for (int t = 0; t < T; ++t)
            acc = __dadd_rn(acc, __dmul_rn(dz[t], static_cast<double>(x[static_cast<int64_t>(t) * h + i])));
        dw[i] = __fadd_rn(dw[i], static_cast<float>(acc));
    }
}

// One thread per token: the dot over its slots in order, then each expert's value in double (the
// oracle's moeRouterProbsBackward); a slot's grad is read again where it is used (any top-k).
__device__ double routerSlotGrad(const float* dprob, int32_t row) {
    return row < 0 ? 0.0 : static_cast<double>(dprob[row]);
}
__global__ void moeRouterProbsGradReduceKernel(const float* __restrict__ dprob, const int32_t* __restrict__ rowOf,
                                               const int32_t* __restrict__ sel, const float* __restrict__ a,
                                               const float* __restrict__ b, const float* __restrict__ c,
                                               const float* __restrict__ full, float* __restrict__ dl, int T, int K,
                                               int E) {
    for (int64_t t = globalThread(); t < T; t += gridThreads()) {
        const int64_t tk = t * K;
        double dot = 0;
        for (int j = 0; j < K; ++j)
            dot = __dadd_rn(dot, __dmul_rn(static_cast<double>(b[tk + j]), routerSlotGrad(dprob, rowOf[tk + j])));
        float* d = dl + t * E;
        const float* f = full ? full + t * E : nullptr;
        for (int e = 0; e < E; ++e) {
            double v = static_cast<double>(d[e]);
            if (f) v = __dsub_rn(v, __dmul_rn(static_cast<double>(f[e]), dot));
            for (int j = 0; j < K; ++j)
                if (sel[tk + j] == e)
                    v = __dadd_rn(v, __dsub_rn(__dmul_rn(static_cast<double>(a[tk + j]),
                                                         routerSlotGrad(dprob, rowOf[tk + j])),
                                               __dmul_rn(static_cast<double>(c[tk + j]), dot)));
            d[e] = static_cast<float>(v);
        }
    }
}

// One thread per token (the oracle's moeRouterAuxBackward): its group's weights recomputed per
// expert from the counts (G is the microbatch's sequences at most), the softmax, lse and aux
// scores in double, then each expert's value.
__device__ double routerAuxWeight(const float* counts, const float* global, int E, int G, int g, int e, double wAux,
                                  double wSeq, double wGlobal) {
    double total = 0;
    if (counts)
        for (int k = 0; k < G; ++k) total += static_cast<double>(counts[static_cast<int64_t>(k) * E + e]);
    double v = wAux * total;
    if (counts) v += wSeq * static_cast<double>(counts[static_cast<int64_t>(g) * E + e]);
    if (global) v += wGlobal * static_cast<double>(global[e]);
    return v;
}
__device__ double routerAuxScore(cpu::MoeScore score, double x) {
    if (score == cpu::MoeScore::Sigmoid) return 1.0 / (1.0 + exp(-x));
    return sqrt(x > 20 ? x : log1p(exp(x)));
}
__device__ double routerAuxScoreGrad(cpu::MoeScore score, double x) {
    const double sg = 1.0 / (1.0 + exp(-x));
    if (score == cpu::MoeScore::Sigmoid) return sg * (1 - sg);
    return sg / (2 * sqrt(x > 20 ? x : log1p(exp(x))));
}
__global__ void moeRouterAuxGradReduceKernel(const float* __restrict__ logits, const float* __restrict__ counts,
                                             const float* __restrict__ global, float* __restrict__ dl, int T, int E,
                                             int G, int microBatch, cpu::MoeScore score, double wAux, double wSeq,
                                             double wGlobal, double zScale) {
    for (int64_t t = globalThread(); t < T; t += gridThreads()) {
        const float* l = logits + t * E;
        const int g = static_cast<int>((t % microBatch) % G);
        double mx = static_cast<double>(l[0]);
        for (int e = 1; e < E; ++e) mx = detail::maxAsStd(mx, static_cast<double>(l[e]));  // the oracle's std::max
        double se = 0;
        for (int e = 0; e < E; ++e) se += exp(static_cast<double>(l[e]) - mx);
        const double lse = mx + log(se);
        double S = 0;
        if (score != cpu::MoeScore::Softmax)
            for (int e = 0; e < E; ++e) S += routerAuxScore(score, l[e]);
        const auto prob = [&](int e) {
            return score == cpu::MoeScore::Softmax ? exp(static_cast<double>(l[e]) - mx) / se
                                                   : routerAuxScore(score, l[e]) / (S + 1e-20);
        };
        double dot = 0;
        for (int e = 0; e < E; ++e) dot += routerAuxWeight(counts, global, E, G, g, e, wAux, wSeq, wGlobal) * prob(e);
        float* d = dl + t * E;
        for (int e = 0; e < E; ++e) {
            const double w = routerAuxWeight(counts, global, E, G, g, e, wAux, wSeq, wGlobal);
            const double v = score == cpu::MoeScore::Softmax
                                 ? prob(e) * (w - dot)
                                 : (w - dot) / (S + 1e-20) * routerAuxScoreGrad(score, l[e]);
            d[e] = static_cast<float>(v + zScale * lse * (exp(static_cast<double>(l[e]) - mx) / se));
        }
    }
}

Status checkShape(const char* op, int64_t a, int64_t b) {
    if (a < 0 || b < 0) return Status::invalid(std::string(op) + ": negative size");
    return Status::ok();
}

}  // namespace

Status gatherRows(const float* src, const int32_t* idx, float* dst, int rows, int cols, void* stream) {
    TS_RETURN_IF_ERROR(checkShape("gatherRows", rows, cols));
    const int64_t n = static_cast<int64_t>(rows) * cols;
    if (n == 0) return Status::ok();
    gatherRowsKernel<<<detail::blocksFor(n, kThreads), kThreads, 0, detail::asStream(stream)>>>(src, idx, dst, rows,
                                                                                                 cols);
    return detail::launchStatus("gatherRows launch");
}

Status gatherSumRows(const float* src, const int32_t* start, const int32_t* idx, float* dst, int outRows, int cols,
                     void* stream) {
    TS_RETURN_IF_ERROR(checkShape("gatherSumRows", outRows, cols));
    const int64_t n = static_cast<int64_t>(outRows) * cols;
    if (n == 0) return Status::ok();
    gatherSumRowsKernel<<<detail::blocksFor(n, kThreads), kThreads, 0, detail::asStream(stream)>>>(
        src, start, idx, dst, outRows, cols);
    return detail::launchStatus("gatherSumRows launch");
}

Status scaleRows(const float* x, int64_t xRowStride, const float* s, float* y, int rows, int cols, void* stream) {
    TS_RETURN_IF_ERROR(checkShape("scaleRows", rows, cols));
    const int64_t n = static_cast<int64_t>(rows) * cols;
    if (n == 0) return Status::ok();
    scaleRowsKernel<<<detail::blocksFor(n, kThreads), kThreads, 0, detail::asStream(stream)>>>(x, xRowStride, s, y,
                                                                                                rows, cols);
    return detail::launchStatus("scaleRows launch");
}

Status moeProbGrad(const float* da, const float* act, const float* prob, const float* dy, const float* b2,
                   float* dact, float* dprob, int rows, int F, int h, void* stream) {
    TS_RETURN_IF_ERROR(checkShape("moeProbGrad", rows, F));
    if (rows == 0) return Status::ok();
    moeProbGradReduceKernel<<<detail::blocksFor(rows, kThreads), kThreads, 0, detail::asStream(stream)>>>(
        da, act, prob, dy, b2, dact, dprob, rows, F, h);
    return detail::launchStatus("moeProbGrad launch");
}

Status weightedColumnSum(const float* dy, const float* w, float* db, int rows, int cols, void* stream) {
    TS_RETURN_IF_ERROR(checkShape("weightedColumnSum", rows, cols));
    if (cols == 0) return Status::ok();
    weightedColumnSumReduceKernel<<<detail::blocksFor(cols, kThreads), kThreads, 0, detail::asStream(stream)>>>(
        dy, w, db, rows, cols);
    return detail::launchStatus("weightedColumnSum launch");
}

Status sigmoidGateForward(const float* x, const float* w, const float* y, float* gate, float* out, int T, int h,
                          bool bf16Gate, void* stream) {
    TS_RETURN_IF_ERROR(checkShape("sigmoidGateForward", T, h));
    if (T == 0) return Status::ok();
    sigmoidGateForwardKernel<<<detail::blocksFor(T, kThreads), kThreads, 0, detail::asStream(stream)>>>(
        x, w, y, gate, out, T, h, bf16Gate);
    return detail::launchStatus("sigmoidGateForward launch");
}

Status sigmoidGateBackward(const float* dout, const float* y, const float* x, const float* gate, const float* w,
                           float* dy, float* dx, float* dw, int T, int h, void* stream) {
    TS_RETURN_IF_ERROR(checkShape("sigmoidGateBackward", T, h));
    if (T == 0) return Status::ok();
    cudaStream_t s = detail::asStream(stream);
    void* dz = nullptr;
    TS_RETURN_IF_ERROR(detail::fromCuda(cudaMallocAsync(&dz, sizeof(double) * T, s),
                                        "sigmoidGateBackward scratch (cudaMallocAsync)"));
    sigmoidGateRowsKernel<<<detail::blocksFor(T, kThreads), kThreads, 0, s>>>(dout, y, gate, w, dy, dx,
                                                                              static_cast<double*>(dz), T, h);
    const Status rows = detail::launchStatus("sigmoidGateBackward rows launch");
    if (rows.isOk() && h > 0)
        sigmoidGateWeightKernel<<<detail::blocksFor(h, kThreads), kThreads, 0, s>>>(x, static_cast<const double*>(dz),
                                                                                    dw, T, h);
    const Status weight = rows.isOk() ? detail::launchStatus("sigmoidGateBackward weight launch") : rows;
    const Status freed = detail::fromCuda(cudaFreeAsync(dz, s), "sigmoidGateBackward scratch (cudaFreeAsync)");
    return weight.isOk() ? freed : weight;
}

Status moeRouterProbsBackward(const float* dprob, const int32_t* rowOf, const int32_t* sel, const float* a,
                              const float* b, const float* c, const float* full, float* dl, int T, int K, int E,
                              void* stream) {
    TS_RETURN_IF_ERROR(checkShape("moeRouterProbsBackward", T, E));
    if (K < 0) return Status::invalid("moeRouterProbsBackward: negative top-k");
    if (T == 0 || K == 0) return Status::ok();
    moeRouterProbsGradReduceKernel<<<detail::blocksFor(T, kThreads), kThreads, 0, detail::asStream(stream)>>>(
        dprob, rowOf, sel, a, b, c, full, dl, T, K, E);
    return detail::launchStatus("moeRouterProbsBackward launch");
}

Status moeRouterAuxBackward(const float* logits, const float* counts, const float* global, float* dl, int T, int E,
                            int G, int microBatch, cpu::MoeScore score, double wAux, double wSeq, double wGlobal,
                            double zScale, void* stream) {
    TS_RETURN_IF_ERROR(checkShape("moeRouterAuxBackward", T, E));
    if (G < 1 || microBatch < 1) return Status::invalid("moeRouterAuxBackward: groups and microBatch must be >= 1");
    if (T == 0 || E == 0) return Status::ok();
    moeRouterAuxGradReduceKernel<<<detail::blocksFor(T, kThreads), kThreads, 0, detail::asStream(stream)>>>(
        logits, counts, global, dl, T, E, G, microBatch, score, wAux, wSeq, wGlobal, zScale);
    return detail::launchStatus("moeRouterAuxBackward launch");
}

}  // namespace ts::kernels::cuda
