// GEMMs on cuBLAS with fp32 accumulation (full fp32: no TF32, matching the CPU oracle; or, with
// setBf16Gemms, bf16 operands on the tensor cores), and the linear layer built on them. Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T,
// so each call swaps the operands. Handles: one per (thread, device), see blas.cuh.
#include "kernels/common/fp8_codes.h"
#include "kernels/common/row_groups.h"
#include "kernels/cuda/blas.cuh"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/fp8_codes.cuh"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/cuda/workspace.cuh"

#include <atomic>
#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace ts::kernels::cuda {

namespace detail {

Status fromCublas(cublasStatus_t st, const char* what) {
    if (st == CUBLAS_STATUS_SUCCESS) return Status::ok();
    std::string msg = std::string(what) + ": " + cublasGetStatusString(st);
    if (st == CUBLAS_STATUS_ALLOC_FAILED) return {ErrorCode::OutOfMemory, msg};
    if (st == CUBLAS_STATUS_INVALID_VALUE) return Status::invalid(msg);
    if (st == CUBLAS_STATUS_NOT_INITIALIZED) return Status::unsupported(msg);
    return Status::internal(msg);
}

namespace {

// Handles of this thread, by device. Destroyed at thread exit (the rank threads' lifetime).
struct ThreadHandles {
    std::map<int, cublasHandle_t> blas, tensorOp;
    std::map<int, cublasLtHandle_t> lt;
    ~ThreadHandles() {
        for (auto* m : {&blas, &tensorOp})
            for (auto& [dev, h] : *m) { cudaSetDevice(dev); cublasDestroy(h); }
        for (auto& [dev, h] : lt) { cudaSetDevice(dev); cublasLtDestroy(h); }
    }
};
thread_local ThreadHandles t_handles;

Status handleFor(std::map<int, cublasHandle_t>& handles, cublasMath_t math, void* stream, cublasHandle_t* handle) {
    int dev = 0;
    TS_RETURN_IF_ERROR(fromCuda(cudaGetDevice(&dev), "cudaGetDevice"));
    auto it = handles.find(dev);
    if (it == handles.end()) {
        cublasHandle_t h = nullptr;
        TS_RETURN_IF_ERROR(fromCublas(cublasCreate(&h), "cublasCreate"));
        TS_RETURN_IF_ERROR(fromCublas(cublasSetMathMode(h, math), "cublasSetMathMode"));
        it = handles.emplace(dev, h).first;
    }
    TS_RETURN_IF_ERROR(fromCublas(cublasSetStream(it->second, asStream(stream)), "cublasSetStream"));
    *handle = it->second;
    return Status::ok();
}

}  // namespace

// Full fp32 like the CPU oracle: never let cuBLAS pick TF32 tensor-core math.
Status cublasFor(void* stream, cublasHandle_t* handle) {
    return handleFor(t_handles.blas, CUBLAS_PEDANTIC_MATH, stream, handle);
}

Status cublasTensorOpFor(void* stream, cublasHandle_t* handle) {
    return handleFor(t_handles.tensorOp, CUBLAS_DEFAULT_MATH, stream, handle);
}

Status cublasLtFor(cublasLtHandle_t* handle) {
    int dev = 0;
    TS_RETURN_IF_ERROR(fromCuda(cudaGetDevice(&dev), "cudaGetDevice"));
    auto it = t_handles.lt.find(dev);
    if (it == t_handles.lt.end()) {
        cublasLtHandle_t h = nullptr;
        TS_RETURN_IF_ERROR(fromCublas(cublasLtCreate(&h), "cublasLtCreate"));
        it = t_handles.lt.emplace(dev, h).first;
    }
    *handle = it->second;
    return Status::ok();
}

}  // namespace detail

namespace {

thread_local bool t_bf16Gemms = false;

// The bound twins by base address: [base, base + n) -> twin; the last bound of a base wins (a
// stack per base, so unbinding an inner twin leaves an outer one of the same base bound). One map
// for the process, read when a GEMM is enqueued, not in stream order: this holds because each
// device's ops are issued by one host thread, which binds, enqueues and unbinds in order, and
// different devices' buffers have different addresses.
struct Twin {
    int64_t n = 0;
    const uint16_t* bits = nullptr;
};
std::mutex g_twinMutex;
std::map<const float*, std::vector<Twin>>& twins() {
    static std::map<const float*, std::vector<Twin>> m;
    return m;
}

using fp8codes::hasCodes;

// The operand's first n floats as bf16: where it is bound as FP8 codes (kernels/common/
// fp8_codes.h) its codes bf16(x * scale) in a copy; else the bound twin's bits where one covers
// them (`use` set, `owned` null), else a bf16 copy. Copies come from the stream-ordered allocator
// (`use` == `owned`, freed with cudaFreeAsync by the caller).
Status bf16Operand(const float* x, int64_t n, const fp8codes::Binding& codes, const void** use, void** owned,
                   cudaStream_t s) {
    *owned = nullptr;
    if (!hasCodes(codes)) {
        if (const uint16_t* bits = boundBf16Twin(x, n)) {
            *use = bits;
            return Status::ok();
        }
    }
    TS_RETURN_IF_ERROR(detail::fromCuda(cudaMallocAsync(owned, sizeof(uint16_t) * static_cast<size_t>(n > 0 ? n : 1), s),
                                        "bf16 GEMM operand (cudaMallocAsync)"));
    *use = *owned;
    return hasCodes(codes) ? fp8CodesToBf16(x, static_cast<uint16_t*>(*owned), n, codes, s)
                           : floatToBf16(x, static_cast<uint16_t*>(*owned), n, s);
}

// The scalars of a GEMM whose operands' scales live on the device (tensorwise and delayed scaling's,
// fp8codes::kOnDevice), written where they are read: [alpha * invA * invB, beta, invA, invB],
// inv = fl(1 / scale) as the quantization computed it (1 for an operand without codes), alpha's
// products in the host path's order.
__global__ void castFp8ScaleInversesKernel(fp8codes::Binding a, fp8codes::Binding b, float alpha, float beta,
                                           float* __restrict__ out) {
    const float invA = hasCodes(a) ? __fdiv_rn(1.0f, detail::codesScale(a)) : 1.0f;
    const float invB = hasCodes(b) ? __fdiv_rn(1.0f, detail::codesScale(b)) : 1.0f;
    out[0] = __fmul_rn(__fmul_rn(alpha, invA), invB);
    out[1] = beta;
    out[2] = invA;
    out[3] = invB;
}

// fast16bfGemms (TS_CUDA_GEMM_FAST_16BF=1, ops_cuda.h): a bf16 GEMM with an operand that has no bound twin runs
// on both fp32 operands with CUBLAS_COMPUTE_32F_FAST_16BF (cuBLAS rounds them to bf16 itself, no
// copy made here) instead of converting that operand first. The same products where the operands
// hold bf16 values (what the engine's bf16 mode stores); for others (an fp32 master weight whose
// twin is its bf16 model copy) only if cuBLAS rounds to nearest even, which it does not document.
// An experiment for the next GPU session (docs/cuda_port.md): off by default.
detail::EnvSwitch g_fast16bf("TS_CUDA_GEMM_FAST_16BF");

// --- FP8 GEMMs on FP8 codes (setFp8Gemms) ---------------------------------------------------

detail::EnvSwitch g_fp8Gemms("TS_CUDA_FP8_GEMMS");
std::atomic<int64_t> g_fp8GemmCount{0};

// Whether the current device has FP8 tensor cores (sm_89 Ada, sm_90 Hopper and later), by device.
bool fp8TensorCores() {
    thread_local std::map<int, bool> known;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    auto it = known.find(dev);
    if (it == known.end()) {
        int major = 0, minor = 0;
        const bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess;
        if (!ok) (void)cudaGetLastError();
        it = known.emplace(dev, ok && (major > 8 || (major == 8 && minor >= 9))).first;
    }
    return it->second;
}

// cuBLASLt descriptors, destroyed with their scope.
struct LtDesc {
    cublasLtMatmulDesc_t d = nullptr;
    ~LtDesc() {
        if (d) cublasLtMatmulDescDestroy(d);
    }
};
struct LtLayout {
    cublasLtMatrixLayout_t l = nullptr;
    ~LtLayout() {
        if (l) cublasLtMatrixLayoutDestroy(l);
    }
};
struct LtPref {
    cublasLtMatmulPreference_t p = nullptr;
    ~LtPref() {
        if (p) cublasLtMatmulPreferenceDestroy(p);
    }
};

constexpr size_t kLtWorkspace = size_t(32) << 20;  // what cuBLAS asks for on Hopper

int alignmentOf(const void* p) {
    const auto a = reinterpret_cast<uintptr_t>(p);
    int bytes = 256;
    while (bytes > 1 && a % uintptr_t(bytes) != 0) bytes /= 2;
    return bytes;
}

// The algorithm cuBLASLt's heuristic picks for a shape, by (device, shape, types, beta, C's
// alignment, scale pointers) on this thread; `none` where it has none (the GEMM then runs on bf16).
struct Fp8Algo {
    bool none = false;
    cublasLtMatmulAlgo_t algo{};
    size_t workspace = 0;  // what the algorithm needs, at most kLtWorkspace
};
using Fp8AlgoKey = std::tuple<int, int, int, int, int, int, int, bool, int, bool>;

// C [M, N] = alpha op(A) op(B) + beta C with A and B bound as FP8 codes (bA, bB); alpha already
// carries both scales' inverses, or with scaleInv (device floats [invA, invB], where a scale is
// on the device) cuBLASLt multiplies by them (its A and B scale pointers). *ran false (and OK)
// where the GEMM is not for the FP8 tensor cores: the caller runs it on bf16.
Status gemmFp8(bool transA, bool transB, int M, int N, int K, float alpha, const float* A, int lda,
               fp8codes::Binding bA, const float* B, int ldb, fp8codes::Binding bB, float beta, float* C, int ldc,
               const float* scaleInv, cudaStream_t s, bool* ran) {
    *ran = false;
    constexpr int kMaxCastRows = 65535 * 32;  // fp8CodesToFp8's grid: 65535 tiles of 32 rows
    if (M % 16 != 0 || N % 16 != 0 || K % 16 != 0 || (bA.format == 1 && bB.format == 1) || !fp8TensorCores() ||
        M > kMaxCastRows || N > kMaxCastRows || K > kMaxCastRows)
        return Status::ok();
    const auto typeOf = [](int format) { return format == 0 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2; };
    // Column-major, as cuBLAS sees row-major C: C^T [N, M] = op(B)^T op(A)^T, with cuBLASLt's A
    // the codes of op(B)^T, [N, K] K-major (col-major [K, N], transposed), and its B those of
    // op(A), [M, K] K-major (col-major [K, M]): the "TN" layout FP8 needs.
    const cudaDataType_t ltA = typeOf(bB.format), ltB = typeOf(bA.format);
    int dev = 0;
    TS_RETURN_IF_ERROR(detail::fromCuda(cudaGetDevice(&dev), "cudaGetDevice"));
    cublasLtHandle_t lt = nullptr;
    TS_RETURN_IF_ERROR(detail::cublasLtFor(&lt));
    LtDesc desc;
    LtLayout la, lb, lc;
    TS_RETURN_IF_ERROR(detail::fromCublas(cublasLtMatmulDescCreate(&desc.d, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                                          "FP8 gemm cublasLtMatmulDescCreate"));
    const cublasOperation_t opT = CUBLAS_OP_T, opN = CUBLAS_OP_N;
    TS_RETURN_IF_ERROR(detail::fromCublas(
        cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_TRANSA, &opT, sizeof opT), "FP8 gemm TRANSA"));
    TS_RETURN_IF_ERROR(detail::fromCublas(
        cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_TRANSB, &opN, sizeof opN), "FP8 gemm TRANSB"));
    if (scaleInv) {  // cuBLASLt's A is op(B)^T: invB; its B is op(A): invA
        const float* ltScaleA = scaleInv + 1;
        const float* ltScaleB = scaleInv;
        TS_RETURN_IF_ERROR(detail::fromCublas(cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                                             &ltScaleA, sizeof ltScaleA),
                                              "FP8 gemm A scale pointer"));
        TS_RETURN_IF_ERROR(detail::fromCublas(cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                                             &ltScaleB, sizeof ltScaleB),
                                              "FP8 gemm B scale pointer"));
    }
    TS_RETURN_IF_ERROR(detail::fromCublas(cublasLtMatrixLayoutCreate(&la.l, ltA, K, N, K), "FP8 gemm layout A"));
    TS_RETURN_IF_ERROR(detail::fromCublas(cublasLtMatrixLayoutCreate(&lb.l, ltB, K, M, K), "FP8 gemm layout B"));
    TS_RETURN_IF_ERROR(
        detail::fromCublas(cublasLtMatrixLayoutCreate(&lc.l, CUDA_R_32F, N, M, ldc), "FP8 gemm layout C"));
    const int alignC = alignmentOf(C);
    thread_local std::map<Fp8AlgoKey, Fp8Algo> algos;
    const Fp8AlgoKey key{dev, M, N, K, ldc, int(ltA), int(ltB), beta != 0.0f, alignC, scaleInv != nullptr};
    auto it = algos.find(key);
    if (it == algos.end()) {
        LtPref pref;
        TS_RETURN_IF_ERROR(
            detail::fromCublas(cublasLtMatmulPreferenceCreate(&pref.p), "FP8 gemm cublasLtMatmulPreferenceCreate"));
        const uint64_t ws = kLtWorkspace;
        const uint32_t alignBytes = uint32_t(alignC);
        TS_RETURN_IF_ERROR(detail::fromCublas(
            cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
            "FP8 gemm workspace preference"));
        for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
            TS_RETURN_IF_ERROR(detail::fromCublas(
                cublasLtMatmulPreferenceSetAttribute(pref.p, attr, &alignBytes, sizeof alignBytes),
                "FP8 gemm alignment preference"));
        cublasLtMatmulHeuristicResult_t result{};
        int found = 0;
        const cublasStatus_t st =
            cublasLtMatmulAlgoGetHeuristic(lt, desc.d, la.l, lb.l, lc.l, lc.l, pref.p, 1, &result, &found);
        Fp8Algo a;
        a.none = st != CUBLAS_STATUS_SUCCESS || found == 0;
        if (!a.none) {
            a.algo = result.algo;
            a.workspace = result.workspaceSize;
        }
        it = algos.emplace(key, a).first;
    }
    if (it->second.none) return Status::ok();
    // The codes, K-major: op(A) [M, K] (A is stored [K, M] when transposed) and op(B)^T [N, K]
    // (B is stored [K, N] unless transposed).
    detail::StreamWorkspace codesA(s), codesB(s), ws(s);
    TS_RETURN_IF_ERROR(codesA.allocate(size_t(M) * size_t(K), "FP8 gemm operand A (cudaMallocAsync)"));
    TS_RETURN_IF_ERROR(codesB.allocate(size_t(N) * size_t(K), "FP8 gemm operand B (cudaMallocAsync)"));
    const size_t wsBytes = it->second.workspace;
    if (wsBytes > 0) TS_RETURN_IF_ERROR(ws.allocate(wsBytes, "FP8 gemm workspace (cudaMallocAsync)"));
    uint8_t* a8 = static_cast<uint8_t*>(codesA.get());
    uint8_t* b8 = static_cast<uint8_t*>(codesB.get());
    TS_RETURN_IF_ERROR(fp8CodesToFp8(A, transA ? K : M, transA ? M : K, lda, transA, bA, a8, s));
    TS_RETURN_IF_ERROR(fp8CodesToFp8(B, transB ? N : K, transB ? K : N, ldb, !transB, bB, b8, s));
    const cublasStatus_t st = cublasLtMatmul(lt, desc.d, &alpha, b8, la.l, a8, lb.l, &beta, C, lc.l, C, lc.l,
                                             &it->second.algo, ws.get(), wsBytes, s);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED) {  // the shape's algorithm after all: bf16 from now on
        it->second.none = true;
        return Status::ok();
    }
    TS_RETURN_IF_ERROR(detail::fromCublas(st, "FP8 gemm cublasLtMatmul"));
    g_fp8GemmCount.fetch_add(1, std::memory_order_relaxed);
    *ran = true;
    return Status::ok();
}

// C = alpha op(A) op(B) + beta C over `batch` strided matrices with bf16 copies of A and B.
Status gemmBf16(bool transA, bool transB, int M, int N, int K, float alpha, const float* A, int lda,
                int64_t strideA, const float* B, int ldb, int64_t strideB, float beta, float* C, int ldc,
                int64_t strideC, int batch, void* stream) {
    cudaStream_t s = detail::asStream(stream);
    cublasHandle_t h = nullptr;
    TS_RETURN_IF_ERROR(detail::cublasTensorOpFor(stream, &h));
    // the operands' extents: every matrix of the batch, each [rows, ld]
    const int rowsA = transA ? K : M, colsA = transA ? M : K, rowsB = transB ? N : K, colsB = transB ? K : N;
    const int64_t spanA = static_cast<int64_t>(batch - 1) * strideA, spanB = static_cast<int64_t>(batch - 1) * strideB;
    const int64_t nA = spanA + int64_t(rowsA - 1) * lda + colsA, nB = spanB + int64_t(rowsB - 1) * ldb + colsB;
    // Operands that hold FP8 values at a scale (kernels/common/fp8_codes.h): their codes times
    // alpha * fl(1 / scale) each, as Transformer Engine's scale_inv; where a scale gives no exact
    // codes (kFp32Only) or a host scales' alpha is no normal float (extreme scales) the fp32 GEMM
    // on the stored values, the oracle's products. Scales on the device (tensorwise and delayed scaling's)
    // reach the GEMM there: alpha and beta through device pointers, or cuBLASLt's scale pointers.
    const fp8codes::Binding bA = fp8codes::map().lookup(A, nA), bB = fp8codes::map().lookup(B, nB);
    const float sA = bA.scale, sB = bB.scale;
    // (Scales on the device, tensorwise and delayed scaling's, take the tensor cores only with FP8
    // GEMMs on, setFp8Gemms: until a GPU has run that path, the fp32 GEMM on the stored values,
    // which the trainer test verified for tensorwise scaling.)
    const bool onDevice = sA == fp8codes::kOnDevice || sB == fp8codes::kOnDevice;
    const bool fp32Only = sA == fp8codes::kFp32Only || sB == fp8codes::kFp32Only || (onDevice && !fp8Gemms());
    const float alphaStored = alpha;
    if (sA > 0.0f) alpha *= 1.0f / sA;
    if (sB > 0.0f) alpha *= 1.0f / sB;
    if (fp32Only || (!onDevice && (sA > 0.0f || sB > 0.0f) && alphaStored != 0.0f && !std::isnormal(alpha))) {
        cublasHandle_t hp = nullptr;
        TS_RETURN_IF_ERROR(detail::cublasFor(stream, &hp));
        return detail::fromCublas(
            cublasSgemmStridedBatched(hp, transB ? CUBLAS_OP_T : CUBLAS_OP_N, transA ? CUBLAS_OP_T : CUBLAS_OP_N, N, M,
                                      K, &alphaStored, B, ldb, strideB, A, lda, strideA, &beta, C, ldc, strideC, batch),
            "FP8 operands' gemm (fp32, extreme scales) cublasSgemmStridedBatched");
    }
    // onDevice: [alpha * invA * invB, beta, invA, invB] where the scales are. (No fp32 fallback
    // where that alpha leaves the normal floats, as the host scales have: the host cannot see it.
    // It takes amax_a * amax_b below about 2e-33, docs/cuda_port.md.)
    detail::StreamWorkspace scalars(stream);
    const float* dev = nullptr;
    if (onDevice) {
        TS_RETURN_IF_ERROR(scalars.allocate(4 * sizeof(float), "FP8 GEMM scalars (cudaMallocAsync)"));
        float* out = static_cast<float*>(scalars.get());
        castFp8ScaleInversesKernel<<<1, 1, 0, s>>>(bA, bB, alphaStored, beta, out);
        TS_RETURN_IF_ERROR(detail::launchStatus("FP8 GEMM scalars launch"));
        dev = out;
    }
    if (hasCodes(bA) && hasCodes(bB) && batch == 1 && fp8Gemms()) {
        bool ran = false;
        TS_RETURN_IF_ERROR(gemmFp8(transA, transB, M, N, K, onDevice ? alphaStored : alpha, A, lda, bA, B, ldb, bB,
                                   beta, C, ldc, onDevice ? dev + 2 : nullptr, s, &ran));
        if (ran) return Status::ok();
    }
    if (fast16bfGemms() && sA == 0.0f && sB == 0.0f && (!boundBf16Twin(A, nA) || !boundBf16Twin(B, nB)))
        return detail::fromCublas(
            cublasGemmStridedBatchedEx(h, transB ? CUBLAS_OP_T : CUBLAS_OP_N, transA ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K,
                                       &alpha, B, CUDA_R_32F, ldb, strideB, A, CUDA_R_32F, lda, strideA, &beta, C,
                                       CUDA_R_32F, ldc, strideC, batch, CUBLAS_COMPUTE_32F_FAST_16BF, CUBLAS_GEMM_DEFAULT),
            "bf16 gemm (fp32 operands, FAST_16BF) cublasGemmStridedBatchedEx");
    void *a = nullptr, *b = nullptr;  // the copies made here (null where a twin was read)
    const void *useA = nullptr, *useB = nullptr;
    auto run = [&]() -> Status {
        TS_RETURN_IF_ERROR(bf16Operand(A, nA, bA, &useA, &a, s));
        TS_RETURN_IF_ERROR(bf16Operand(B, nB, bB, &useB, &b, s));
        // alpha and beta from the device while the call reads them (the handle's mode is put back)
        if (onDevice)
            TS_RETURN_IF_ERROR(detail::fromCublas(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_DEVICE),
                                                  "bf16 gemm cublasSetPointerMode"));
        const cublasStatus_t st = cublasGemmStridedBatchedEx(
            h, transB ? CUBLAS_OP_T : CUBLAS_OP_N, transA ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, onDevice ? dev : &alpha,
            useB, CUDA_R_16BF, ldb, strideB, useA, CUDA_R_16BF, lda, strideA, onDevice ? dev + 1 : &beta, C, CUDA_R_32F,
            ldc, strideC, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (onDevice) (void)cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST);
        return detail::fromCublas(st, "bf16 gemm cublasGemmStridedBatchedEx");
    };
    const Status st = run();
    const Status freedA = a ? detail::fromCuda(cudaFreeAsync(a, s), "bf16 GEMM operand (cudaFreeAsync)") : Status::ok();
    const Status freedB = b ? detail::fromCuda(cudaFreeAsync(b, s), "bf16 GEMM operand (cudaFreeAsync)") : Status::ok();
    return !st.isOk() ? st : !freedA.isOk() ? freedA : freedB;
}

__global__ void broadcastBiasKernel(const float* __restrict__ b, float* __restrict__ y, int64_t n,
                                    int out) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
        y[i] = b[i % out];
}

// db[c] += sum_t dy[t, c]: one thread per column, rows walked in order (deterministic).
__global__ void columnSumReduceKernel(const float* __restrict__ dy, float* __restrict__ db, int T, int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float s = 0.0f;
    for (int t = 0; t < T; ++t) s += dy[static_cast<int64_t>(t) * C + c];
    db[c] += s;
}

}  // namespace

void setBf16Gemms(bool on) { t_bf16Gemms = on; }
bool bf16Gemms() { return t_bf16Gemms; }

void setFp8Gemms(bool on) { g_fp8Gemms.set(on); }
bool fp8Gemms() { return g_fp8Gemms.on(); }
int64_t fp8GemmCount() { return g_fp8GemmCount.load(std::memory_order_relaxed); }

void setFast16bfGemms(bool on) { g_fast16bf.set(on); }
bool fast16bfGemms() { return g_fast16bf.on(); }

void bindBf16Twin(const float* base, const uint16_t* twin, int64_t n) {
    std::lock_guard<std::mutex> lock(g_twinMutex);
    twins()[base].push_back(Twin{n, twin});
}

void unbindBf16Twin(const float* base) {
    std::lock_guard<std::mutex> lock(g_twinMutex);
    auto& m = twins();
    auto it = m.find(base);
    if (it == m.end()) return;
    it->second.pop_back();
    if (it->second.empty()) m.erase(it);
}

const uint16_t* boundBf16Twin(const float* x, int64_t n) {
    std::lock_guard<std::mutex> lock(g_twinMutex);
    auto& m = twins();
    auto it = m.upper_bound(x);  // the first base past x; the one before may cover x
    if (it == m.begin()) return nullptr;
    --it;
    const uintptr_t bytes = reinterpret_cast<uintptr_t>(x) - reinterpret_cast<uintptr_t>(it->first);
    if (bytes % sizeof(float) != 0 || n < 0) return nullptr;
    const int64_t off = static_cast<int64_t>(bytes / sizeof(float));
    const Twin& t = it->second.back();
    if (off + n > t.n) return nullptr;
    return t.bits + off;
}

Status gemm(bool transA, bool transB, int M, int N, int K, float alpha, const float* A, int lda,
            const float* B, int ldb, float beta, float* C, int ldc, void* stream) {
    if (M < 0 || N < 0 || K < 0) return Status::invalid("gemm: negative dimension");
    if (M == 0 || N == 0) return Status::ok();
    if (t_bf16Gemms && K > 0)
        return gemmBf16(transA, transB, M, N, K, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1, stream);
    cublasHandle_t h = nullptr;
    TS_RETURN_IF_ERROR(detail::cublasFor(stream, &h));
    return detail::fromCublas(cublasSgemm(h, transB ? CUBLAS_OP_T : CUBLAS_OP_N,
                                          transA ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, ldb,
                                          A, lda, &beta, C, ldc),
                              "gemm cublasSgemm");
}

Status gemmStridedBatched(bool transA, bool transB, int M, int N, int K, float alpha, const float* A,
                          int lda, int64_t strideA, const float* B, int ldb, int64_t strideB,
                          float beta, float* C, int ldc, int64_t strideC, int batch, void* stream) {
    if (M < 0 || N < 0 || K < 0 || batch < 0) return Status::invalid("gemmStridedBatched: negative dimension");
    if (M == 0 || N == 0 || batch == 0) return Status::ok();
    if (t_bf16Gemms && K > 0)
        return gemmBf16(transA, transB, M, N, K, alpha, A, lda, strideA, B, ldb, strideB, beta, C, ldc, strideC, batch,
                        stream);
    cublasHandle_t h = nullptr;
    TS_RETURN_IF_ERROR(detail::cublasFor(stream, &h));
    return detail::fromCublas(
        cublasSgemmStridedBatched(h, transB ? CUBLAS_OP_T : CUBLAS_OP_N, transA ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  N, M, K, &alpha, B, ldb, strideB, A, lda, strideA, &beta, C, ldc,
                                  strideC, batch),
        "gemmStridedBatched cublasSgemmStridedBatched");
}

Status linearForward(const float* x, const float* W, const float* b, float* y, int T, int in, int out,
                     void* stream) {
    if (T < 0 || in <= 0 || out <= 0) return Status::invalid("linearForward: need T >= 0, in > 0, out > 0");
    if (T == 0) return Status::ok();
    float beta = 0.0f;
    if (b) {
        const int64_t n = static_cast<int64_t>(T) * out;
        constexpr int kThreads = 256;
        broadcastBiasKernel<<<detail::blocksFor(n, kThreads), kThreads, 0, detail::asStream(stream)>>>(b, y, n,
                                                                                                      out);
        TS_RETURN_IF_ERROR(detail::launchStatus("linearForward bias launch"));
        beta = 1.0f;
    }
    // y[T, out] = x[T, in] W[out, in]^T
    return gemm(false, true, T, out, in, 1.0f, x, in, W, in, beta, y, out, stream);
}

Status linearBackward(const float* dy, const float* x, const float* W, float* dx, float* dW, float* db,
                      int T, int in, int out, void* stream) {
    if (T < 0 || in <= 0 || out <= 0) return Status::invalid("linearBackward: need T >= 0, in > 0, out > 0");
    if (T == 0) return Status::ok();
    // bf16 GEMMs: dy in bf16 once for both GEMMs instead of once per GEMM.
    detail::Bf16Twin tdy(stream);
    // (Not where dy holds FP8 values at a scale: each GEMM takes their codes, gemmBf16.)
    if (t_bf16Gemms && dx && dW && fp8codes::map().scaleOf(dy, static_cast<int64_t>(T) * out) == 0.0f)
        tdy.cover(dy, static_cast<int64_t>(T) * out, true);
    if (dx) {
        if (!W) return Status::invalid("linearBackward: dx needs W");
        TS_RETURN_IF_ERROR(gemm(false, false, T, in, out, 1.0f, dy, out, W, in, 0.0f, dx, in, stream));
    }
    if (dW) {
        if (!x) return Status::invalid("linearBackward: dW needs x");
        TS_RETURN_IF_ERROR(gemm(true, false, out, in, T, 1.0f, dy, out, x, in, 1.0f, dW, in, stream));
    }
    if (db) {
        constexpr int kThreads = 256;
        columnSumReduceKernel<<<(out + kThreads - 1) / kThreads, kThreads, 0, detail::asStream(stream)>>>(
            dy, db, T, out);
        TS_RETURN_IF_ERROR(detail::launchStatus("linearBackward bias-grad launch"));
    }
    return Status::ok();
}

namespace {

// A grouped call's row offsets: G >= 0, ascending; *rows = off[G] - off[0].
Status groupedRows(const char* op, const int* off, int G, int in, int out, int64_t* rows) {
    *rows = 0;
    if (G < 0 || in <= 0 || out <= 0 || (G > 0 && !off))
        return Status::invalid(std::string(op) + ": need G >= 0, in > 0, out > 0 and the row offsets");
    for (int g = 0; g < G; ++g)
        if (off[g + 1] < off[g] || off[g] < 0)
            return Status::invalid(std::string(op) + ": row offsets must be ascending from 0 or more (group " +
                                   std::to_string(g) + ")");
    if (G > 0) *rows = int64_t(off[G]) - off[0];
    return Status::ok();
}

// Whether the groups' rows of p (width w) are bound as FP8 values (codes at a scale, or kFp32Only):
// each group's at its own scale (the engine binds every expert's or none, so the first group with
// rows tells), and each GEMM reads its group's codes or runs fp32; a bf16 copy would go unread.
bool groupsBoundAsFp8(const float* p, const int* off, int G, int w) {
    for (int g = 0; g < G; ++g)
        if (off[g + 1] > off[g])
            return fp8codes::map().scaleOf(p + int64_t(off[g]) * w, int64_t(off[g + 1] - off[g]) * w) != 0.0f;
    return false;
}

// Under bf16 GEMMs: the groups' rows of p in bf16 once for every group's GEMM (twin.cover); not
// with fast16bfGemms, whose experiment is GEMMs that convert nothing themselves.
void coverGroups(detail::Bf16Twin& twin, const float* p, const int* off, int G, int w) {
    if (!t_bf16Gemms || fast16bfGemms() || !p || G == 0 || off[G] == off[0] || groupsBoundAsFp8(p, off, G, w))
        return;
    twin.cover(p + int64_t(off[0]) * w, (int64_t(off[G]) - off[0]) * w, true);
}

}  // namespace

Status linearForwardGrouped(const float* x, const float* const* W, const float* const* b, float* y, const int* off,
                            int G, int in, int out, void* stream) {
    int64_t rows = 0;
    TS_RETURN_IF_ERROR(groupedRows("linearForwardGrouped", off, G, in, out, &rows));
    if (rows == 0) return Status::ok();
    if (!W) return Status::invalid("linearForwardGrouped: no weights");
    detail::Bf16Twin tx(stream);
    coverGroups(tx, x, off, G, in);
    return forEachGroupWithRows(off, 0, G, [&](int g, int r0, int n) {
        return linearForward(x + int64_t(r0) * in, W[g], b ? b[g] : nullptr, y + int64_t(r0) * out, n, in, out,
                             stream);
    });
}

Status linearBackwardGrouped(const float* dy, const float* x, const float* const* W, float* dx, float* const* dW,
                             float* const* db, const int* off, int G, int in, int out, void* stream) {
    int64_t rows = 0;
    TS_RETURN_IF_ERROR(groupedRows("linearBackwardGrouped", off, G, in, out, &rows));
    if (rows == 0) return Status::ok();
    if (dx && !W) return Status::invalid("linearBackwardGrouped: dx needs W");
    if (dW && !x) return Status::invalid("linearBackwardGrouped: dW needs x");
    detail::Bf16Twin tdy(stream), tx(stream);
    if (dx || dW) coverGroups(tdy, dy, off, G, out);
    if (dW) coverGroups(tx, x, off, G, in);
    return forEachGroupWithRows(off, 0, G, [&](int g, int r0, int n) {
        return linearBackward(dy + int64_t(r0) * out, x ? x + int64_t(r0) * in : nullptr, W ? W[g] : nullptr,
                              dx ? dx + int64_t(r0) * in : nullptr, dW ? dW[g] : nullptr, db ? db[g] : nullptr, n,
                              in, out, stream);
    });
}

}  // namespace ts::kernels::cuda
