// LayerNorm (unfused: mean, variance and normalize passes; fused: one statistics pass) and
// RMSNorm, forward and backward.
// x, y: [T, C] rows; statistics per row in float (C is at most a few thousand here).
#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec_math.h"

#include <cmath>
#include <cstring>

namespace ts::kernels::cpu {

using detail::kLanes;

namespace {

// y = (x - mean) * rstd * w (+ b)
inline void normalizeRow(const float* x, const float* w, const float* b, float* y, float mean,
                         float rstd, int C) {
    if (b) {
        for (int c = 0; c < C; ++c) y[c] = (x[c] - mean) * rstd * w[c] + b[c];
    } else {
        for (int c = 0; c < C; ++c) y[c] = (x[c] - mean) * rstd * w[c];
    }
}

// One pass over the row: float sums of d = x - k and d^2 in kLanes lanes, shifted by k = the
// mean of the first few elements, so var = E[d^2] - E[d]^2 has no cancellation worth
// speaking of (|mean - k| is a fraction of a standard deviation for non-pathological rows).
// On a CPU this beats both Welford (a per-element update chain, ~2x slower on rows that sit
// in L1) and the two-pass form, which is what "fused" has to buy here.
inline void shiftedMomentsRow(const float* x, int C, float& meanOut, float& varOut) {
    const int head = C < kLanes ? C : kLanes;
    float k = 0.0f;
    for (int j = 0; j < head; ++j) k += x[j];
    k /= static_cast<float>(head);
    // GCC vector types: with two arrays of lane accumulators GCC picks outer-loop
    // vectorization with lane shuffles here, which is 3x slower than this explicit form.
    typedef float V8 __attribute__((vector_size(32)));
    V8 s1a = {}, s1b = {}, s2a = {}, s2b = {};
    int j = 0;
    for (; j + 16 <= C; j += 16) {
        V8 xa, xb;
        std::memcpy(&xa, x + j, sizeof xa);
        std::memcpy(&xb, x + j + 8, sizeof xb);
        const V8 da = xa - k, db = xb - k;
        s1a += da;
        s1b += db;
        s2a += da * da;
        s2b += db * db;
    }
    float a = 0.0f, b = 0.0f;
    for (; j < C; ++j) {
        const float d = x[j] - k;
        a += d;
        b += d * d;
    }
    for (int l = 0; l < 8; ++l) {
        a += s1a[l] + s1b[l];
        b += s2a[l] + s2b[l];
    }
    const float invC = 1.0f / static_cast<float>(C);
    const float md = a * invC;
    const float var = b * invC - md * md;
    meanOut = k + md;
    varOut = var > 0.0f ? var : 0.0f;
}

}  // namespace

void layerNormForward(const float* x, const float* w, const float* b, float* y, float* mean,
                      float* rstd, int T, int C, float eps, bool roundBf16) {
    // Textbook: mean pass, variance pass (biased, like torch), normalize pass.
    for (int t = 0; t < T; ++t) {
        const float* xr = x + static_cast<int64_t>(t) * C;
        const float mu = detail::sumLanes(xr, C) / static_cast<float>(C);
        float acc[kLanes] = {};
        int j = 0;
        for (; j + kLanes <= C; j += kLanes)
            for (int l = 0; l < kLanes; ++l) {
                const float d = xr[j + l] - mu;
                acc[l] += d * d;
            }
        float var = 0.0f;
        for (; j < C; ++j) var += (xr[j] - mu) * (xr[j] - mu);
        for (int l = 0; l < kLanes; ++l) var += acc[l];
        var /= static_cast<float>(C);
        const float rs = 1.0f / std::sqrt(var + eps);
        mean[t] = mu;
        rstd[t] = rs;
        normalizeRow(xr, w, b, y + static_cast<int64_t>(t) * C, mu, rs, C);
        if (roundBf16) roundToBf16(y + static_cast<int64_t>(t) * C, C);
    }
}

void layerNormForwardFused(const float* x, const float* w, const float* b, float* y,
                           float* mean, float* rstd, int T, int C, float eps, bool roundBf16) {
    for (int t = 0; t < T; ++t) {
        const float* xr = x + static_cast<int64_t>(t) * C;
        float mu, var;
        shiftedMomentsRow(xr, C, mu, var);
        const float rs = 1.0f / std::sqrt(var + eps);
        mean[t] = mu;
        rstd[t] = rs;
        normalizeRow(xr, w, b, y + static_cast<int64_t>(t) * C, mu, rs, C);
        if (roundBf16) roundToBf16(y + static_cast<int64_t>(t) * C, C);
    }
}

// Backward with xhat = (x - mean) * rstd, g = dy * w:
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  dw += dy * xhat,  db += dy.
void layerNormBackward(const float* dy, const float* x, const float* w, const float* mean,
                       const float* rstd, float* dx, float* dw, float* db, int T, int C, bool roundBf16) {
    // Unfused: one pass per reduction, then dx, then the parameter grads (as separate kernels
    // of a naive framework would).
    const float invC = 1.0f / static_cast<float>(C);
    for (int t = 0; t < T; ++t) {
        const int64_t off = static_cast<int64_t>(t) * C;
        const float* dyr = dy + off;
        const float* xr = x + off;
        float* dxr = dx + off;
        const float mu = mean[t], rs = rstd[t];
        const float meanG = detail::dotLanes(dyr, w, C) * invC;
        float acc[kLanes] = {};
        int j = 0;
        for (; j + kLanes <= C; j += kLanes)
            for (int l = 0; l < kLanes; ++l)
                acc[l] += dyr[j + l] * w[j + l] * ((xr[j + l] - mu) * rs);
        float sgx = 0.0f;
        for (; j < C; ++j) sgx += dyr[j] * w[j] * ((xr[j] - mu) * rs);
        for (int l = 0; l < kLanes; ++l) sgx += acc[l];
        const float meanGX = sgx * invC;
        for (int c = 0; c < C; ++c) {
            const float xhat = (xr[c] - mu) * rs;
            dxr[c] = rs * (dyr[c] * w[c] - meanG - xhat * meanGX);
        }
        if (roundBf16) roundToBf16(dxr, C);
    }
    for (int t = 0; t < T; ++t) {
        const int64_t off = static_cast<int64_t>(t) * C;
        const float mu = mean[t], rs = rstd[t];
        for (int c = 0; c < C; ++c) dw[c] += dy[off + c] * ((x[off + c] - mu) * rs);
    }
    if (db) biasGradAccumulate(dy, db, T, C);
}

void layerNormBackwardFused(const float* dy, const float* x, const float* w, const float* mean,
                            const float* rstd, float* dx, float* dw, float* db, int T, int C, bool roundBf16) {
    // Fused: both reductions and the dw/db accumulation in one pass over the row, then dx.
    const float invC = 1.0f / static_cast<float>(C);
    for (int t = 0; t < T; ++t) {
        const int64_t off = static_cast<int64_t>(t) * C;
        const float* dyr = dy + off;
        const float* xr = x + off;
        float* dxr = dx + off;
        const float mu = mean[t], rs = rstd[t];
        float accG[kLanes] = {};
        float accGX[kLanes] = {};
        int j = 0;
        for (; j + kLanes <= C; j += kLanes)
            for (int l = 0; l < kLanes; ++l) {
                const int c = j + l;
                const float xhat = (xr[c] - mu) * rs;
                const float g = dyr[c] * w[c];
                accG[l] += g;
                accGX[l] += g * xhat;
                dw[c] += dyr[c] * xhat;
            }
        float sg = 0.0f, sgx = 0.0f;
        for (; j < C; ++j) {
            const float xhat = (xr[j] - mu) * rs;
            const float g = dyr[j] * w[j];
            sg += g;
            sgx += g * xhat;
            dw[j] += dyr[j] * xhat;
        }
        for (int l = 0; l < kLanes; ++l) {
            sg += accG[l];
            sgx += accGX[l];
        }
        if (db)
            for (int c = 0; c < C; ++c) db[c] += dyr[c];
        const float meanG = sg * invC, meanGX = sgx * invC;
        for (int c = 0; c < C; ++c) {
            const float xhat = (xr[c] - mu) * rs;
            dxr[c] = rs * (dyr[c] * w[c] - meanG - xhat * meanGX);
        }
        if (roundBf16) roundToBf16(dxr, C);
    }
}

void rmsNormForward(const float* x, const float* w, float* y, float* rstd, int T, int C,
                    float eps, bool roundBf16) {
    for (int t = 0; t < T; ++t) {
        const int64_t off = static_cast<int64_t>(t) * C;
        const float* xr = x + off;
        const float ms = detail::dotLanes(xr, xr, C) / static_cast<float>(C);
        const float rs = 1.0f / std::sqrt(ms + eps);
        rstd[t] = rs;
        float* yr = y + off;
        for (int c = 0; c < C; ++c) yr[c] = xr[c] * rs * w[c];
        if (roundBf16) roundToBf16(yr, C);
    }
}

// dx = rstd * (g - x * rstd^2 * mean(g * x)), g = dy * w;  dw += dy * x * rstd.
void rmsNormBackward(const float* dy, const float* x, const float* w, const float* rstd,
                     float* dx, float* dw, int T, int C, bool roundBf16) {
    const float invC = 1.0f / static_cast<float>(C);
    for (int t = 0; t < T; ++t) {
        const int64_t off = static_cast<int64_t>(t) * C;
        const float* dyr = dy + off;
        const float* xr = x + off;
        float* dxr = dx + off;
        const float rs = rstd[t];
        float acc[kLanes] = {};
        int j = 0;
        for (; j + kLanes <= C; j += kLanes)
            for (int l = 0; l < kLanes; ++l) {
                const int c = j + l;
                acc[l] += dyr[c] * w[c] * xr[c];
                dw[c] += dyr[c] * xr[c] * rs;
            }
        float sgx = 0.0f;
        for (; j < C; ++j) {
            sgx += dyr[j] * w[j] * xr[j];
            dw[j] += dyr[j] * xr[j] * rs;
        }
        for (int l = 0; l < kLanes; ++l) sgx += acc[l];
        const float k = rs * rs * sgx * invC;
        for (int c = 0; c < C; ++c) dxr[c] = rs * (dyr[c] * w[c] - xr[c] * k);
        if (roundBf16) roundToBf16(dxr, C);
    }
}

}  // namespace ts::kernels::cpu
