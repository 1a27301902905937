// Token embedding (vocab-parallel aware) and learned position embedding, forward and backward,
// as kernels/cpu/elementwise.cpp. All four are bit-identical to the CPU:
// - embeddingForward gathers rows (zero rows for ids outside [vocabStart, vocabEnd) or invalid);
//   the invalid-id count goes to a device int through countInvalidIds. embeddingLookup is the
//   gather alone; the Bf16 variants (lookup, position forward) read a bf16 model copy's bits.
// - embeddingBackward: dtable[id - vocabStart] += dout[t] for owned tokens, where several tokens
//   may hit one row. The CPU adds them to the row in token order; here the owned tokens are
//   stably sorted by row (CUB radix sort of (row, t) pairs, so equal rows keep increasing t),
//   and one block per distinct row walks its tokens in that order, each thread owning columns:
//   the same additions in the same order, no atomics. Scratch (keys, values, CUB's temporary
//   storage) comes from the stream-ordered allocator (cudaMallocAsync), so nothing synchronizes.
// - positionEmbeddingBackward: one thread per (position, column) adds the b batch rows in order.
#include "kernels/common/bf16.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/ops_cuda.h"

#include <cub/device/device_radix_sort.cuh>

namespace ts::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxRowBlocks = 65535 * 4;

using detail::globalThread;
using detail::gridThreads;

// A table element as a float: fp32 words, or a bf16 model copy's bits (exact).
__device__ inline float tableValue(const float* p) { return *p; }
__device__ inline float tableValue(const uint16_t* p) { return hd::bf16ToFloatValue(*p); }

// One block per token row (grid-stride over rows), threads over columns. out: [T, C].
template <typename Table>
__global__ void embeddingGatherKernel(const int32_t* __restrict__ ids, const Table* __restrict__ table,
                                      float* __restrict__ out, int T, int C, int vocabStart, int vocabEnd,
                                      int vocabSize) {
    for (int t = blockIdx.x; t < T; t += gridDim.x) {
        const int32_t id = ids[t];
        float* row = out + static_cast<int64_t>(t) * C;
        if (id >= vocabStart && id < vocabEnd && id < vocabSize && id >= 0) {
            const Table* src = table + static_cast<int64_t>(id - vocabStart) * C;
            for (int c = threadIdx.x; c < C; c += blockDim.x) row[c] = tableValue(src + c);
        } else {
            for (int c = threadIdx.x; c < C; c += blockDim.x) row[c] = 0.0f;
        }
    }
}

// keys[t] = local row of token t, or `rows` (sorts last, skipped) when not owned; vals[t] = t.
__global__ void embeddingKeysKernel(const int32_t* __restrict__ ids, int T, int vocabStart, int vocabEnd,
                                    int* __restrict__ keys, int* __restrict__ vals) {
    const int rows = vocabEnd - vocabStart;
    for (int64_t t = globalThread(); t < T; t += gridThreads()) {
        const int32_t id = ids[t];
        keys[t] = (id >= vocabStart && id < vocabEnd) ? id - vocabStart : rows;
        vals[t] = static_cast<int>(t);
    }
}

// Sorted (row, t) pairs: the block at the first position j of each row's run adds that row's
// tokens to dtable in increasing t, each thread owning columns c, c + blockDim, ...
__global__ void embeddingSegmentAddKernel(const int* __restrict__ rowOf, const int* __restrict__ tokenOf,
                                          const float* __restrict__ dout, float* __restrict__ dtable, int T,
                                          int C, int rows) {
    for (int j = blockIdx.x; j < T; j += gridDim.x) {
        const int row = rowOf[j];
        if (row >= rows || (j > 0 && rowOf[j - 1] == row)) continue;  // not owned, or not a run head
        float* dst = dtable + static_cast<int64_t>(row) * C;
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            float acc = dst[c];
            for (int k = j; k < T && rowOf[k] == row; ++k) acc += dout[static_cast<int64_t>(tokenOf[k]) * C + c];
            dst[c] = acc;
        }
    }
}

// out[(i*b + j), c] += table[i, c]; n = s * b * C.
template <typename Table>
__global__ void positionEmbeddingForwardKernel(const Table* __restrict__ table, float* __restrict__ out, int64_t n,
                                               int b, int C) {
    for (int64_t k = globalThread(); k < n; k += gridThreads()) {
        const int64_t row = k / C, c = k % C;
        out[k] = __fadd_rn(out[k], tableValue(table + (row / b) * C + c));
    }
}

template <typename Table>
Status gather(const int32_t* ids, const Table* table, float* out, int T, int C, int vocabStart, int vocabEnd,
              int vocabSize, void* stream) {
    if (T < 0 || C < 0) return Status::invalid("embedding lookup: need T >= 0 and C >= 0");
    if (T == 0 || C == 0) return Status::ok();
    const int blocks = T < kMaxRowBlocks ? T : kMaxRowBlocks;
    embeddingGatherKernel<Table><<<blocks, kThreads, 0, detail::asStream(stream)>>>(ids, table, out, T, C,
                                                                                   vocabStart, vocabEnd, vocabSize);
    return detail::launchStatus("embedding lookup launch");
}

template <typename Table>
Status addPositions(const Table* table, float* out, int s, int b, int C, void* stream) {
    if (s < 0 || b < 0 || C < 0) return Status::invalid("positionEmbeddingForward: need s, b, C >= 0");
    const int64_t n = static_cast<int64_t>(s) * b * C;
    if (n == 0) return Status::ok();
    positionEmbeddingForwardKernel<Table>
        <<<detail::blocksFor(n, kThreads), kThreads, 0, detail::asStream(stream)>>>(table, out, n, b, C);
    return detail::launchStatus("positionEmbeddingForward launch");
}

// dtable[i, c] += dout[i*b + 0, c] + ... in j order (as the CPU); n = s * C.
__global__ void positionEmbeddingBackwardKernel(const float* __restrict__ dout, float* __restrict__ dtable, int64_t n,
                                                int b, int C) {
    for (int64_t k = globalThread(); k < n; k += gridThreads()) {
        const int64_t i = k / C, c = k % C;
        float acc = dtable[k];
        for (int j = 0; j < b; ++j) acc = __fadd_rn(acc, dout[(i * b + j) * C + c]);
        dtable[k] = acc;
    }
}

// Bits needed for keys in [0, maxKey].
int keyBits(int maxKey) {
    int bits = 1;
    while (bits < 31 && (maxKey >> bits) != 0) ++bits;
    return bits;
}

size_t alignUp(size_t v) { return (v + 255) & ~size_t{255}; }

// embeddingBackward's three passes on scratch = [keys in | keys out | values in | values out |
// CUB temporary storage], each array `arr` bytes.
Status embeddingBackwardSorted(const int32_t* ids, const float* dout, float* dtable, int T, int C, int vocabStart,
                               int vocabEnd, int bits, char* scratch, size_t arr, size_t cubBytes, cudaStream_t s) {
    int* keysIn = reinterpret_cast<int*>(scratch);
    int* keysOut = reinterpret_cast<int*>(scratch + arr);
    int* valsIn = reinterpret_cast<int*>(scratch + 2 * arr);
    int* valsOut = reinterpret_cast<int*>(scratch + 3 * arr);
    void* cubTemp = scratch + 4 * arr;
    embeddingKeysKernel<<<detail::blocksFor(T, kThreads), kThreads, 0, s>>>(ids, T, vocabStart, vocabEnd, keysIn,
                                                                           valsIn);
    TS_RETURN_IF_ERROR(detail::launchStatus("embeddingBackward keys launch"));
    // Radix sort is stable: tokens of one row stay in increasing t.
    TS_RETURN_IF_ERROR(detail::fromCuda(
        cub::DeviceRadixSort::SortPairs(cubTemp, cubBytes, keysIn, keysOut, valsIn, valsOut, T, 0, bits, s),
        "embeddingBackward sort"));
    const int blocks = T < kMaxRowBlocks ? T : kMaxRowBlocks;
    embeddingSegmentAddKernel<<<blocks, kThreads, 0, s>>>(keysOut, valsOut, dout, dtable, T, C,
                                                          vocabEnd - vocabStart);
    return detail::launchStatus("embeddingBackward add launch");
}

}  // namespace

Status embeddingForward(const int32_t* ids, const float* table, float* out, int T, int C, int vocabStart,
                        int vocabEnd, int vocabSize, int* invalidCount, void* stream) {
    if (T < 0 || C < 0) return Status::invalid("embeddingForward: need T >= 0 and C >= 0");
    if (invalidCount) TS_RETURN_IF_ERROR(countInvalidIds(ids, T, vocabSize, invalidCount, stream));
    return gather(ids, table, out, T, C, vocabStart, vocabEnd, vocabSize, stream);
}

Status embeddingLookup(const int32_t* ids, const float* table, float* out, int T, int C, int vocabStart,
                       int vocabEnd, int vocabSize, void* stream) {
    return gather(ids, table, out, T, C, vocabStart, vocabEnd, vocabSize, stream);
}

Status embeddingLookupBf16(const int32_t* ids, const uint16_t* table, float* out, int T, int C, int vocabStart,
                           int vocabEnd, int vocabSize, void* stream) {
    return gather(ids, table, out, T, C, vocabStart, vocabEnd, vocabSize, stream);
}

Status embeddingBackward(const int32_t* ids, const float* dout, float* dtable, int T, int C, int vocabStart,
                         int vocabEnd, void* stream) {
    if (T < 0 || C < 0) return Status::invalid("embeddingBackward: need T >= 0 and C >= 0");
    if (T == 0 || C == 0 || vocabEnd <= vocabStart) return Status::ok();
    const int rows = vocabEnd - vocabStart;  // > 0; key `rows` marks tokens this rank does not own
    const int bits = keyBits(rows);
    cudaStream_t s = detail::asStream(stream);

    size_t cubBytes = 0;
    TS_RETURN_IF_ERROR(detail::fromCuda(
        cub::DeviceRadixSort::SortPairs(nullptr, cubBytes, static_cast<const int*>(nullptr),
                                        static_cast<int*>(nullptr), static_cast<const int*>(nullptr),
                                        static_cast<int*>(nullptr), T, 0, bits, s),
        "embeddingBackward sort size"));
    const size_t arr = alignUp(sizeof(int) * static_cast<size_t>(T));
    void* scratch = nullptr;
    TS_RETURN_IF_ERROR(detail::fromCuda(cudaMallocAsync(&scratch, 4 * arr + alignUp(cubBytes), s),
                                        "embeddingBackward scratch (cudaMallocAsync)"));
    const Status st = embeddingBackwardSorted(ids, dout, dtable, T, C, vocabStart, vocabEnd, bits,
                                              static_cast<char*>(scratch), arr, cubBytes, s);
    const Status freed = detail::fromCuda(cudaFreeAsync(scratch, s), "embeddingBackward scratch (cudaFreeAsync)");
    return st.isOk() ? freed : st;
}

Status positionEmbeddingForward(const float* table, float* out, int s, int b, int C, void* stream) {
    return addPositions(table, out, s, b, C, stream);
}

Status positionEmbeddingForwardBf16(const uint16_t* table, float* out, int s, int b, int C, void* stream) {
    return addPositions(table, out, s, b, C, stream);
}

Status positionEmbeddingBackward(const float* dout, float* dtable, int s, int b, int C, void* stream) {
    if (s < 0 || b < 0 || C < 0) return Status::invalid("positionEmbeddingBackward: need s, b, C >= 0");
    const int64_t n = static_cast<int64_t>(s) * C;
    if (n == 0 || b == 0) return Status::ok();
    positionEmbeddingBackwardKernel<<<detail::blocksFor(n, kThreads), kThreads, 0, detail::asStream(stream)>>>(dout, dtable,
                                                                                                               n, b, C);
    return detail::launchStatus("positionEmbeddingBackward launch");
}

}  // namespace ts::kernels::cuda
