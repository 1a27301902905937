// Tiled flash attention on the tensor cores (bf16 operands, fp32 accumulation; sm_80 and later):
// the causal attention of a bf16 model without the [sq, skv] square. attention.cu's flash path
// (maskedAttentionForward/Backward with stats) runs it when the GEMMs are bf16 and flashTiles()
// is on (ops_cuda.h); its scores GEMM, row kernels and PV GEMM otherwise. Both keep the same
// stats, [b, nq, sq, 2]: each row's max of the scaled scores and 1/sum, so a forward of one
// feeds a backward of the other.
//
// One block of 4 warps per 64 rows; each warp owns 16 of them and multiplies with WMMA 16x16x16
// bf16 fragments. Operands are read as floats from the engine's [s, b, heads, d] tensors and
// rounded to bf16 into shared memory (the engine's bf16 mode stores bf16 values, so the
// products are the oracle's exactly); the head dim is padded with zeros to 16, 32, 64 or 128.
//  - Forward (a block per query tile and head): for each key tile up to the last key a row of
//    the tile sees, S = Q K^T, the online softmax (running max m and sum l; exp(s - m) rounded
//    to bf16, times the dropout keep factor, is the PV operand), O = O * exp(m_old - m) + P V;
//    out = O / l. Key tiles no row sees are never read: the causal square does about half the
//    work of the full one.
//  - Backward, two kernels and no atomics (deterministic):
//    * per query tile and head: delta = rowsum(P * dP') over the row's key tiles (P from the
//      stats, dP = dO V^T, dP' = dP times the keep factor), then dS = P (dP' - delta) in bf16
//      and dQ = scale dS K; delta is also written to a workspace [b, nq, sq];
//    * per key tile and key/value head: over the group's query heads (GQA: in order, so dK, dV
//      are sums in one order) and the query rows that see the tile's keys, 32 at a time (so that
//      two blocks fit an SM's shared memory), S^T = K Q^T and dP^T = V dO^T again,
//      dV += dropout(P)^T dO and dK += scale dS^T Q.
// The softmax's exp is CUDA's expf (the CPU has its own polynomial) and the summation orders
// differ from the GEMM path's: a few bf16 ulp against the oracle, as the GEMM path.
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/cuda/workspace.cuh"

#include <cuda_bf16.h>
#include <mma.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <type_traits>

namespace ts::kernels::cuda {

namespace {
detail::EnvSwitch g_flashTiles("TS_CUDA_FLASH_TILES");
}  // namespace

void setFlashTiles(bool on) { g_flashTiles.set(on); }
bool flashTiles() { return g_flashTiles.on(); }

namespace detail {

namespace {

using namespace nvcuda;
using bf16 = __nv_bfloat16;

// WMMA bf16 fragments need sm_80: for an older target the kernels compile to a trap
// (flashTilesApply never launches them there).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define TS_FLASH_TILES_ARCH 0
#else
#define TS_FLASH_TILES_ARCH 1
#endif

constexpr int kTile = 64;     // query rows of a block, and keys of a tile
constexpr int kThreads = 128;  // 4 warps of 16 rows each
constexpr int kLdT = kTile + 8;  // bf16 [64][64] tiles (P, dS); padded against bank conflicts
constexpr int kLdS = kTile + 4;  // fp32 [64][64] tiles (S, dP)
// The dK/dV kernel takes the query rows 32 at a time (its shared memory then fits twice per SM of
// an H100/H200 or A100): its [64 keys][32 rows] tiles.
constexpr int kKeysQ = 32;
constexpr int kLdS32 = kKeysQ + 4;  // fp32 (S^T, dP^T)
constexpr int kLdT32 = kKeysQ + 8;  // bf16 (P^T, dS^T)

// Leading dims of the [64][D] tiles: bf16 operands and fp32 accumulators. WMMA wants a multiple
// of 8 (16-bit) or 4 (32-bit) elements and 32-byte aligned fragment rows: both hold.
template <int D>
struct Ld {
    static constexpr int H = D + 8;
    static constexpr int O = D + 4;
};

struct FlashParams {
    const float* q = nullptr;
    const float* k = nullptr;
    const float* v = nullptr;
    const float* dout = nullptr;
    const float* statsIn = nullptr;
    float* out = nullptr;
    float* stats = nullptr;
    float* dq = nullptr;
    float* dk = nullptr;
    float* dv = nullptr;
    float* delta = nullptr;
    int sq = 0, skv = 0, nq = 0, nkv = 0, d = 0, rep = 1, ldq = 0, ldk = 0;
    float scale = 0.0f;
    DropoutRng rng;
    int64_t nqTotal = 0, sTotal = 0;
    int headOffset = 0;
    const int* qPos = nullptr;
};

// Keys [0, n) that query row `row` sees; 0 past the rows.
__device__ inline int visibleKeys(const FlashParams& p, int row) {
    if (row >= p.sq) return 0;
    return p.qPos ? min(p.qPos[row], p.skv - 1) + 1 : row + 1;
}
// The dropout element of (batch bi, local head h, query row, key 0).
__device__ inline uint64_t maskRowOf(const FlashParams& p, int bi, int h, int row) {
    const int64_t pos = p.qPos ? p.qPos[row] : row;
    return static_cast<uint64_t>(((bi * p.nqTotal + p.headOffset + h) * p.sTotal + pos) * p.sTotal);
}

// dst[R][D] (bf16, ld Ld<D>::H) = rows [r0, r0 + R) of src (row r at src + r*ld, d columns),
// zeros past `rows` and d.
template <int D, int R = kTile>
__device__ inline void loadTile(bf16* dst, const float* src, int r0, int rows, int ld, int d) {
    for (int i = threadIdx.x; i < R * D; i += blockDim.x) {
        const int r = i / D, c = i % D, row = r0 + r;
        const float x = row < rows && c < d ? src[static_cast<int64_t>(row) * ld + c] : 0.0f;
        dst[r * Ld<D>::H + c] = __float2bfloat16_rn(x);
    }
}

// Rows [r0, r0 + 64) of dst (row r at dst + r*ld, d columns; not past `rows`) = scale * the
// staged fp32 tile src[64][D] (ld Ld<D>::O).
template <int D>
__device__ inline void storeTile(float* dst, const float* src, int r0, int rows, int ld, int d, float scale) {
    for (int i = threadIdx.x; i < kTile * D; i += blockDim.x) {
        const int r = i / D, c = i % D, row = r0 + r;
        if (row < rows && c < d) dst[static_cast<int64_t>(row) * ld + c] = scale * src[r * Ld<D>::O + c];
    }
}

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// c[16][N] (fp32, ld LDC) = a[16][D] b[N][D]^T: a warp's 16 rows against a tile's N rows.
// HoldA: a's fragments loaded once for the N/16 column tiles (not where the dK, dV accumulators
// already fill the registers).
template <int D, bool HoldA = true, int N = kTile, int LDC = kLdS>
__device__ inline void rowsTimesRowsT(const bf16* a, const bf16* b, float* c) {
    constexpr int L = Ld<D>::H;
    FragA fa[HoldA ? D / 16 : 1];
    if constexpr (HoldA) {
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) wmma::load_matrix_sync(fa[kk], a + kk * 16, L);
    }
#pragma unroll
    for (int ct = 0; ct < N / 16; ++ct) {
        FragC acc;
        wmma::fill_fragment(acc, 0.0f);
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            FragBCol fb;
            if constexpr (!HoldA) wmma::load_matrix_sync(fa[0], a + kk * 16, L);
            wmma::load_matrix_sync(fb, b + ct * 16 * L + kk * 16, L);
            wmma::mma_sync(acc, fa[HoldA ? kk : 0], fb, acc);
        }
        wmma::store_matrix_sync(c + ct * 16, acc, LDC, wmma::mem_row_major);
    }
}

// acc[16][D] += a[16][K] (bf16, ld LDA) b[K][D] (bf16, ld Ld<D>::H).
template <int D, int K = kTile, int LDA = kLdT>
__device__ inline void accumulateTimesTile(FragC (&acc)[D / 16], const bf16* a, const bf16* b) {
    constexpr int L = Ld<D>::H;
#pragma unroll
    for (int kk = 0; kk < K / 16; ++kk) {
        FragA fa;
        wmma::load_matrix_sync(fa, a + kk * 16, LDA);
#pragma unroll
        for (int ot = 0; ot < D / 16; ++ot) {
            FragBRow fb;
            wmma::load_matrix_sync(fb, b + kk * 16 * L + ot * 16, L);
            wmma::mma_sync(acc[ot], fa, fb, acc[ot]);
        }
    }
}

// Shared memory of each kernel, in the order the kernels carve it (every piece a multiple of 32
// bytes, so every WMMA fragment row stays aligned).
template <int D>
struct Smem {
    static constexpr size_t tileH = sizeof(bf16) * kTile * Ld<D>::H;
    static constexpr size_t tileO = sizeof(float) * kTile * Ld<D>::O;
    static constexpr size_t tileS = sizeof(float) * kTile * kLdS;
    static constexpr size_t tileT = sizeof(bf16) * kTile * kLdT;
    static constexpr size_t rows = (sizeof(float) * 3 + sizeof(int) + sizeof(uint64_t)) * kTile;
    static constexpr size_t tileH32 = sizeof(bf16) * kKeysQ * Ld<D>::H;  // the keys kernel's Q, dO
    static constexpr size_t tileS32 = sizeof(float) * kTile * kLdS32;
    static constexpr size_t tileT32 = sizeof(bf16) * kTile * kLdT32;
    static constexpr size_t rows32 = (sizeof(float) * 3 + sizeof(int) + sizeof(uint64_t)) * kKeysQ;
    // Q, K, V; P; S; O; m, l, n
    static constexpr size_t forward = 3 * tileH + tileT + tileS + tileO + rows;
    // Q, dO, K, V; S, dP; dS; mx, inv, delta, n, mask
    static constexpr size_t query = 4 * tileH + 2 * tileS + tileT + rows;
    // K, V; Q, dO (32 rows); S^T, dP^T; P^T, dS^T; the 32 query rows' mx, inv, delta, n, mask
    static constexpr size_t keys = 2 * tileH + 2 * tileH32 + 2 * tileS32 + 2 * tileT32 + rows32;
    static_assert(tileH % 32 == 0 && tileO % 32 == 0 && tileS % 32 == 0 && tileT % 32 == 0 && tileH32 % 32 == 0 &&
                      tileS32 % 32 == 0 && tileT32 % 32 == 0,
                  "alignment");
    // The output staging areas reuse the tiles: dQ [64][D] fp32 over S, dP; dK, then dV, over Q..dS^T.
    static_assert(tileO <= 2 * tileS, "dQ staging");
    static_assert(tileO <= 2 * tileH32 + 2 * tileS32 + 2 * tileT32, "dK, dV staging");
};

// Per-row arrays of R rows after the tiles: three floats, an int and a 64-bit mask row per row.
template <int R = kTile>
struct RowArrays {
    float* a;
    float* b;
    float* c;
    int* n;
    uint64_t* mask;
    __device__ explicit RowArrays(unsigned char* at) {
        mask = reinterpret_cast<uint64_t*>(at);  // first: 8-byte aligned
        a = reinterpret_cast<float*>(mask + R);
        b = a + R;
        c = b + R;
        n = reinterpret_cast<int*>(c + R);
    }
};

// The key tiles the block's rows see: up to the most keys any of them sees (n: per row, in
// shared memory, written before a barrier).
__device__ inline int keyTilesOf(const int* n) {
    int most = 0;
    for (int r = 0; r < kTile; ++r) most = max(most, n[r]);
    return (most + kTile - 1) / kTile;
}

// --- forward -------------------------------------------------------------------------------------
// grid (query tiles, b*nq); the last query tiles (the most keys) first.
template <int D>
__global__ void __launch_bounds__(kThreads) flashAttentionForwardKernel(FlashParams p) {
#if TS_FLASH_TILES_ARCH
    extern __shared__ __align__(128) unsigned char smem[];
    using S = Smem<D>;
    constexpr int LH = Ld<D>::H, LO = Ld<D>::O;
    bf16* Qs = reinterpret_cast<bf16*>(smem);
    bf16* Ks = reinterpret_cast<bf16*>(smem + S::tileH);
    bf16* Vs = reinterpret_cast<bf16*>(smem + 2 * S::tileH);
    bf16* Ps = reinterpret_cast<bf16*>(smem + 3 * S::tileH);
    float* Ss = reinterpret_cast<float*>(smem + 3 * S::tileH + S::tileT);
    float* Os = reinterpret_cast<float*>(smem + 3 * S::tileH + S::tileT + S::tileS);
    RowArrays<> ra(smem + 3 * S::tileH + S::tileT + S::tileS + S::tileO);
    float* rowM = ra.a;
    float* rowL = ra.b;

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int qt = gridDim.x - 1 - blockIdx.x;
    const int head = blockIdx.y;  // flat bi*nq + h
    const int bi = head / p.nq, h = head % p.nq, grp = h / p.rep;
    const int r0 = qt * kTile;
    const float* kh = p.k + (static_cast<int64_t>(bi) * p.nkv + grp) * p.d;
    const float* vh = p.v + (static_cast<int64_t>(bi) * p.nkv + grp) * p.d;

    loadTile<D>(Qs, p.q + static_cast<int64_t>(head) * p.d, r0, p.sq, p.ldq, p.d);
    for (int i = threadIdx.x; i < kTile * D; i += blockDim.x) Os[(i / D) * LO + i % D] = 0.0f;
    if (threadIdx.x < kTile) {
        ra.n[threadIdx.x] = visibleKeys(p, r0 + threadIdx.x);
        rowM[threadIdx.x] = -INFINITY;
        rowL[threadIdx.x] = 0.0f;
    }
    __syncthreads();
    const int kTiles = keyTilesOf(ra.n);

    // The softmax step: two lanes per row of the warp, 32 keys each.
    const int rr = warp * 16 + lane / 2, half = lane & 1;
    const int n = ra.n[rr];
    const uint64_t maskRow = p.rng.on && r0 + rr < p.sq ? maskRowOf(p, bi, h, r0 + rr) : 0;
    const uint64_t rngKey = p.rng.key();
    float* srow = Ss + rr * kLdS;
    bf16* prow = Ps + rr * kLdT;
    float* orow = Os + rr * LO;
    for (int kt = 0; kt < kTiles; ++kt) {
        const int j0 = kt * kTile;
        loadTile<D>(Ks, kh, j0, p.skv, p.ldk, p.d);
        loadTile<D>(Vs, vh, j0, p.skv, p.ldk, p.d);
        __syncthreads();
        rowsTimesRowsT<D>(Qs + warp * 16 * LH, Ks, Ss + warp * 16 * kLdS);
        __syncwarp();
        const float mOld = rowM[rr];
        float tmax = -INFINITY;
        for (int c = half * 32; c < half * 32 + 32; ++c) {
            const float s = j0 + c < n ? srow[c] * p.scale : -INFINITY;
            srow[c] = s;
            tmax = fmaxf(tmax, s);
        }
        tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
        const float mNew = fmaxf(mOld, tmax);
        const float alpha = mNew == -INFINITY ? 1.0f : expf(mOld - mNew);
        float lsum = 0.0f;
        for (int c = half * 32; c < half * 32 + 32; ++c) {
            const float s = srow[c];
            const float e = s == -INFINITY ? 0.0f : expf(s - mNew);
            lsum += e;
            float pd = e;
            if (p.rng.on && e != 0.0f)
                pd = dropoutKeep(rngKey, maskRow + j0 + c, p.rng.threshold) ? e * p.rng.keepScale : 0.0f;
            prow[c] = __float2bfloat16_rn(pd);
        }
        lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
        for (int c = half * (D / 2); c < (half + 1) * (D / 2); ++c) orow[c] *= alpha;
        __syncwarp();  // both lanes have read rowM[rr]; P and O's rows are in place for the warp
        if (half == 0) {
            rowM[rr] = mNew;
            rowL[rr] = rowL[rr] * alpha + lsum;
        }
        FragC acc[D / 16];
#pragma unroll
        for (int ot = 0; ot < D / 16; ++ot)
            wmma::load_matrix_sync(acc[ot], Os + warp * 16 * LO + ot * 16, LO, wmma::mem_row_major);
        accumulateTimesTile<D>(acc, Ps + warp * 16 * kLdT, Vs);
#pragma unroll
        for (int ot = 0; ot < D / 16; ++ot)
            wmma::store_matrix_sync(Os + warp * 16 * LO + ot * 16, acc[ot], LO, wmma::mem_row_major);
        __syncthreads();  // every warp is done with K, V before the next tile's load
    }
    for (int i = threadIdx.x; i < kTile * D; i += blockDim.x) {
        const int r = i / D, c = i % D, row = r0 + r;
        if (row >= p.sq || c >= p.d) continue;
        const float l = rowL[r];
        p.out[static_cast<int64_t>(row) * p.ldq + static_cast<int64_t>(head) * p.d + c] =
            l > 0.0f ? Os[r * LO + c] / l : 0.0f;
    }
    if (threadIdx.x < kTile && r0 + static_cast<int>(threadIdx.x) < p.sq) {
        const int r = threadIdx.x;
        float* st = p.stats + 2 * (static_cast<int64_t>(head) * p.sq + r0 + r);
        st[0] = rowM[r];
        st[1] = rowL[r] > 0.0f ? 1.0f / rowL[r] : 0.0f;
    }
#else
    __trap();
#endif
}

// --- backward: dQ and delta -----------------------------------------------------------------------
// grid (query tiles, b*nq).
template <int D>
__global__ void __launch_bounds__(kThreads) flashAttentionBackwardQueryKernel(FlashParams p) {
#if TS_FLASH_TILES_ARCH
    extern __shared__ __align__(128) unsigned char smem[];
    using S = Smem<D>;
    constexpr int LH = Ld<D>::H, LO = Ld<D>::O;
    bf16* Qs = reinterpret_cast<bf16*>(smem);
    bf16* dOs = reinterpret_cast<bf16*>(smem + S::tileH);
    bf16* Ks = reinterpret_cast<bf16*>(smem + 2 * S::tileH);
    bf16* Vs = reinterpret_cast<bf16*>(smem + 3 * S::tileH);
    float* Ss = reinterpret_cast<float*>(smem + 4 * S::tileH);
    float* dPs = reinterpret_cast<float*>(smem + 4 * S::tileH + S::tileS);
    bf16* dSs = reinterpret_cast<bf16*>(smem + 4 * S::tileH + 2 * S::tileS);
    RowArrays<> ra(smem + 4 * S::tileH + 2 * S::tileS + S::tileT);

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int qt = gridDim.x - 1 - blockIdx.x;
    const int head = blockIdx.y;
    const int bi = head / p.nq, h = head % p.nq, grp = h / p.rep;
    const int r0 = qt * kTile;
    const float* kh = p.k + (static_cast<int64_t>(bi) * p.nkv + grp) * p.d;
    const float* vh = p.v + (static_cast<int64_t>(bi) * p.nkv + grp) * p.d;

    loadTile<D>(Qs, p.q + static_cast<int64_t>(head) * p.d, r0, p.sq, p.ldq, p.d);
    loadTile<D>(dOs, p.dout + static_cast<int64_t>(head) * p.d, r0, p.sq, p.ldq, p.d);
    if (threadIdx.x < kTile) {
        const int row = r0 + threadIdx.x;
        ra.n[threadIdx.x] = visibleKeys(p, row);
        const float* st = p.statsIn + 2 * (static_cast<int64_t>(head) * p.sq + min(row, p.sq - 1));
        ra.a[threadIdx.x] = st[0];
        ra.b[threadIdx.x] = st[1];
    }
    __syncthreads();
    const int kTiles = keyTilesOf(ra.n);

    const int rr = warp * 16 + lane / 2, half = lane & 1;
    const int n = ra.n[rr];
    const float mx = ra.a[rr], inv = ra.b[rr];
    const uint64_t maskRow = p.rng.on && r0 + rr < p.sq ? maskRowOf(p, bi, h, r0 + rr) : 0;
    const uint64_t rngKey = p.rng.key();
    const float* srow = Ss + rr * kLdS;
    const float* dprow = dPs + rr * kLdS;
    // P and dP' of key j0 + c of this lane's row (0 where it does not see the key).
    auto probAndGrad = [&](int j0, int c, float& pv, float& dp) {
        pv = 0.0f;
        dp = 0.0f;
        if (j0 + c >= n) return;
        pv = expf(srow[c] * p.scale - mx) * inv;
        dp = dprow[c];
        if (p.rng.on) dp = dropoutKeep(rngKey, maskRow + j0 + c, p.rng.threshold) ? dp * p.rng.keepScale : 0.0f;
    };

    // Pass 1: delta = rowsum(P * dP').
    double dsum = 0.0;
    for (int kt = 0; kt < kTiles; ++kt) {
        const int j0 = kt * kTile;
        loadTile<D>(Ks, kh, j0, p.skv, p.ldk, p.d);
        loadTile<D>(Vs, vh, j0, p.skv, p.ldk, p.d);
        __syncthreads();
        rowsTimesRowsT<D>(Qs + warp * 16 * LH, Ks, Ss + warp * 16 * kLdS);
        rowsTimesRowsT<D>(dOs + warp * 16 * LH, Vs, dPs + warp * 16 * kLdS);
        __syncwarp();
        for (int c = half * 32; c < half * 32 + 32; ++c) {
            float pv, dp;
            probAndGrad(j0, c, pv, dp);
            dsum += static_cast<double>(pv) * dp;
        }
        __syncthreads();
    }
    dsum += __shfl_xor_sync(0xffffffffu, dsum, 1);
    const float delta = static_cast<float>(dsum);
    if (half == 0 && r0 + rr < p.sq) p.delta[static_cast<int64_t>(head) * p.sq + r0 + rr] = delta;

    // Pass 2: dS = P (dP' - delta), dQ += dS K.
    FragC acc[D / 16];
#pragma unroll
    for (int ot = 0; ot < D / 16; ++ot) wmma::fill_fragment(acc[ot], 0.0f);
    bf16* dsrow = dSs + rr * kLdT;
    for (int kt = 0; kt < kTiles; ++kt) {
        const int j0 = kt * kTile;
        loadTile<D>(Ks, kh, j0, p.skv, p.ldk, p.d);
        loadTile<D>(Vs, vh, j0, p.skv, p.ldk, p.d);
        __syncthreads();
        rowsTimesRowsT<D>(Qs + warp * 16 * LH, Ks, Ss + warp * 16 * kLdS);
        rowsTimesRowsT<D>(dOs + warp * 16 * LH, Vs, dPs + warp * 16 * kLdS);
        __syncwarp();
        for (int c = half * 32; c < half * 32 + 32; ++c) {
            float pv, dp;
            probAndGrad(j0, c, pv, dp);
            dsrow[c] = __float2bfloat16_rn(pv * (dp - delta));
        }
        __syncwarp();
        accumulateTimesTile<D>(acc, dSs + warp * 16 * kLdT, Ks);
        __syncthreads();
    }
    // dq = scale dQ, staged over S and dP.
    float* stage = Ss;
#pragma unroll
    for (int ot = 0; ot < D / 16; ++ot)
        wmma::store_matrix_sync(stage + warp * 16 * LO + ot * 16, acc[ot], LO, wmma::mem_row_major);
    __syncthreads();
    storeTile<D>(p.dq + static_cast<int64_t>(head) * p.d, stage, r0, p.sq, p.ldq, p.d, p.scale);
#else
    __trap();
#endif
}

// --- backward: dK, dV ---------------------------------------------------------------------------
// grid (key tiles, b*nkv). Each warp owns 16 keys of the tile; the query rows come 32 at a time.
template <int D>
__global__ void __launch_bounds__(kThreads) flashAttentionBackwardKeysKernel(FlashParams p) {
#if TS_FLASH_TILES_ARCH
    extern __shared__ __align__(128) unsigned char smem[];
    using S = Smem<D>;
    constexpr int LH = Ld<D>::H, LO = Ld<D>::O;
    unsigned char* at = smem;
    auto carve = [&at](size_t bytes) {
        unsigned char* here = at;
        at += bytes;
        return here;
    };
    bf16* Ks = reinterpret_cast<bf16*>(carve(S::tileH));
    bf16* Vs = reinterpret_cast<bf16*>(carve(S::tileH));
    bf16* Qs = reinterpret_cast<bf16*>(carve(S::tileH32));
    bf16* dOs = reinterpret_cast<bf16*>(carve(S::tileH32));
    float* Ss = reinterpret_cast<float*>(carve(S::tileS32));
    float* dPs = reinterpret_cast<float*>(carve(S::tileS32));
    bf16* Pb = reinterpret_cast<bf16*>(carve(S::tileT32));
    bf16* dSb = reinterpret_cast<bf16*>(carve(S::tileT32));
    RowArrays<kKeysQ> ra(carve(S::rows32));

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int k0 = blockIdx.x * kTile;
    const int group = blockIdx.y;  // flat bi*nkv + g
    const int bi = group / p.nkv, grp = group % p.nkv;
    loadTile<D>(Ks, p.k + static_cast<int64_t>(group) * p.d, k0, p.skv, p.ldk, p.d);
    loadTile<D>(Vs, p.v + static_cast<int64_t>(group) * p.d, k0, p.skv, p.ldk, p.d);

    FragC dK[D / 16], dV[D / 16];
#pragma unroll
    for (int ot = 0; ot < D / 16; ++ot) {
        wmma::fill_fragment(dK[ot], 0.0f);
        wmma::fill_fragment(dV[ot], 0.0f);
    }
    // The elementwise step: two lanes per key row of the warp, 16 query rows each.
    const int kr = warp * 16 + lane / 2, half = lane & 1;
    const int key = k0 + kr;
    const uint64_t rngKey = p.rng.key();
    const float* srow = Ss + kr * kLdS32;
    const float* dprow = dPs + kr * kLdS32;
    bf16* pbrow = Pb + kr * kLdT32;
    bf16* dsrow = dSb + kr * kLdT32;
    for (int j = 0; j < p.rep; ++j) {
        const int h = grp * p.rep + j;
        const int64_t head = static_cast<int64_t>(bi) * p.nq + h;
        for (int q0 = 0; q0 < p.sq; q0 += kKeysQ) {
            __syncthreads();  // the previous rows' readers are done
            if (threadIdx.x < kKeysQ) {
                const int row = q0 + threadIdx.x;
                ra.n[threadIdx.x] = visibleKeys(p, row);
                if (row < p.sq) {
                    const float* st = p.statsIn + 2 * (head * p.sq + row);
                    ra.a[threadIdx.x] = st[0];
                    ra.b[threadIdx.x] = st[1];
                    ra.c[threadIdx.x] = p.delta[head * p.sq + row];
                    ra.mask[threadIdx.x] = p.rng.on ? maskRowOf(p, bi, h, row) : 0;
                }
            }
            // Does any of these query rows see a key of this tile?
            if (!__syncthreads_or(threadIdx.x < kKeysQ && ra.n[threadIdx.x] > k0)) continue;
            loadTile<D, kKeysQ>(Qs, p.q + head * p.d, q0, p.sq, p.ldq, p.d);
            loadTile<D, kKeysQ>(dOs, p.dout + head * p.d, q0, p.sq, p.ldq, p.d);
            __syncthreads();
            rowsTimesRowsT<D, false, kKeysQ, kLdS32>(Ks + warp * 16 * LH, Qs, Ss + warp * 16 * kLdS32);   // S^T
            rowsTimesRowsT<D, false, kKeysQ, kLdS32>(Vs + warp * 16 * LH, dOs, dPs + warp * 16 * kLdS32);  // dP^T
            __syncwarp();
            for (int c = half * (kKeysQ / 2); c < (half + 1) * (kKeysQ / 2); ++c) {
                float pd = 0.0f, ds = 0.0f;
                if (key < ra.n[c]) {
                    const float pv = expf(srow[c] * p.scale - ra.a[c]) * ra.b[c];
                    float dp = dprow[c];
                    pd = pv;
                    if (p.rng.on) {
                        const bool keep = dropoutKeep(rngKey, ra.mask[c] + key, p.rng.threshold);
                        pd = keep ? pv * p.rng.keepScale : 0.0f;
                        dp = keep ? dp * p.rng.keepScale : 0.0f;
                    }
                    ds = pv * (dp - ra.c[c]);
                }
                pbrow[c] = __float2bfloat16_rn(pd);
                dsrow[c] = __float2bfloat16_rn(ds);
            }
            __syncwarp();
            accumulateTimesTile<D, kKeysQ, kLdT32>(dV, Pb + warp * 16 * kLdT32, dOs);
            accumulateTimesTile<D, kKeysQ, kLdT32>(dK, dSb + warp * 16 * kLdT32, Qs);
        }
    }
    // dk = scale dK, then dv = dV, each staged over Q, dO, S^T, dP^T, P^T and dS^T.
    float* stage = reinterpret_cast<float*>(Qs);
    __syncthreads();
#pragma unroll
    for (int ot = 0; ot < D / 16; ++ot)
        wmma::store_matrix_sync(stage + warp * 16 * LO + ot * 16, dK[ot], LO, wmma::mem_row_major);
    __syncthreads();
    storeTile<D>(p.dk + static_cast<int64_t>(group) * p.d, stage, k0, p.skv, p.ldk, p.d, p.scale);
    __syncthreads();
#pragma unroll
    for (int ot = 0; ot < D / 16; ++ot)
        wmma::store_matrix_sync(stage + warp * 16 * LO + ot * 16, dV[ot], LO, wmma::mem_row_major);
    __syncthreads();
    storeTile<D>(p.dv + static_cast<int64_t>(group) * p.d, stage, k0, p.skv, p.ldk, p.d, 1.0f);
#else
    __trap();
#endif
}

// The padded head dim: 16, 32, 64 or 128; 0 past 128.
int paddedHeadDim(int d) { return d <= 16 ? 16 : d <= 32 ? 32 : d <= 64 ? 64 : d <= 128 ? 128 : 0; }

// f(std::integral_constant<int, D>) for the padded head dim D of d (paddedHeadDim(d) > 0).
template <typename F>
auto withHeadDim(int d, F&& f) {
    switch (paddedHeadDim(d)) {
        case 16: return f(std::integral_constant<int, 16>{});
        case 32: return f(std::integral_constant<int, 32>{});
        case 64: return f(std::integral_constant<int, 64>{});
        default: return f(std::integral_constant<int, 128>{});
    }
}

size_t largestSmemFor(int d) {
    return withHeadDim(d, [](auto D) {
        using S = Smem<decltype(D)::value>;
        return std::max(S::forward, std::max(S::query, S::keys));
    });
}

FlashParams flashParams(const AttnGeom& g) {
    FlashParams p;
    p.sq = g.sq;
    p.skv = g.skv;
    p.nq = g.nq;
    p.nkv = g.nkv;
    p.d = g.d;
    p.rep = g.nq / g.nkv;
    p.ldq = g.b * g.nq * g.d;
    p.ldk = g.b * g.nkv * g.d;
    p.scale = g.scale;
    p.rng = DropoutRng::make(g.dropout, g.seed);
    p.nqTotal = g.nqTotal;
    p.sTotal = g.sTotal;
    p.headOffset = g.headOffset;
    p.qPos = g.qPos;
    return p;
}

// The opt-in to more than 48 KB of dynamic shared memory is an attribute of the kernel in the
// current device's context: set once per kernel, device and size, not at every launch.
Status optInSmem(const void* kernel, size_t smemBytes, const char* what) {
    int dev = 0;
    TS_RETURN_IF_ERROR(fromCuda(cudaGetDevice(&dev), what));
    static std::mutex mu;
    static std::set<std::tuple<const void*, int, size_t>> done;
    const auto key = std::make_tuple(kernel, dev, smemBytes);
    std::lock_guard<std::mutex> lock(mu);
    if (done.count(key)) return Status::ok();
    TS_RETURN_IF_ERROR(fromCuda(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smemBytes)), what));
    done.insert(key);
    return Status::ok();
}

template <typename Kernel>
Status launchTiled(Kernel kernel, size_t smemBytes, dim3 grid, const FlashParams& p, cudaStream_t st,
                   const char* what) {
    TS_RETURN_IF_ERROR(optInSmem(reinterpret_cast<const void*>(kernel), smemBytes, what));
    kernel<<<grid, kThreads, smemBytes, st>>>(p);
    return launchStatus(what);
}

// A device's compute capability and its opt-in shared memory per block, asked once per device.
struct TileDevice {
    int major = 0;
    int optin = 0;
};

bool tileDevice(TileDevice* out) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    static std::mutex mu;
    static std::map<int, TileDevice> known;
    std::lock_guard<std::mutex> lock(mu);
    auto it = known.find(dev);
    if (it == known.end()) {
        TileDevice d;
        if (cudaDeviceGetAttribute(&d.major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
        if (cudaDeviceGetAttribute(&d.optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
            return false;
        it = known.emplace(dev, d).first;
    }
    *out = it->second;
    return true;
}

template <int D>
Status forwardTiles(const FlashParams& p, int heads, cudaStream_t st, const char* what) {
    const dim3 grid(static_cast<unsigned>((p.sq + kTile - 1) / kTile), static_cast<unsigned>(heads));
    return launchTiled(flashAttentionForwardKernel<D>, Smem<D>::forward, grid, p, st, what);
}

template <int D>
Status backwardTiles(const FlashParams& p, int heads, int groups, cudaStream_t st, const char* what) {
    const dim3 qGrid(static_cast<unsigned>((p.sq + kTile - 1) / kTile), static_cast<unsigned>(heads));
    TS_RETURN_IF_ERROR(launchTiled(flashAttentionBackwardQueryKernel<D>, Smem<D>::query, qGrid, p, st, what));
    const dim3 kGrid(static_cast<unsigned>((p.skv + kTile - 1) / kTile), static_cast<unsigned>(groups));
    return launchTiled(flashAttentionBackwardKeysKernel<D>, Smem<D>::keys, kGrid, p, st, what);
}

}  // namespace

bool flashTilesApply(const AttnGeom& g) {
    const int D = paddedHeadDim(g.d);
    // qPos (the context-parallel all-gather op) keeps the GEMM path: it keeps its probabilities and
    // never calls the flash path; the kernels' qPos rows are written for it but not yet tested.
    if (D == 0 || g.sq <= 0 || g.skv <= 0 || g.qPos) return false;
    if (static_cast<int64_t>(g.b) * g.nq > 65535) return false;  // grid.y
    TileDevice d;
    if (!tileDevice(&d)) return false;
    return d.major >= 8 && largestSmemFor(g.d) <= static_cast<size_t>(d.optin);
}

}  // namespace detail

bool flashTilesSupported(int headDim) {
    detail::AttnGeom g;
    g.sq = g.skv = g.b = g.nq = g.nkv = 1;
    g.d = headDim;
    return detail::flashTilesApply(g);
}

namespace detail {

Status flashTiledForward(const AttnGeom& g, const float* q, const float* k, const float* v, float* out,
                         float* stats, const char* what, void* stream) {
    FlashParams p = flashParams(g);
    p.q = q;
    p.k = k;
    p.v = v;
    p.out = out;
    p.stats = stats;
    if (paddedHeadDim(g.d) == 0)
        return Status::internal(std::string(what) + ": no tiled flash kernel for head dim " + std::to_string(g.d));
    const int heads = g.b * g.nq;
    const cudaStream_t st = asStream(stream);
    return withHeadDim(g.d, [&](auto D) { return forwardTiles<decltype(D)::value>(p, heads, st, what); });
}

Status flashTiledBackward(const AttnGeom& g, const float* q, const float* k, const float* v, const float* stats,
                          const float* dout, float* dq, float* dk, float* dv, const char* what, void* stream) {
    FlashParams p = flashParams(g);
    p.q = q;
    p.k = k;
    p.v = v;
    p.dout = dout;
    p.statsIn = stats;
    p.dq = dq;
    p.dk = dk;
    p.dv = dv;
    if (paddedHeadDim(g.d) == 0)
        return Status::internal(std::string(what) + ": no tiled flash kernel for head dim " + std::to_string(g.d));
    const int heads = g.b * g.nq, groups = g.b * g.nkv;
    StreamWorkspace ws(stream);  // delta [b, nq, sq]
    TS_RETURN_IF_ERROR(ws.allocate(sizeof(float) * static_cast<size_t>(heads) * g.sq,
                                   (std::string(what) + ": workspace").c_str()));
    p.delta = static_cast<float*>(ws.get());
    const cudaStream_t st = asStream(stream);
    return withHeadDim(g.d, [&](auto D) { return backwardTiles<decltype(D)::value>(p, heads, groups, st, what); });
}

}  // namespace detail

}  // namespace ts::kernels::cuda
