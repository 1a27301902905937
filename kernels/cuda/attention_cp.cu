// Context-parallel core attention on the device (kernels/cpu/attention_cp.cpp is the oracle).
//   q, out, dout, dq: [sq, b, nq, d] (global positions qPos); k, v, dk, dv: [skv, b, nkv, d].
// - All-gather variant (cpAttentionForward/Backward): the query rows against the whole
//   sequence, key j visible iff j <= qPos[i]; the masked-attention engine of attention.cu with
//   the rows' positions (probs [b, nq, sq, skv] as the CPU saves them).
// - Ring blocks (cpRingAttentionForward/Delta/Backward): one block of keys with ascending
//   global positions kPos, visible prefix per row found by binary search. Each block is two
//   strided-batched GEMMs over heads (as in attention.cu: per replica j of a query group, batched
//   over i = bi*nkv + g) plus a row kernel and, in forward, a merge kernel that folds the block
//   into the running out / lse with the CPU's double-precision log-sum-exp arithmetic.
//
// Differences from the CPU, and why: the CPU loops row by row and keeps nothing of size
// sq x skv; here the block's scores live in a stream-ordered workspace (cudaMallocAsync, at most
// kWorkspaceCapBytes, heads in chunks) so the products run on cuBLAS. The GEMMs sum in another
// order and expf is CUDA's, so results agree to a tolerance, not bitwise. Dropout keep bits are
// the CPU's exactly: element ((bi*nqTotal + headOffset + head)*S + qPos)*S + kPos, S = sTotal.
// The ring backward folds the softmax scale into dS (as the CPU) and accumulates dq with
// beta = 1; dk, dv are overwritten by the group's first query head (j = 0), the others add, in
// the CPU's order.
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/ops_cuda.h"

#include <algorithm>
#include <string>

namespace ts::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

int rowBlocks(int64_t rows) { return detail::blocksFor(rows, kWarps, 65535 * 8); }

__device__ inline double warpSumD(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

#define TS_FOR_EACH_WARP_ROW(ro, rows)                                                            \
    for (int64_t ro = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;  \
         ro < (rows); ro += static_cast<int64_t>(gridDim.x) * (blockDim.x / 32))

// One ring block's rows: row ro = t*sq + r of a chunk (head ch.head(t), query row r).
struct RingParams {
    detail::HeadChunk ch;
    int b = 0, nq = 0, sq = 0, skv = 0, d = 0;
    const int* qPos = nullptr;
    const int* kPos = nullptr;
    float scale = 0.0f;
    detail::DropoutRng rng;
    int64_t nqTotal = 0;
    int headOffset = 0;
    int64_t sTotal = 0;
};

// Keys of the block visible to a query at global position qp: the prefix kPos[j] <= qp.
__device__ inline int visibleKeys(const int* kPos, int skv, int qp) {
    int lo = 0, hi = skv;
    while (lo < hi) {
        const int mid = lo + (hi - lo) / 2;
        if (kPos[mid] <= qp)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

__device__ inline uint64_t ringMaskRow(const RingParams& p, int64_t head, int qp) {
    const int64_t bi = head / p.nq, h = head % p.nq;
    return static_cast<uint64_t>(((bi * p.nqTotal + p.headOffset + h) * p.sTotal + qp) * p.sTotal);
}

// S (workspace rows, scaled scores on entry) -> the block's unnormalised, dropped probabilities
// exp(s - max) (masked past the visible prefix); stats[2*ro] = lse of the block's row (max +
// log(sum), double), stats[2*ro+1] = the undropped sum (0: no visible key).
__global__ void ringAttentionForwardRowsKernel(RingParams p, float* __restrict__ S, double* __restrict__ stats,
                                               int64_t rows) {
    const int lane = threadIdx.x % 32;
    TS_FOR_EACH_WARP_ROW(ro, rows) {
        const int t = static_cast<int>(ro / p.sq), r = static_cast<int>(ro % p.sq);
        const int64_t head = p.ch.head(t);
        const int qp = p.qPos[r];
        const int nv = visibleKeys(p.kPos, p.skv, qp);
        float* Sr = S + ro * p.skv;
        float mx = -INFINITY;
        for (int j = lane; j < nv; j += 32) mx = fmaxf(mx, Sr[j]);
        mx = detail::warpMax(mx);
        double sum = 0.0;
        for (int j = lane; j < nv; j += 32) sum += expf(Sr[j] - mx);
        sum = warpSumD(sum);
        const uint64_t mrow = p.rng.on ? ringMaskRow(p, head, qp) : 0, rngKey = p.rng.key();
        for (int j = lane; j < p.skv; j += 32) {
            float e = 0.0f;
            if (j < nv) {
                e = expf(Sr[j] - mx);
                if (p.rng.on)
                    e = detail::dropoutKeep(rngKey, mrow + static_cast<uint64_t>(p.kPos[j]),
                                         p.rng.threshold)
                            ? e * p.rng.keepScale
                            : 0.0f;
            }
            Sr[j] = e;
        }
        if (lane == 0) {
            stats[2 * ro] = nv > 0 ? static_cast<double>(mx) + log(sum) : -INFINITY;
            stats[2 * ro + 1] = nv > 0 ? sum : 0.0;
        }
    }
}

// Folds the block (acc = its unnormalised dropout(P) V rows [chunk, sq, d], stats) into out and
// lse [b, nq, sq] exactly as the CPU: first starts from (0, -inf); a row with no visible key is
// left alone; lse = -inf takes the block's normalised result; otherwise the log-sum-exp merge.
__global__ void ringAttentionMergeKernel(RingParams p, const float* __restrict__ acc,
                                         const double* __restrict__ stats, float* __restrict__ out,
                                         float* __restrict__ lse, bool first, int64_t rows) {
    const int lane = threadIdx.x % 32;
    TS_FOR_EACH_WARP_ROW(ro, rows) {
        const int t = static_cast<int>(ro / p.sq), r = static_cast<int>(ro % p.sq);
        const int64_t head = p.ch.head(t);
        float* o = out + (static_cast<int64_t>(r) * p.b * p.nq + head) * p.d;
        float* L = lse + head * p.sq + r;
        const float* a = acc + ro * p.d;
        const double lb = stats[2 * ro], sum = stats[2 * ro + 1];
        const float lOld = first ? -INFINITY : *L;
        __syncwarp();  // every lane has read lse before lane 0 may write it
        if (sum == 0.0) {  // no key of this block is visible to the row
            if (first) {
                for (int e = lane; e < p.d; e += 32) o[e] = 0.0f;
                if (lane == 0) *L = -INFINITY;
            }
            continue;
        }
        if (lOld == -INFINITY) {
            for (int e = lane; e < p.d; e += 32) o[e] = static_cast<float>(a[e] / sum);
            if (lane == 0) *L = static_cast<float>(lb);
            continue;
        }
        const double m = fmax(static_cast<double>(lOld), lb);
        const double lNew = m + log(exp(static_cast<double>(lOld) - m) + exp(lb - m));
        const double wOld = exp(static_cast<double>(lOld) - lNew), wBlk = exp(lb - lNew) / sum;
        for (int e = lane; e < p.d; e += 32) o[e] = static_cast<float>(o[e] * wOld + a[e] * wBlk);
        if (lane == 0) *L = static_cast<float>(lNew);
    }
}

// out = 0, lse = -inf for first=true against an empty block.
__global__ void ringAttentionInitKernel(float* __restrict__ out, int64_t outElems, float* __restrict__ lse,
                                        int64_t lseElems) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < outElems; i += stride)
        out[i] = 0.0f;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < lseElems; i += stride)
        lse[i] = -INFINITY;
}

// delta[bi, hq, i] = sum_e out*dout of row (i, bi, hq), in double. Rows: ro = (bi*nq + hq)*sq + i.
__global__ void ringAttentionDeltaKernel(const float* __restrict__ out, const float* __restrict__ dout,
                                         float* __restrict__ delta, int b, int nq, int sq, int d, int64_t rows) {
    const int lane = threadIdx.x % 32;
    TS_FOR_EACH_WARP_ROW(ro, rows) {
        const int64_t head = ro / sq, i = ro % sq;
        const int64_t off = (i * b * nq + head) * d;
        double s = 0.0;
        for (int e = lane; e < d; e += 32) s += static_cast<double>(out[off + e]) * dout[off + e];
        s = warpSumD(s);
        if (lane == 0) delta[ro] = static_cast<float>(s);
    }
}

// Backward rows from the final lse and delta: S (scaled scores) -> dropout(P), dP (dO.V^T) ->
// dS = P (M dP - delta) * scale; zeros past the visible prefix and for rows with lse = -inf.
__global__ void ringAttentionBackwardRowsKernel(RingParams p, const float* __restrict__ lse,
                                                const float* __restrict__ delta, float* __restrict__ S,
                                                float* __restrict__ dP, int64_t rows) {
    const int lane = threadIdx.x % 32;
    TS_FOR_EACH_WARP_ROW(ro, rows) {
        const int t = static_cast<int>(ro / p.sq), r = static_cast<int>(ro % p.sq);
        const int64_t head = p.ch.head(t);
        const float L = lse[head * p.sq + r], D = delta[head * p.sq + r];
        const int qp = p.qPos[r];
        const int nv = L == -INFINITY ? 0 : visibleKeys(p.kPos, p.skv, qp);
        const uint64_t mrow = p.rng.on ? ringMaskRow(p, head, qp) : 0, rngKey = p.rng.key();
        float* Sr = S + ro * p.skv;
        float* dr = dP + ro * p.skv;
        for (int j = lane; j < p.skv; j += 32) {
            float pd = 0.0f, ds = 0.0f;
            if (j < nv) {
                const float pr = expf(Sr[j] - L);
                const float m = p.rng.on ? (detail::dropoutKeep(rngKey, mrow + static_cast<uint64_t>(p.kPos[j]),
                                                             p.rng.threshold)
                                                ? p.rng.keepScale
                                                : 0.0f)
                                         : 1.0f;
                pd = pr * m;
                ds = pr * (dr[j] * m - D) * p.scale;
            }
            Sr[j] = pd;
            dr[j] = ds;
        }
    }
}

#undef TS_FOR_EACH_WARP_ROW

Status validateCp(const CpAttnDims& a, const char* what) {
    if (a.sq < 0 || a.skv < 0 || a.b < 0 || a.nq < 0 || a.nkv < 0 || a.d < 0)
        return Status::invalid(std::string(what) + ": negative dimension");
    if (a.nkv == 0 || a.nq % a.nkv != 0)
        return Status::invalid(std::string(what) + ": the query heads (" + std::to_string(a.nq) +
                               ") must be a multiple of the key/value heads (" + std::to_string(a.nkv) +
                               ")");
    return Status::ok();
}

detail::AttnGeom cpGeom(const CpAttnDims& a, const int* qPos) {
    detail::AttnGeom g;
    g.sq = a.sq;
    g.skv = a.skv;
    g.b = a.b;
    g.nq = a.nq;
    g.nkv = a.nkv;
    g.d = a.d;
    g.scale = a.scale;
    g.dropout = a.dropout;
    g.seed = a.dropoutSeed;
    g.headOffset = a.headOffset;
    g.nqTotal = a.nqTotal > 0 ? a.nqTotal : a.nq;
    g.sTotal = a.sTotal > 0 ? a.sTotal : a.skv;
    g.qPos = qPos;
    return g;
}

RingParams ringParams(const CpAttnDims& a, const detail::HeadChunk& ch, const int* qPos,
                      const int* kPos) {
    RingParams p;
    p.ch = ch;
    p.b = a.b;
    p.nq = a.nq;
    p.sq = a.sq;
    p.skv = a.skv;
    p.d = a.d;
    p.qPos = qPos;
    p.kPos = kPos;
    p.scale = a.scale;
    p.rng = detail::DropoutRng::make(a.dropout, a.dropoutSeed);
    p.nqTotal = a.nqTotal > 0 ? a.nqTotal : a.nq;
    p.headOffset = a.headOffset;
    p.sTotal = a.sTotal > 0 ? a.sTotal : a.skv;
    return p;
}

detail::HeadChunk makeChunk(int64_t i0, int64_t groups, int chunk, int rep, int j) {
    detail::HeadChunk ch;
    ch.i0 = i0;
    ch.count = static_cast<int>(std::min<int64_t>(chunk, groups - i0));
    ch.rep = rep;
    ch.j = j;
    return ch;
}

}  // namespace

Status cpAttentionForward(const CpAttnDims& dims, const int* qPos, const float* q,
                          const float* k, const float* v, float* probs, float* out,
                          void* stream) {
    TS_RETURN_IF_ERROR(validateCp(dims, "cpAttentionForward"));
    return detail::maskedAttentionForward(cpGeom(dims, qPos), q, k, v, probs, out, true,
                                          "cpAttentionForward", stream);
}

Status cpAttentionBackward(const CpAttnDims& dims, const int* qPos, const float* q,
                           const float* k, const float* v, const float* probs,
                           const float* dout, float* dq, float* dk, float* dv, void* stream) {
    TS_RETURN_IF_ERROR(validateCp(dims, "cpAttentionBackward"));
    return detail::maskedAttentionBackward(cpGeom(dims, qPos), q, k, v, probs, dout, dq, dk, dv,
                                           nullptr, 0, true, "cpAttentionBackward", stream);
}

Status cpRingAttentionForward(const CpAttnDims& dims, const int* qPos, const int* kPos,
                              const float* q, const float* k, const float* v, float* out,
                              float* lse, bool first, void* stream) {
    const char* what = "cpRingAttentionForward";
    TS_RETURN_IF_ERROR(validateCp(dims, what));
    if (dims.sq == 0 || dims.b == 0 || dims.nq == 0) return Status::ok();
    if (dims.d == 0) return Status::invalid(std::string(what) + ": head dim must be positive");
    const cudaStream_t st = detail::asStream(stream);
    if (dims.skv == 0) {  // an empty block: only first=true has something to do
        if (!first) return Status::ok();
        const int64_t rowsAll = static_cast<int64_t>(dims.b) * dims.nq * dims.sq;
        ringAttentionInitKernel<<<detail::blocksFor(rowsAll * dims.d, kThreads), kThreads, 0, st>>>(
            out, rowsAll * dims.d, lse, rowsAll);
        return detail::launchStatus(what);
    }
    const int rep = dims.nq / dims.nkv;
    const int64_t groups = static_cast<int64_t>(dims.b) * dims.nkv;
    const int64_t ss = static_cast<int64_t>(dims.sq) * dims.skv;
    const int64_t sd = static_cast<int64_t>(dims.sq) * dims.d;
    const int ldq = dims.b * dims.nq * dims.d, ldk = dims.b * dims.nkv * dims.d;
    // per head: stats (2 doubles per row), scores [sq, skv], block output [sq, d]
    const size_t perHead = sizeof(double) * 2 * dims.sq + sizeof(float) * (ss + sd);
    const int chunk = detail::chunkHeads(groups, perHead);
    detail::StreamWorkspace ws(stream);
    TS_RETURN_IF_ERROR(ws.allocate(perHead * chunk, "cpRingAttentionForward workspace"));
    double* stats = static_cast<double*>(ws.get());
    float* S = reinterpret_cast<float*>(stats + 2 * static_cast<int64_t>(chunk) * dims.sq);
    float* acc = S + static_cast<int64_t>(chunk) * ss;
    for (int j = 0; j < rep; ++j) {
        for (int64_t i0 = 0; i0 < groups; i0 += chunk) {
            const detail::HeadChunk ch = makeChunk(i0, groups, chunk, rep, j);
            const RingParams rp = ringParams(dims, ch, qPos, kPos);
            const int64_t qOff = ch.head(0) * dims.d, kOff = ch.i0 * dims.d;
            const int64_t qStride = static_cast<int64_t>(rep) * dims.d;
            const int64_t rows = static_cast<int64_t>(ch.count) * dims.sq;
            // S = scale Q K^T
            TS_RETURN_IF_ERROR(gemmStridedBatched(false, true, dims.sq, dims.skv, dims.d, dims.scale, q + qOff,
                                                  ldq, qStride, k + kOff, ldk, dims.d, 0.0f, S, dims.skv, ss,
                                                  ch.count, stream));
            ringAttentionForwardRowsKernel<<<rowBlocks(rows), kThreads, 0, st>>>(rp, S, stats, rows);
            TS_RETURN_IF_ERROR(detail::launchStatus(what));
            // acc = dropout(exp(S - max)) V
            TS_RETURN_IF_ERROR(gemmStridedBatched(false, false, dims.sq, dims.d, dims.skv, 1.0f, S, dims.skv,
                                                  ss, v + kOff, ldk, dims.d, 0.0f, acc, dims.d, sd, ch.count,
                                                  stream));
            ringAttentionMergeKernel<<<rowBlocks(rows), kThreads, 0, st>>>(rp, acc, stats, out, lse, first, rows);
            TS_RETURN_IF_ERROR(detail::launchStatus(what));
        }
    }
    return Status::ok();
}

Status cpRingAttentionDelta(const CpAttnDims& dims, const float* out, const float* dout,
                            float* delta, void* stream) {
    TS_RETURN_IF_ERROR(validateCp(dims, "cpRingAttentionDelta"));
    const int64_t rows = static_cast<int64_t>(dims.b) * dims.nq * dims.sq;
    if (rows == 0) return Status::ok();
    ringAttentionDeltaKernel<<<rowBlocks(rows), kThreads, 0, detail::asStream(stream)>>>(
        out, dout, delta, dims.b, dims.nq, dims.sq, dims.d, rows);
    return detail::launchStatus("cpRingAttentionDelta");
}

Status cpRingAttentionBackward(const CpAttnDims& dims, const int* qPos, const int* kPos,
                               const float* q, const float* k, const float* v, const float* lse,
                               const float* delta, const float* dout, float* dq, float* dk,
                               float* dv, void* stream) {
    const char* what = "cpRingAttentionBackward";
    TS_RETURN_IF_ERROR(validateCp(dims, what));
    const cudaStream_t st = detail::asStream(stream);
    const int64_t kvElems = static_cast<int64_t>(dims.skv) * dims.b * dims.nkv * dims.d;
    if (kvElems == 0 || dims.nq == 0) return Status::ok();
    if (dims.sq == 0) {  // no query rows: the block's gradient is zero
        TS_RETURN_IF_ERROR(detail::fromCuda(cudaMemsetAsync(dk, 0, sizeof(float) * kvElems, st), what));
        return detail::fromCuda(cudaMemsetAsync(dv, 0, sizeof(float) * kvElems, st), what);
    }
    const int rep = dims.nq / dims.nkv;
    const int64_t groups = static_cast<int64_t>(dims.b) * dims.nkv;
    const int64_t ss = static_cast<int64_t>(dims.sq) * dims.skv;
    const int ldq = dims.b * dims.nq * dims.d, ldk = dims.b * dims.nkv * dims.d;
    const int chunk = detail::chunkHeads(groups, sizeof(float) * 2 * ss);  // S and dP
    detail::StreamWorkspace ws(stream);
    TS_RETURN_IF_ERROR(ws.allocate(sizeof(float) * 2 * ss * chunk, "cpRingAttentionBackward workspace"));
    float* S = static_cast<float*>(ws.get());
    float* dP = S + static_cast<int64_t>(chunk) * ss;
    for (int j = 0; j < rep; ++j) {
        const float beta = j == 0 ? 0.0f : 1.0f;  // the group's first query head overwrites dk/dv
        for (int64_t i0 = 0; i0 < groups; i0 += chunk) {
            const detail::HeadChunk ch = makeChunk(i0, groups, chunk, rep, j);
            const RingParams rp = ringParams(dims, ch, qPos, kPos);
            const int64_t qOff = ch.head(0) * dims.d, kOff = ch.i0 * dims.d;
            const int64_t qStride = static_cast<int64_t>(rep) * dims.d;
            const int64_t rows = static_cast<int64_t>(ch.count) * dims.sq;
            // S = scale Q K^T, dP = dO V^T
            TS_RETURN_IF_ERROR(gemmStridedBatched(false, true, dims.sq, dims.skv, dims.d, dims.scale, q + qOff,
                                                  ldq, qStride, k + kOff, ldk, dims.d, 0.0f, S, dims.skv, ss,
                                                  ch.count, stream));
            TS_RETURN_IF_ERROR(gemmStridedBatched(false, true, dims.sq, dims.skv, dims.d, 1.0f, dout + qOff, ldq,
                                                  qStride, v + kOff, ldk, dims.d, 0.0f, dP, dims.skv, ss,
                                                  ch.count, stream));
            ringAttentionBackwardRowsKernel<<<rowBlocks(rows), kThreads, 0, st>>>(rp, lse, delta, S, dP, rows);
            TS_RETURN_IF_ERROR(detail::launchStatus(what));
            // dv (+)= dropout(P)^T dO
            TS_RETURN_IF_ERROR(gemmStridedBatched(true, false, dims.skv, dims.d, dims.sq, 1.0f, S, dims.skv, ss,
                                                  dout + qOff, ldq, qStride, beta, dv + kOff, ldk, dims.d,
                                                  ch.count, stream));
            // dq += dS K (accumulated across blocks)
            TS_RETURN_IF_ERROR(gemmStridedBatched(false, false, dims.sq, dims.d, dims.skv, 1.0f, dP, dims.skv,
                                                  ss, k + kOff, ldk, dims.d, 1.0f, dq + qOff, ldq, qStride,
                                                  ch.count, stream));
            // dk (+)= dS^T Q
            TS_RETURN_IF_ERROR(gemmStridedBatched(true, false, dims.skv, dims.d, dims.sq, 1.0f, dP, dims.skv, ss,
                                                  q + qOff, ldq, qStride, beta, dk + kOff, ldk, dims.d,
                                                  ch.count, stream));
        }
    }
    return Status::ok();
}

}  // namespace ts::kernels::cuda
