// Rotary position embedding (rotate-half, as kernels/cpu/rope.cpp) and the QKV layout copies
// fused with it. x: [s, b, n, d]; qkv: [s, b, ng, nq/ng + 2, d]; q: [s, b, nq, d]; k, v:
// [s, b, ng, d]. Pair i < d/2 of position pos turns by pos * inv_freq[i].
//
// One thread per (row, column item): item i < d/2 is the pair (i, i + d/2), item d/2 (odd d only)
// is the unrotated last element. The pair's cos and sin come from tables [s, d/2] made once per
// (GPU, s, d, theta, first position) by ropeCosSin and kept for the process (ropeTables): RoPE
// runs at every layer, microbatch and step with the same positions, and the double-precision
// pow and sincos per item were most of its time. The tables hold exactly what each thread used
// to compute, so the results are the same bits. Past kMaxRopeTables distinct tables the threads
// compute their angles again.
//
// Differences from the CPU, and why:
// - inv_freq = 1 / theta^(2i/d) and cos/sin are evaluated in double and rounded to float, where
//   the CPU calls glibc powf/cosf/sinf on the same float arguments. Both are (almost always)
//   the correctly rounded float, so the tables agree to the last bit except in rare ties; the
//   rotation itself may be contracted to FMAs differently. Results agree to ~1 ulp, not bitwise.
// - ropeForward (the unfused reference) builds the [s, d] cos/sin tables in a stream-ordered
//   device allocation (cudaMallocAsync) and applies them in a second kernel, as the CPU builds
//   them in a vector. For odd d it keeps the CPU's behaviour exactly: the tables' last column
//   is 0, so the last element becomes x*0 + 0 (the fused kernels leave it as is).
#include "kernels/common/bf16.h"
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/ops_cuda.h"

#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

namespace ts::kernels::cuda {

namespace {

constexpr int kThreads = 256;

__device__ inline float invFreq(int i, int d, float theta) {
    const float expo = static_cast<float>(2 * i) / static_cast<float>(d);
    return 1.0f / static_cast<float>(pow(static_cast<double>(theta), static_cast<double>(expo)));
}

// cos and sin of the angle of pair i at position pos, as float (see the header comment).
__device__ inline void ropeCosSin(int pos, int i, int d, float theta, float* c, float* sn) {
    const float ang = static_cast<float>(pos) * invFreq(i, d, theta);
    double sd, cd;
    sincos(static_cast<double>(ang), &sd, &cd);
    *c = static_cast<float>(cd);
    *sn = static_cast<float>(sd);
}

// Pair i of position index si (position posOffset + si): from the tables when there are some
// ([s, half] each), else computed.
__device__ inline void ropePair(const float* __restrict__ cosT, const float* __restrict__ sinT, int si, int i,
                                int d, float theta, int posOffset, float* c, float* sn) {
    if (cosT) {
        const int64_t at = static_cast<int64_t>(si) * (d / 2) + i;
        *c = cosT[at];
        *sn = sinT[at];
        return;
    }
    ropeCosSin(posOffset + si, i, d, theta, c, sn);
}

// The tables of ropeTables: cosT, sinT [s, half].
__global__ void rotaryPairTablesKernel(float* __restrict__ cosT, float* __restrict__ sinT, int s, int d,
                                       float theta, int posOffset) {
    const int half = d / 2;
    const int64_t n = static_cast<int64_t>(s) * half;
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t it = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; it < n; it += stride)
        ropeCosSin(posOffset + static_cast<int>(it / half), static_cast<int>(it % half), d, theta, &cosT[it], &sinT[it]);
}

// In place on x: [s, b*n rows of d]. Items: (row, i), i < half. sign = +1 forward, -1 backward.
__global__ void rotaryInPlaceKernel(float* __restrict__ x, int64_t rows, int rowsPerPos, int d,
                                    float theta, int posOffset, float sign, const float* __restrict__ cosT,
                                    const float* __restrict__ sinT) {
    const int half = d / 2;
    const int64_t n = rows * half;
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t it = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; it < n;
         it += stride) {
        const int64_t row = it / half;
        const int i = static_cast<int>(it % half);
        const int si = static_cast<int>(row / rowsPerPos);
        float c, sn;
        ropePair(cosT, sinT, si, i, d, theta, posOffset, &c, &sn);
        sn *= sign;
        float* xr = x + row * d;
        const float a = xr[i], bb = xr[half + i];
        xr[i] = a * c - bb * sn;
        xr[half + i] = bb * c + a * sn;
    }
}

// The unfused reference's tables: cosT, sinT [s, d]; columns i and half+i hold pair i's values,
// column d-1 of odd d is 0 (as the CPU's zero-initialised vectors).
__global__ void rotaryTablesKernel(float* __restrict__ cosT, float* __restrict__ sinT, int s, int d,
                                   float theta, int posOffset) {
    const int half = d / 2;
    const int64_t n = static_cast<int64_t>(s) * d;
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t it = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; it < n;
         it += stride) {
        const int si = static_cast<int>(it / d);
        const int col = static_cast<int>(it % d);
        float c = 0.0f, sn = 0.0f;
        if (col < 2 * half) ropeCosSin(posOffset + si, col < half ? col : col - half, d, theta, &c, &sn);
        cosT[it] = c;
        sinT[it] = sn;
    }
}

// out = x * cos + rotate_half(x) * sin with rotate_half(x) = [-x2, x1] (and 0 in the odd last
// column), in place. Items: (row, i), i < half + (d odd).
__global__ void rotaryApplyTablesKernel(float* __restrict__ x, const float* __restrict__ cosT,
                                        const float* __restrict__ sinT, int64_t rows, int rowsPerPos,
                                        int d) {
    const int half = d / 2;
    const int items = half + (d & 1);
    const int64_t n = rows * items;
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t it = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; it < n;
         it += stride) {
        const int64_t row = it / items;
        const int i = static_cast<int>(it % items);
        const int64_t si = row / rowsPerPos;
        const float* c = cosT + si * d;
        const float* sn = sinT + si * d;
        float* xr = x + row * d;
        if (i < half) {
            const float a = xr[i], bb = xr[half + i];
            const float r1 = -bb * sn[i], r2 = a * sn[half + i];
            xr[i] = a * c[i] + r1;
            xr[half + i] = bb * c[half + i] + r2;
        } else {  // odd d: rotate_half leaves 0 in the last column
            xr[d - 1] = xr[d - 1] * c[d - 1] + 0.0f * sn[d - 1];
        }
    }
}

// dst = rotation of src by sign*angle for column item i of one head (src, dst: d floats each,
// distinct buffers); item half (odd d) copies the last element. With half == 0 everything is a copy.
__device__ inline void rotateItem(const float* src, float* dst, int i, int half, int d, float c,
                                  float sn) {
    if (i < half) {
        const float a = src[i], bb = src[half + i];
        dst[i] = a * c - bb * sn;
        dst[half + i] = bb * c + a * sn;
    } else {
        dst[d - 1] = src[d - 1];
    }
}

// The element(s) of item i of dst (as rotateItem wrote them) as bf16 values.
__device__ inline void roundItem(float* dst, int i, int half, int d) {
    if (i < half) {
        dst[i] = hd::bf16RoundFloat(dst[i]);
        dst[half + i] = hd::bf16RoundFloat(dst[half + i]);
    } else {
        dst[d - 1] = hd::bf16RoundFloat(dst[d - 1]);
    }
}

__device__ inline void copyItem(const float* src, float* dst, int i, int half, int d) {
    if (i < half) {
        dst[i] = src[i];
        dst[half + i] = src[half + i];
    } else {
        dst[d - 1] = src[d - 1];
    }
}

// The QKV layout walk of both directions. Items: (token t, group g, slot u < r+2, column item i):
// slot u < r is query head g*r+u, slot r the group's k, slot r+1 its v (copied, never rotated).
// forward (merge=false): q/k/v <- rope(qkv); backward (merge=true): qkv <- rope^-1(dq/dk), dv.
// rotate=false: plain layout copies (splitQkv, mergeQkv).
__global__ void qkvRotaryKernel(float* __restrict__ qkv, float* __restrict__ q, float* __restrict__ k,
                                float* __restrict__ v, int64_t tokens, int b, int nq, int ng, int d,
                                float theta, int posOffset, bool merge, bool rotate, const float* __restrict__ cosT,
                                const float* __restrict__ sinT, bool roundBf16) {
    const int r = nq / ng;
    const int half = d / 2;
    const int items = half + (d & 1);
    const int64_t perToken = static_cast<int64_t>(ng) * (r + 2) * items;
    const int64_t n = tokens * perToken;
    const int64_t row = static_cast<int64_t>(ng) * (r + 2) * d;  // one token of qkv
    const float sign = merge ? -1.0f : 1.0f;
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t it = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; it < n;
         it += stride) {
        const int64_t t = it / perToken;
        int64_t rest = it % perToken;
        const int i = static_cast<int>(rest % items);
        rest /= items;
        const int u = static_cast<int>(rest % (r + 2));
        const int g = static_cast<int>(rest / (r + 2));
        const int si = static_cast<int>(t / b);
        float* slot = qkv + t * row + (static_cast<int64_t>(g) * (r + 2) + u) * d;
        float* head;
        if (u < r)
            head = q + (t * nq + static_cast<int64_t>(g) * r + u) * d;
        else if (u == r)
            head = k + (t * ng + g) * d;
        else
            head = v + (t * ng + g) * d;
        const float* src = merge ? head : slot;
        float* dst = merge ? slot : head;
        if (u == r + 1 || !rotate) {
            copyItem(src, dst, i, half, d);
            continue;
        }
        float c = 1.0f, sn = 0.0f;
        if (i < half) {
            ropePair(cosT, sinT, si, i, d, theta, posOffset, &c, &sn);
            sn *= sign;
        }
        rotateItem(src, dst, i, half, d, c, sn);
        if (roundBf16) roundItem(dst, i, half, d);  // (forward only: q and k)
    }
}

// The tables of (this GPU, s, d, theta, posOffset), made the first time on a stream of their own
// and waited for there (not on the caller's stream, whose queued work the host would wait for
// too), so that every stream may read them afterwards; kept for the process. No lock is held while
// they are made, so ranks sharing the GPU never wait for each other here. Null tables (the kernels
// then compute the angles) past kMaxRopeTables, or where the allocation fails.
constexpr size_t kMaxRopeTables = 64;
struct RopeTables {
    const float* cosT = nullptr;
    const float* sinT = nullptr;
};
Status ropeTables(int s, int d, float theta, int posOffset, RopeTables* out) {
    *out = {};
    const int half = d / 2;
    if (s <= 0 || half <= 0) return Status::ok();
    int device = 0;
    TS_RETURN_IF_ERROR(detail::fromCuda(cudaGetDevice(&device), "cudaGetDevice"));
    uint32_t thetaBits = 0;
    std::memcpy(&thetaBits, &theta, sizeof thetaBits);
    using Key = std::tuple<int, int, int, uint32_t, int>;
    static std::mutex mu;
    static std::map<Key, float*> tables;  // cos [s*half], then sin [s*half]
    const Key key{device, s, d, thetaBits, posOffset};
    const int64_t n = static_cast<int64_t>(s) * half;
    auto use = [&](float* p) {
        out->cosT = p;
        out->sinT = p + n;
    };
    {
        std::lock_guard<std::mutex> lock(mu);
        if (auto found = tables.find(key); found != tables.end()) {
            use(found->second);
            return Status::ok();
        }
        if (tables.size() >= kMaxRopeTables) return Status::ok();
    }
    float* p = nullptr;
    if (cudaMalloc(&p, sizeof(float) * 2 * static_cast<size_t>(n)) != cudaSuccess) {
        (void)cudaGetLastError();  // compute the angles instead
        return Status::ok();
    }
    // Made on a stream of their own and waited for there: they are published to every stream and
    // thread, and waiting on the caller's stream would also wait for all the work queued on it.
    cudaStream_t own = nullptr;
    Status made = detail::fromCuda(cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking), "rope tables (stream)");
    if (made.isOk()) {
        rotaryPairTablesKernel<<<detail::blocksFor(n, kThreads), kThreads, 0, own>>>(p, p + n, s, d, theta,
                                                                                     posOffset);
        (void)(made = detail::launchStatus("rope tables"));  // (nvcc warns on a bare assignment of a nodiscard type)
        if (made.isOk()) (void)(made = detail::fromCuda(cudaStreamSynchronize(own), "rope tables (wait)"));
        (void)cudaStreamDestroy(own);
    }
    if (!made.isOk()) {
        (void)cudaFree(p);
        return made;
    }
    std::lock_guard<std::mutex> lock(mu);
    auto [at, inserted] = tables.emplace(key, p);
    if (!inserted) (void)cudaFree(p);  // another thread made the same tables meanwhile (ours are done)
    use(at->second);
    return Status::ok();
}

Status checkShape(const char* what, int s, int b, int n, int d) {
    if (s < 0 || b < 0 || n < 0 || d < 0)
        return Status::invalid(std::string(what) + ": negative dimension");
    return Status::ok();
}

Status ropeInPlace(const char* what, float* x, int s, int b, int n, int d, float theta,
                   int posOffset, float sign, void* stream) {
    TS_RETURN_IF_ERROR(checkShape(what, s, b, n, d));
    const int64_t rows = static_cast<int64_t>(s) * b * n;
    if (rows == 0 || d / 2 == 0) return Status::ok();
    const cudaStream_t st = detail::asStream(stream);
    RopeTables tab;
    TS_RETURN_IF_ERROR(ropeTables(s, d, theta, posOffset, &tab));
    rotaryInPlaceKernel<<<detail::blocksFor(rows * (d / 2), kThreads), kThreads, 0, st>>>(
        x, rows, b * n, d, theta, posOffset, sign, tab.cosT, tab.sinT);
    return detail::launchStatus(what);
}

Status qkvRope(const char* what, float* qkv, float* q, float* k, float* v, int s, int b, int nq,
               int ng, int d, float theta, int posOffset, bool merge, bool rotate, bool roundBf16, void* stream) {
    TS_RETURN_IF_ERROR(checkShape(what, s, b, nq, d));
    if (ng <= 0 || nq % ng != 0)
        return Status::invalid(std::string(what) + ": the query heads (" + std::to_string(nq) +
                               ") must be a multiple of the query groups (" + std::to_string(ng) + ")");
    const int64_t tokens = static_cast<int64_t>(s) * b;
    const int items = d / 2 + (d & 1);
    const int64_t n = tokens * ng * (nq / ng + 2) * items;
    if (n == 0) return Status::ok();
    const cudaStream_t st = detail::asStream(stream);
    RopeTables tab;
    if (rotate) TS_RETURN_IF_ERROR(ropeTables(s, d, theta, posOffset, &tab));
    qkvRotaryKernel<<<detail::blocksFor(n, kThreads), kThreads, 0, st>>>(qkv, q, k, v, tokens, b, nq, ng, d, theta,
                                                                        posOffset, merge, rotate, tab.cosT, tab.sinT,
                                                                        roundBf16);
    return detail::launchStatus(what);
}

}  // namespace

Status ropeForward(float* x, int s, int b, int n, int d, float theta, int posOffset,
                   void* stream) {
    TS_RETURN_IF_ERROR(checkShape("ropeForward", s, b, n, d));
    const int64_t rows = static_cast<int64_t>(s) * b * n;
    if (rows == 0 || d / 2 == 0) return Status::ok();
    const cudaStream_t st = detail::asStream(stream);
    const int64_t tab = static_cast<int64_t>(s) * d;
    detail::StreamWorkspace ws(stream);
    TS_RETURN_IF_ERROR(ws.allocate(sizeof(float) * 2 * tab, "ropeForward cos/sin tables"));
    float* cosT = static_cast<float*>(ws.get());
    float* sinT = cosT + tab;
    rotaryTablesKernel<<<detail::blocksFor(tab, kThreads), kThreads, 0, st>>>(cosT, sinT, s, d, theta,
                                                                              posOffset);
    TS_RETURN_IF_ERROR(detail::launchStatus("ropeForward tables launch"));
    const int items = d / 2 + (d & 1);
    rotaryApplyTablesKernel<<<detail::blocksFor(rows * items, kThreads), kThreads, 0, st>>>(
        x, cosT, sinT, rows, b * n, d);
    return detail::launchStatus("ropeForward apply launch");
}

Status ropeForwardFused(float* x, int s, int b, int n, int d, float theta, int posOffset,
                        void* stream) {
    return ropeInPlace("ropeForwardFused", x, s, b, n, d, theta, posOffset, 1.0f, stream);
}

Status ropeBackward(float* dx, int s, int b, int n, int d, float theta, int posOffset,
                    void* stream) {
    return ropeInPlace("ropeBackward", dx, s, b, n, d, theta, posOffset, -1.0f, stream);
}

Status splitQkvRopeForward(const float* qkv, float* q, float* k, float* v, int s, int b, int nq,
                           int ng, int d, float theta, int posOffset, bool roundBf16, void* stream) {
    // merge=false only reads qkv
    return qkvRope("splitQkvRopeForward", const_cast<float*>(qkv), q, k, v, s, b, nq, ng, d, theta,
                   posOffset, false, true, roundBf16, stream);
}

Status splitQkv(const float* qkv, float* q, float* k, float* v, int T, int nq, int ng, int d, void* stream) {
    return qkvRope("splitQkv", const_cast<float*>(qkv), q, k, v, T, 1, nq, ng, d, 0.0f, 0, false, false, false,
                   stream);
}

Status mergeQkv(const float* dq, const float* dk, const float* dv, float* dqkv, int T, int nq, int ng, int d,
                void* stream) {
    return qkvRope("mergeQkv", dqkv, const_cast<float*>(dq), const_cast<float*>(dk), const_cast<float*>(dv), T, 1,
                   nq, ng, d, 0.0f, 0, true, false, false, stream);
}

Status ropeBackwardMergeQkv(const float* dq, const float* dk, const float* dv, float* dqkv,
                            int s, int b, int nq, int ng, int d, float theta, int posOffset,
                            void* stream) {
    // merge=true only reads dq, dk, dv
    return qkvRope("ropeBackwardMergeQkv", dqkv, const_cast<float*>(dq), const_cast<float*>(dk),
                   const_cast<float*>(dv), s, b, nq, ng, d, theta, posOffset, true, true, false, stream);
}

}  // namespace ts::kernels::cuda
