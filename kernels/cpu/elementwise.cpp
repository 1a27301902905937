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

void sumSquaresAccumulate(const float* x, int64_t n, double* acc, float* accAsFloat) {
    *acc += sumSquares(x, n);
    if (accAsFloat) *accAsFloat = float(*acc);
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

namespace {
// A table element as a float: fp32 as is, bf16 bits widened (exact).
inline float tableValue(float v) { return v; }
inline float tableValue(uint16_t bits) { return hd::bf16ToFloatValue(bits); }

// out[t] = the table's row of ids[t] where the id is in [vocabStart, vocabEnd) and a valid id,
// else zeros (the vocabulary-parallel lookup; the table holds rows vocabStart..vocabEnd-1).
template <typename Elem>
void lookupRows(const int32_t* ids, const Elem* table, float* out, int T, int C, int vocabStart, int vocabEnd,
                int vocabSize) {
    for (int t = 0; t < T; ++t) {
        const int32_t id = ids[t];
        float* row = out + static_cast<int64_t>(t) * C;
        if (id >= vocabStart && id < vocabEnd && id < vocabSize && id >= 0) {
            const Elem* src = table + static_cast<int64_t>(id - vocabStart) * C;
            for (int c = 0; c < C; ++c) row[c] = tableValue(src[c]);
        } else {
            std::memset(row, 0, sizeof(float) * C);
        }
    }
}

// out[i*b + j] += table[i] for the s positions of b sequences (seq-major rows).
template <typename Elem>
void addPositionRows(const Elem* table, float* out, int s, int b, int C) {
    for (int i = 0; i < s; ++i) {
        const Elem* src = table + static_cast<int64_t>(i) * C;
        for (int j = 0; j < b; ++j) {
            float* row = out + (static_cast<int64_t>(i) * b + j) * C;
            for (int c = 0; c < C; ++c) row[c] += tableValue(src[c]);
        }
    }
}
}  // namespace

int embeddingForward(const int32_t* ids, const float* table, float* out, int T, int C,
                     int vocabStart, int vocabEnd, int vocabSize) {
    lookupRows(ids, table, out, T, C, vocabStart, vocabEnd, vocabSize);
    return countInvalidIds(ids, T, vocabSize);
}

void embeddingLookup(const int32_t* ids, const float* table, float* out, int T, int C, int vocabStart,
                     int vocabEnd, int vocabSize) {
    lookupRows(ids, table, out, T, C, vocabStart, vocabEnd, vocabSize);
}

void embeddingLookupBf16(const int32_t* ids, const uint16_t* table, float* out, int T, int C,
                         int vocabStart, int vocabEnd, int vocabSize) {
    lookupRows(ids, table, out, T, C, vocabStart, vocabEnd, vocabSize);
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
    addPositionRows(table, out, s, b, C);
}

void positionEmbeddingForwardBf16(const uint16_t* table, float* out, int s, int b, int C) {
    addPositionRows(table, out, s, b, C);
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
