// Elementwise helpers (add, scale, bias) and the embedding lookup.
#include "kernels/cpu/ops.h"

#include "kernels/common/bf16.h"

#include <cmath>
#include <cstring>

namespace ts::kernels::cpu {

void add(const float* a, const float* b, float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

void addInPlace(float* y, const float* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void scale(float* y, float alpha, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] *= alpha;
}

void addBias(float* y, const float* b, int T, int C) {
    for (int t = 0; t < T; ++t) {
        float* row = y + static_cast<int64_t>(t) * C;
        for (int c = 0; c < C; ++c) row[c] += b[c];
    }
}

void biasGradAccumulate(const float* dy, float* db, int T, int C) {
    // Row-major sweep: db stays in L1 while dy streams; vectorizes along C.
    for (int t = 0; t < T; ++t) {
        const float* row = dy + static_cast<int64_t>(t) * C;
        for (int c = 0; c < C; ++c) db[c] += row[c];
    }
}

double sumSquares(const float* x, int64_t n) {
    constexpr int kL = 8;
    double acc[kL] = {};
    int64_t i = 0;
    for (; i + kL <= n; i += kL)
        for (int l = 0; l < kL; ++l) {
            const double v = x[i + l];
            acc[l] += v * v;
        }
    double s = 0.0;
    for (; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
    for (int l = 0; l < kL; ++l) s += acc[l];
    return s;
}

bool allFinite(const float* x, int64_t n) {
    // x - x is 0 for finite x and NaN for inf/NaN; OR-ing the comparison keeps it branch-free.
    int bad = 0;
    for (int64_t i = 0; i < n; ++i) bad |= !(x[i] - x[i] == 0.0f);
    return bad == 0;
}

int countInvalidIds(const int32_t* ids, int T, int vocabSize) {
    int bad = 0;
    for (int t = 0; t < T; ++t) bad += (ids[t] < 0 || ids[t] >= vocabSize) ? 1 : 0;
    return bad;
}

int embeddingForward(const int32_t* ids, const float* table, float* out, int T, int C,
                     int vocabStart, int vocabEnd, int vocabSize) {
    int invalid = 0;
    for (int t = 0; t < T; ++t) {
        const int32_t id = ids[t];
        float* row = out + static_cast<int64_t>(t) * C;
        if (id < 0 || id >= vocabSize) ++invalid;
        if (id >= vocabStart && id < vocabEnd && id < vocabSize && id >= 0)
            std::memcpy(row, table + static_cast<int64_t>(id - vocabStart) * C,
                        sizeof(float) * C);
        else
            std::memset(row, 0, sizeof(float) * C);
    }
    return invalid;
}

void embeddingLookup(const int32_t* ids, const float* table, float* out, int T, int C, int vocabStart,
                     int vocabEnd, int vocabSize) {
    (void)embeddingForward(ids, table, out, T, C, vocabStart, vocabEnd, vocabSize);
}

void embeddingLookupBf16(const int32_t* ids, const uint16_t* table, float* out, int T, int C,
                         int vocabStart, int vocabEnd, int vocabSize) {
    for (int t = 0; t < T; ++t) {
        const int32_t id = ids[t];
        float* row = out + static_cast<int64_t>(t) * C;
        if (id >= vocabStart && id < vocabEnd && id < vocabSize && id >= 0) {
            const uint16_t* src = table + static_cast<int64_t>(id - vocabStart) * C;
            for (int c = 0; c < C; ++c) row[c] = hd::bf16ToFloatValue(src[c]);
        } else {
            std::memset(row, 0, sizeof(float) * C);
        }
    }
}

void embeddingBackward(const int32_t* ids, const float* dout, float* dtable, int T, int C,
                       int vocabStart, int vocabEnd) {
    for (int t = 0; t < T; ++t) {
        const int32_t id = ids[t];
        if (id < vocabStart || id >= vocabEnd) continue;
        float* dst = dtable + static_cast<int64_t>(id - vocabStart) * C;
        const float* src = dout + static_cast<int64_t>(t) * C;
        for (int c = 0; c < C; ++c) dst[c] += src[c];
    }
}

void positionEmbeddingForward(const float* table, float* out, int s, int b, int C) {
    for (int i = 0; i < s; ++i) {
        const float* src = table + static_cast<int64_t>(i) * C;
        for (int j = 0; j < b; ++j) {
            float* row = out + (static_cast<int64_t>(i) * b + j) * C;
            for (int c = 0; c < C; ++c) row[c] += src[c];
        }
    }
}

void positionEmbeddingForwardBf16(const uint16_t* table, float* out, int s, int b, int C) {
    for (int i = 0; i < s; ++i) {
        const uint16_t* src = table + static_cast<int64_t>(i) * C;
        for (int j = 0; j < b; ++j) {
            float* row = out + (static_cast<int64_t>(i) * b + j) * C;
            for (int c = 0; c < C; ++c) row[c] += hd::bf16ToFloatValue(src[c]);
        }
    }
}

void positionEmbeddingBackward(const float* dout, float* dtable, int s, int b, int C) {
    for (int i = 0; i < s; ++i) {
        float* dst = dtable + static_cast<int64_t>(i) * C;
        for (int j = 0; j < b; ++j) {
            const float* row = dout + (static_cast<int64_t>(i) * b + j) * C;
            for (int c = 0; c < C; ++c) dst[c] += row[c];
        }
    }
}

}  // namespace ts::kernels::cpu
