// LayerNorm and RMSNorm, forward and backward, on CUDA (CPU oracle: kernels/cpu/norm.cpp).
// x, y, dy, dx: [T, C] rows; w, b, dw, db: [C]; mean, rstd: [T].
//
// Row statistics: one warp per row (llm.c's layernorm kernels), lanes stride the row, the
// reduction is a butterfly over the warp, so every value is deterministic run to run.
// - layerNormForward: mean pass, then the biased variance around it (two passes), as the CPU.
// - layerNormForwardFused: one statistics pass of sums shifted by the mean of the first 16
//   elements (the CPU's shiftedMomentsRow, clamped at 0), then normalize.
// - rmsNormForward: mean of squares.
// Backward: dx per row from the two row sums mean(g), mean(g * xhat), g = dy * w, taken in one
// pass; dw (and db) are accumulated (+=) over the T rows deterministically, without atomics:
// blocks of 32 columns x a chunk of rows write per-chunk partial sums to a stream-ordered scratch
// (cudaMallocAsync), and a second kernel adds the chunks in order to dw/db. When one chunk
// covers all rows (or the scratch cannot be had) the first kernel adds to dw/db directly.
//
// Differences from the CPU, all within float rounding (summation order, fused multiply-adds):
// the CPU's "fused" backward differs from its unfused one only in memory passes, and here both
// entry points run the same two kernels (the parameter-gradient pass, then dx).
#include "kernels/common/bf16.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace ts::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kRowsPerBlock = kThreads / 32;  // one warp per row
constexpr int kShiftHead = 16;                // the CPU's kLanes: head of the row for the shift

int rowBlocks(int T) { return (T + kRowsPerBlock - 1) / kRowsPerBlock; }

// An output element as stored: its bf16 value under roundBf16.
__device__ inline float stored(float v, bool roundBf16) { return roundBf16 ? hd::bf16RoundFloat(v) : v; }

// Mode of the forward statistics and of the normalization.
enum class NormKind { LayerTwoPass, LayerShifted, Rms };

template <NormKind kKind>
__global__ void layerOrRmsNormForwardKernel(const float* __restrict__ x, const float* __restrict__ w,
                                            const float* __restrict__ b, float* __restrict__ y,
                                            float* __restrict__ mean, float* __restrict__ rstd, int T,
                                            int C, float eps, bool roundBf16) {
    const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= T) return;  // whole warps leave together: row is uniform across the warp
    const int64_t off = static_cast<int64_t>(row) * C;
    const float* xr = x + off;
    float mu = 0.0f, rs;
    if constexpr (kKind == NormKind::LayerTwoPass) {
        float s = 0.0f;
        for (int c = lane; c < C; c += 32) s += xr[c];
        mu = detail::warpSum(s) / static_cast<float>(C);
        float v = 0.0f;
        for (int c = lane; c < C; c += 32) {
            const float d = xr[c] - mu;
            v += d * d;
        }
        const float var = detail::warpSum(v) / static_cast<float>(C);
        rs = 1.0f / sqrtf(var + eps);
    } else if constexpr (kKind == NormKind::LayerShifted) {
        const int head = C < kShiftHead ? C : kShiftHead;
        float k = 0.0f;
        for (int j = 0; j < head; ++j) k += xr[j];  // every lane, same order: same k
        k /= static_cast<float>(head);
        float s1 = 0.0f, s2 = 0.0f;
        for (int c = lane; c < C; c += 32) {
            const float d = xr[c] - k;
            s1 += d;
            s2 += d * d;
        }
        const float invC = 1.0f / static_cast<float>(C);
        const float md = detail::warpSum(s1) * invC;
        float var = detail::warpSum(s2) * invC - md * md;
        var = var > 0.0f ? var : 0.0f;
        mu = k + md;
        rs = 1.0f / sqrtf(var + eps);
    } else {
        float s = 0.0f;
        for (int c = lane; c < C; c += 32) s += xr[c] * xr[c];
        const float ms = detail::warpSum(s) / static_cast<float>(C);
        rs = 1.0f / sqrtf(ms + eps);
    }
    float* yr = y + off;
    if constexpr (kKind == NormKind::Rms) {
        for (int c = lane; c < C; c += 32) yr[c] = stored(xr[c] * rs * w[c], roundBf16);
    } else if (b) {
        for (int c = lane; c < C; c += 32) yr[c] = stored((xr[c] - mu) * rs * w[c] + b[c], roundBf16);
    } else {
        for (int c = lane; c < C; c += 32) yr[c] = stored((xr[c] - mu) * rs * w[c], roundBf16);
    }
    if (lane == 0) {
        if (mean) mean[row] = mu;
        rstd[row] = rs;
    }
}

// dx for one row per warp. LayerNorm: dx = rstd * (g - mean(g) - xhat * mean(g * xhat));
// RMSNorm (mean == nullptr): dx = rstd * (g - x * rstd^2 * mean(g * x)); g = dy * w.
template <bool kRms>
__global__ void layerOrRmsNormBackwardDxKernel(const float* __restrict__ dy, const float* __restrict__ x,
                                               const float* __restrict__ w, const float* __restrict__ mean,
                                               const float* __restrict__ rstd, float* dx, int T, int C,
                                               bool roundBf16) {
    const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= T) return;
    const int64_t off = static_cast<int64_t>(row) * C;
    const float* dyr = dy + off;
    const float* xr = x + off;
    float* dxr = dx + off;
    const float invC = 1.0f / static_cast<float>(C);
    const float rs = rstd[row];
    if constexpr (kRms) {
        float sgx = 0.0f;
        for (int c = lane; c < C; c += 32) sgx += dyr[c] * w[c] * xr[c];
        const float k = rs * rs * detail::warpSum(sgx) * invC;
        for (int c = lane; c < C; c += 32) dxr[c] = stored(rs * (dyr[c] * w[c] - xr[c] * k), roundBf16);
    } else {
        const float mu = mean[row];
        float sg = 0.0f, sgx = 0.0f;
        for (int c = lane; c < C; c += 32) {
            const float g = dyr[c] * w[c];
            sg += g;
            sgx += g * ((xr[c] - mu) * rs);
        }
        const float meanG = detail::warpSum(sg) * invC;
        const float meanGX = detail::warpSum(sgx) * invC;
        for (int c = lane; c < C; c += 32) {
            const float xhat = (xr[c] - mu) * rs;
            dxr[c] = stored(rs * (dyr[c] * w[c] - meanG - xhat * meanGX), roundBf16);
        }
    }
}

// Parameter gradients, stage 1. Block (32, kRowLanes): 32 columns x a chunk of rows, each
// thread sums every kRowLanes-th row of the chunk, the block adds its row lanes in a fixed
// order. direct: dw/db += the sum (one chunk); else the chunk's sums go to partW/partB
// [nChunks, C]. LayerNorm dw term: dy * ((x - mean) * rstd); RMSNorm (mean == nullptr):
// dy * x * rstd; db term: dy (db may be null).
constexpr int kColTile = 32;
constexpr int kRowLanes = 8;

template <bool kRms>
__global__ void layerOrRmsNormParamGradKernel(const float* __restrict__ dy, const float* __restrict__ x,
                                              const float* __restrict__ mean,
                                              const float* __restrict__ rstd, float* dw, float* db,
                                              float* partW, float* partB, int T, int C, int rowsPerChunk,
                                              bool direct) {
    __shared__ float sW[kRowLanes][kColTile + 1];
    __shared__ float sB[kRowLanes][kColTile + 1];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int c = blockIdx.x * kColTile + tx;
    const int chunk = blockIdx.y;
    const int r0 = chunk * rowsPerChunk;
    const int r1 = min(T, r0 + rowsPerChunk);
    float accW = 0.0f, accB = 0.0f;
    if (c < C) {
        for (int r = r0 + ty; r < r1; r += kRowLanes) {
            const int64_t i = static_cast<int64_t>(r) * C + c;
            const float g = dy[i];
            if constexpr (kRms) {
                accW += g * x[i] * rstd[r];
            } else {
                accW += g * ((x[i] - mean[r]) * rstd[r]);
                accB += g;
            }
        }
    }
    sW[ty][tx] = accW;
    sB[ty][tx] = accB;
    __syncthreads();
    if (ty != 0 || c >= C) return;
    float sw = 0.0f, sb = 0.0f;
    for (int l = 0; l < kRowLanes; ++l) {
        sw += sW[l][tx];
        sb += sB[l][tx];
    }
    if (direct) {
        dw[c] += sw;
        if (!kRms && db) db[c] += sb;
    } else {
        const int64_t o = static_cast<int64_t>(chunk) * C + c;
        partW[o] = sw;
        if (!kRms && db) partB[o] = sb;
    }
}

// Stage 2: dw[c] += sum over chunks in chunk order (and db).
__global__ void layerOrRmsNormAddChunksKernel(const float* __restrict__ partW, const float* __restrict__ partB,
                                              float* dw, float* db, int nChunks, int C) {
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x) {
        float sw = 0.0f, sb = 0.0f;
        for (int k = 0; k < nChunks; ++k) {
            const int64_t o = static_cast<int64_t>(k) * C + c;
            sw += partW[o];
            if (db) sb += partB[o];
        }
        dw[c] += sw;
        if (db) db[c] += sb;
    }
}

Status checkShape(const char* op, int T, int C) {
    if (T < 0 || C <= 0)
        return Status::invalid(std::string(op) + ": need T >= 0 and C > 0 (got T=" +
                               std::to_string(T) + ", C=" + std::to_string(C) + ")");
    return Status::ok();
}

template <NormKind kKind>
Status launchForward(const char* op, const float* x, const float* w, const float* b, float* y,
                     float* mean, float* rstd, int T, int C, float eps, bool roundBf16, void* stream) {
    TS_RETURN_IF_ERROR(checkShape(op, T, C));
    if (T == 0) return Status::ok();
    layerOrRmsNormForwardKernel<kKind><<<rowBlocks(T), kThreads, 0, detail::asStream(stream)>>>(
        x, w, b, y, mean, rstd, T, C, eps, roundBf16);
    return detail::launchStatus(op);
}

// dw (+=), db (+=, may be null; LayerNorm only) over all T rows, deterministic.
template <bool kRms>
Status launchParamGrads(const char* op, const float* dy, const float* x, const float* mean,
                        const float* rstd, float* dw, float* db, int T, int C, void* stream) {
    cudaStream_t s = detail::asStream(stream);
    int dev = 0, sms = 0;
    TS_RETURN_IF_ERROR(detail::fromCuda(cudaGetDevice(&dev), "cudaGetDevice"));
    TS_RETURN_IF_ERROR(detail::fromCuda(
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute"));
    const int colBlocks = (C + kColTile - 1) / kColTile;
    // Enough blocks to fill the device (~4 per SM), each chunk at least 32 rows.
    const int64_t want = (4LL * (sms > 0 ? sms : 1) + colBlocks - 1) / colBlocks;
    const int64_t maxChunks = (static_cast<int64_t>(T) + 31) / 32;
    int64_t nChunks = want < maxChunks ? want : maxChunks;
    if (nChunks < 1) nChunks = 1;
    if (nChunks > 65535) nChunks = 65535;
    int rowsPerChunk = static_cast<int>((T + nChunks - 1) / nChunks);
    nChunks = (T + rowsPerChunk - 1) / rowsPerChunk;
    float* part = nullptr;
    if (nChunks > 1) {
        const size_t bytes = sizeof(float) * static_cast<size_t>(nChunks) * C * (db ? 2 : 1);
        if (cudaMallocAsync(reinterpret_cast<void**>(&part), bytes, s) != cudaSuccess) {
            (void)cudaGetLastError();  // no stream-ordered pool: fall back to one chunk
            part = nullptr;
            nChunks = 1;
            rowsPerChunk = T;
        }
    }
    const bool direct = nChunks == 1;
    float* partW = part;
    float* partB = part && db ? part + static_cast<int64_t>(nChunks) * C : nullptr;
    const dim3 grid(colBlocks, static_cast<unsigned>(nChunks));
    const dim3 block(kColTile, kRowLanes);
    layerOrRmsNormParamGradKernel<kRms><<<grid, block, 0, s>>>(dy, x, mean, rstd, dw, db, partW, partB, T,
                                                     C, rowsPerChunk, direct);
    const Status first = detail::launchStatus(op);
    if (direct) return first;
    if (!first.isOk()) {
        (void)cudaFreeAsync(part, s);
        return first;
    }
    layerOrRmsNormAddChunksKernel<<<detail::blocksFor(C, kThreads), kThreads, 0, s>>>(
        partW, partB, dw, db, static_cast<int>(nChunks), C);
    const Status second = detail::launchStatus(op);
    const Status freed = detail::fromCuda(cudaFreeAsync(part, s), "cudaFreeAsync");
    return second.isOk() ? freed : second;
}

template <bool kRms>
Status launchBackward(const char* op, const float* dy, const float* x, const float* w,
                      const float* mean, const float* rstd, float* dx, float* dw, float* db,
                      int T, int C, bool roundBf16, void* stream) {
    TS_RETURN_IF_ERROR(checkShape(op, T, C));
    if (T == 0) return Status::ok();
    TS_RETURN_IF_ERROR(launchParamGrads<kRms>(op, dy, x, mean, rstd, dw, db, T, C, stream));
    layerOrRmsNormBackwardDxKernel<kRms><<<rowBlocks(T), kThreads, 0, detail::asStream(stream)>>>(
        dy, x, w, mean, rstd, dx, T, C, roundBf16);
    return detail::launchStatus(op);
}

}  // namespace

Status layerNormForward(const float* x, const float* w, const float* b, float* y, float* mean,
                        float* rstd, int T, int C, float eps, bool roundBf16, void* stream) {
    return launchForward<NormKind::LayerTwoPass>("layerNormForward", x, w, b, y, mean, rstd, T, C,
                                                 eps, roundBf16, stream);
}

Status layerNormForwardFused(const float* x, const float* w, const float* b, float* y,
                             float* mean, float* rstd, int T, int C, float eps, bool roundBf16, void* stream) {
    return launchForward<NormKind::LayerShifted>("layerNormForwardFused", x, w, b, y, mean, rstd,
                                                 T, C, eps, roundBf16, stream);
}

Status rmsNormForward(const float* x, const float* w, float* y, float* rstd, int T, int C,
                      float eps, bool roundBf16, void* stream) {
    return launchForward<NormKind::Rms>("rmsNormForward", x, w, nullptr, y, nullptr, rstd, T, C,
                                        eps, roundBf16, stream);
}

Status layerNormBackward(const float* dy, const float* x, const float* w, const float* mean,
                         const float* rstd, float* dx, float* dw, float* db, int T, int C,
                         bool roundBf16, void* stream) {
    return launchBackward<false>("layerNormBackward", dy, x, w, mean, rstd, dx, dw, db, T, C,
                                 roundBf16, stream);
}

Status layerNormBackwardFused(const float* dy, const float* x, const float* w,
                              const float* mean, const float* rstd, float* dx, float* dw,
                              float* db, int T, int C, bool roundBf16, void* stream) {
    return launchBackward<false>("layerNormBackwardFused", dy, x, w, mean, rstd, dx, dw, db, T,
                                 C, roundBf16, stream);
}

Status rmsNormBackward(const float* dy, const float* x, const float* w, const float* rstd,
                       float* dx, float* dw, int T, int C, bool roundBf16, void* stream) {
    return launchBackward<true>("rmsNormBackward", dy, x, w, nullptr, rstd, dx, dw, nullptr, T, C,
                                roundBf16, stream);
}

}  // namespace ts::kernels::cuda
