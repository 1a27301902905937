// Kernel dispatch (kernels.h): each op runs the CUDA kernel of its name on the current stream's
// native handle when there is one; else, on an emulated device's stream (emulated_backend.h),
// the CPU oracle over host-view pointers, queued on that stream at submit (Defer) or run at once
// on its worker (NowHostView); else the CPU oracle now, pointers as given.
#include "engine/backend/kernels.h"
#include "engine/backend/graph.h"
#include "kernels/common/row_groups.h"

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "engine/backend/backend.h"
#include "kernels/common/bf16.h"
#include "kernels/common/fp8_codes.h"

#ifdef TS_HAVE_CUDA
#include <cuda_runtime.h>

#include <map>
#include <utility>

#include "kernels/cuda/ops_cuda.h"
#endif

namespace ts::engine::kern {

namespace {

#ifdef TS_HAVE_CUDA
// The native (CUDA) stream of the op running on this thread, or null (CPU).
void* nativeStream() {
    Stream* s = currentStream();
    return s ? s->native() : nullptr;
}

// Device scratch for the value-returning ops: 16 bytes per (device, native stream) of this
// thread, made on first use on the current device (the stream's: submit made it current). The
// device is part of the key because a destroyed stream's handle can come back for a stream of
// another device; the same handle on the same device may reuse the scratch, as every use ends
// with the stream synchronized. Never freed (16 bytes per stream a thread ran value ops on).
void* scalarScratch(void* stream) {
    thread_local std::map<std::pair<int, void*>, void*> scratch;
    int device = -1;
    if (cudaGetDevice(&device) != cudaSuccess) {
        (void)cudaGetLastError();
        reportKernelError(Status::internal("value-returning kernel: no current CUDA device"));
        return nullptr;
    }
    void*& p = scratch[{device, stream}];
    if (!p) {
        const Status s = kernels::cuda::deviceAlloc(&p, 16);
        if (!s.isOk()) {
            reportKernelError(s);
            p = nullptr;
        }
    }
    return p;
}

// Copies the device scalar back once the stream has produced it. `launch` is the kernel's
// launch status: after a failed launch the scratch still holds an earlier op's value, so nothing
// is read back (the caller returns its failure value) and the error goes to the stream.
template <typename T>
bool readScalar(const Status& launch, void* stream, void* dev, T* out) {
    if (!launch.isOk()) {
        reportKernelError(launch);
        return false;
    }
    Status s = kernels::cuda::copyAsync(out, dev, sizeof(T), stream);
    if (s.isOk()) s = kernels::cuda::streamSynchronize(stream);
    reportKernelError(s);
    return s.isOk();
}

// A value op on CUDA: `launch(dev)` starts the kernel that writes one T into this stream's
// scratch `dev`; the value read back, or T{} when there is no scratch (nothing is launched) or
// the launch or the read-back failed (the error goes to the stream).
template <typename T, typename Launch>
T runCudaValue(void* stream, Launch launch) {
    T* dev = static_cast<T*>(scalarScratch(stream));
    if (!dev) return T{};
    T value{};
    return readScalar(launch(dev), stream, dev, &value) ? value : T{};
}

#define TS_KERN_CUDA(name, ...)                                            \
    if (void* ts_stream_ = nativeStream()) {                               \
        reportKernelError(kernels::cuda::name(__VA_ARGS__, ts_stream_));   \
        return;                                                            \
    }

// `type` is what the op returns, `devType` what its kernel writes (allFinite: an int flag).
#define TS_KERN_CUDA_VALUE(type, devType, name, ...)                                         \
    if (void* ts_stream_ = nativeStream()) {                                                 \
        return static_cast<type>(runCudaValue<devType>(ts_stream_, [&](devType* ts_dev_) {  \
            return kernels::cuda::name(__VA_ARGS__, ts_dev_, ts_stream_);                    \
        }));                                                                                 \
    }
#else
#define TS_KERN_CUDA(name, ...)
#define TS_KERN_CUDA_VALUE(type, devType, name, ...)
#endif

// ----- host execution (CPU backend, emulated device) ------------------------------------------

// An argument as a kernel on the host reads it: pointers through hostAlias (the host view of
// emulated device memory; identity elsewhere), the step key a dropout seed points to (itself, or
// as an attention dims' dropoutSeed) likewise, everything else unchanged.
template <typename T>
T toHost(T v) {
    if constexpr (std::is_pointer_v<T>) {
        return v ? static_cast<T>(hostAlias(v)) : v;
    } else if constexpr (std::is_same_v<T, kernels::hd::DropoutSeed>) {
        v.stepKey = toHost(v.stepKey);
        return v;
    } else if constexpr (requires { v.dropoutSeed; }) {
        v.dropoutSeed = toHost(v.dropoutSeed);
        return v;
    } else {
        return v;
    }
}

// The i-th (0-based) name of a comma-separated argument list ("ids, table, out" -> "table").
std::string argName(const char* list, int i) {
    const char* p = list;
    for (int k = 0; k < i && p; ++k) {
        p = std::strchr(p, ',');
        if (p) ++p;
    }
    if (!p) return "?";
    while (*p == ' ') ++p;
    const char* e = std::strchr(p, ',');
    return e ? std::string(p, size_t(e - p)) : std::string(p);
}

template <typename T>
void checkDeviceArg(const char* op, const char* names, int i, T v, std::string* err) {
    if constexpr (std::is_same_v<T, kernels::hd::DropoutSeed>) {
        checkDeviceArg(op, names, i, v.stepKey, err);
    } else if constexpr (requires { v.dropoutSeed; }) {
        checkDeviceArg(op, names, i, v.dropoutSeed, err);
    } else if constexpr (std::is_pointer_v<T>) {
        if (!v || !err->empty() || isEmulatedDevicePointer(v) || isEmulatedHostView(v)) return;
        char addr[32];
        std::snprintf(addr, sizeof addr, "%p", static_cast<const void*>(v));
        *err = std::string("kernel ") + op + ": argument '" + argName(names, i) + "' (" + addr +
               ") is host memory, not a device buffer; a GPU kernel cannot read it. Upload it to a "
               "Buffer first (emulated device, docs/engine.md)";
    }
}

// Ok when every pointer argument is null or emulated device memory.
template <typename... A>
Status checkDeviceArgs(const char* op, const char* names, const A&... args) {
    std::string err;
    int i = 0;
    (checkDeviceArg(op, names, i++, args, &err), ...);
    return err.empty() ? Status::ok() : Status::invalid(err);
}

// Runs f(args...) as the current stream asks (Stream::KernelLaunch).
template <typename F, typename... A>
void runOnHost(const char* op, const char* names, F f, A... args) {
    Stream* s = currentStream();
    switch (s ? s->kernelLaunch() : Stream::KernelLaunch::Now) {
        case Stream::KernelLaunch::Now: f(args...); return;
        case Stream::KernelLaunch::NowHostView: f(toHost(args)...); return;
        case Stream::KernelLaunch::Defer: {
            Status st = checkDeviceArgs(op, names, args...);
            if (!st.isOk()) {
                reportKernelError(st);
                return;
            }
            s->deferKernel([f, a = std::make_tuple(toHost(args)...)]() mutable { std::apply(f, a); });
            return;
        }
    }
}

// The same for an op returning a value: when deferred, the kernel is queued, the stream
// synchronized and the value returned (R{} when the stream failed), as on CUDA.
template <typename R, typename F, typename... A>
R runOnHostValue(const char* op, const char* names, F f, A... args) {
    Stream* s = currentStream();
    switch (s ? s->kernelLaunch() : Stream::KernelLaunch::Now) {
        case Stream::KernelLaunch::Now: return f(args...);
        case Stream::KernelLaunch::NowHostView: return f(toHost(args)...);
        case Stream::KernelLaunch::Defer: break;
    }
    Status st = checkDeviceArgs(op, names, args...);
    if (!st.isOk()) {
        reportKernelError(st);
        return R{};
    }
    auto out = std::make_shared<R>();
    s->deferKernel([f, out, a = std::make_tuple(toHost(args)...)]() mutable { *out = std::apply(f, a); });
    (void)s->synchronize();  // a failure fails the stream; the op's end reports it
    return *out;
}

// Bf16GemmScope's state on this thread (every backend), and whether the host backends check
// it (setCheckBf16Gemms; -1: the environment not read yet).
thread_local bool t_bf16Scope = false;
std::atomic<int> g_checkBf16{-1};
// While checking: how many host GEMMs ran under the scope and outside it (bf16GemmCounts).
std::atomic<int64_t> g_gemmsBf16{0}, g_gemmsFp32{0};

// One operand of a GEMM as its CPU kernel reads it (row-major, kernels/cpu/ops.h): `batch`
// [rows, cols] matrices with row stride ld, `stride` apart.
struct Operand {
    const char* what = nullptr;
    const float* p = nullptr;
    int64_t rows = 0, cols = 0, ld = 0;
    int batch = 1;
    int64_t stride = 0;
    int64_t span() const {
        return p && rows > 0 && cols > 0 ? int64_t(batch - 1) * stride + (rows - 1) * ld + cols : 0;
    }
};
// The operands a GEMM call reads, in the order they are checked (the first that fails fails the
// op), and what each is bound as (kernels/common/fp8_codes.h), looked up when the GEMM is called,
// with the pointers it was given (a deferred kernel sees host aliases).
struct Operands {
    Operand op[3];
    int n = 0;
};
struct OperandBindings {
    kernels::fp8codes::Binding b[3];
};
OperandBindings bindingsOf(const Operands& ops) {
    OperandBindings out;
    for (int i = 0; i < ops.n; ++i) out.b[i] = kernels::fp8codes::map().lookup(ops.op[i].p, ops.op[i].span());
    return out;
}

// Each GEMM kind's operands: A is [M, K], stored [K, M] when transposed, with row stride lda; B
// likewise; linearBackward's GEMMs read dy, W for dx and x for dW.
Operands operandsGemm(bool tA, bool tB, int m, int n, int k, float, const float* a, int la, const float* b, int lb,
                      float, float*, int) {
    return {{{"A", a, tA ? k : m, tA ? m : k, la}, {"B", b, tB ? n : k, tB ? k : n, lb}}, 2};
}
Operands operandsGemmStridedBatched(bool tA, bool tB, int m, int n, int k, float, const float* a, int la, int64_t sa,
                                    const float* b, int lb, int64_t sb, float, float*, int, int64_t, int batch) {
    return {{{"A", a, tA ? k : m, tA ? m : k, la, batch, sa}, {"B", b, tB ? n : k, tB ? k : n, lb, batch, sb}}, 2};
}
Operands operandsLinearForward(const float* x, const float* w, const float*, float*, int t, int in, int out) {
    return {{{"x", x, t, in, in}, {"W", w, out, in, in}}, 2};
}
Operands operandsLinearBackward(const float* dy, const float* x, const float* w, float* dx, float* dw, float*, int t,
                                int in, int out) {
    Operands ops;
    if (!dx && !dw) return ops;
    ops.op[ops.n++] = {"dy", dy, t, out, out};
    if (dx) ops.op[ops.n++] = {"W", w, out, in, in};
    if (dw) ops.op[ops.n++] = {"x", x, t, in, in};
    return ops;
}

// Whether operand o holds only bf16 values, or where it is bound as FP8 codes of a format at a
// scale only values y that give their code back in both of the device's GEMMs: the bf16 GEMM's
// v = bf16(y * scale) and the FP8 GEMM's v = fp8(y * scale), the same v, with fl(v * fl(1 /
// scale)) == y; NaN aside (it stays NaN either way). Else the op fails with the first element
// that is not. Host memory (the kernel's view).
bool checkBf16Operand(const char* op, const Operand& o, kernels::fp8codes::Binding bound) {
    const auto f = static_cast<kernels::cpu::Fp8Format>(bound.format);
    float scale = bound.scale;
    // kOnDevice: the scale tensorwise scaling made from the tensor's amax, or delayed scaling's
    // step scale over its divisor, which the stream order has written by now (the kernel's view).
    float held = 0.0f;
    if (scale == kernels::fp8codes::kOnDevice) {
        held = *static_cast<const float*>(hostAlias(kernels::fp8codes::deviceScaleSource(bound)));
        scale = bound.scaleAt ? held / bound.divisor : kernels::cpu::fp8CurrentScale(held, bound.divisor, f);
        // (no fp32 fallback for a scale whose values give no codes back, unlike a host scale's
        // kFp32Only: the GPU's device-scale path has none either, kernels/cuda/gemm.cu)
    }
    // kFp32Only: a GPU runs this GEMM in fp32 on the stored values, as the oracle.
    if (!o.p || scale < 0.0f) return true;
    const float inv = scale != 0.0f ? 1.0f / scale : 0.0f;
    const char* format = bound.format == 0 ? "E4M3" : "E5M2";
    for (int bi = 0; bi < o.batch; ++bi)
        for (int64_t r = 0; r < o.rows; ++r) {
            const float* row = o.p + bi * o.stride + r * o.ld;
            for (int64_t c = 0; c < o.cols; ++c) {
                const float y = row[c];
                if (y != y) continue;
                if (scale != 0.0f) {
                    const float v = kernels::hd::bf16RoundFloat(y * scale);
                    if (v * inv == y && kernels::cpu::fp8Decode(kernels::cpu::fp8Encode(y * scale, f), f) == v)
                        continue;
                } else {
                    uint32_t bits;
                    std::memcpy(&bits, &y, sizeof bits);
                    if ((bits & 0xFFFFu) == 0) continue;
                }
                char msg[640];
                char from[160] = "";
                if (bound.scale == kernels::fp8codes::kOnDevice)
                    std::snprintf(from, sizeof from,
                                  " (made from its %s %.9g / %g, which may also have been written after the "
                                  "quantization)",
                                  bound.scaleAt ? "delayed scale" : "amax", double(held), double(bound.divisor));
                if (scale != 0.0f)
                    std::snprintf(msg, sizeof msg,
                                  "%s under bf16 GEMMs: operand %s is bound as %s codes at scale %.9g%s but holds "
                                  "%.9g at [%d, %lld, %lld], which is no %s code at that scale (a GPU's GEMM would "
                                  "take bf16(y * scale) or %s(y * scale) for its code): something wrote into the "
                                  "quantized range after its quantization bound it",
                                  op, o.what, format, double(scale), from, double(y), bi, static_cast<long long>(r),
                                  static_cast<long long>(c), format, format);
                else
                    std::snprintf(msg, sizeof msg,
                                  "%s under bf16 GEMMs: operand %s holds %.9g at [%d, %lld, %lld], which bf16 does "
                                  "not represent (a GPU's bf16 GEMM would round it, the CPU oracle does not): round "
                                  "it to bf16 where it is made, or run this GEMM without Bf16GemmScope",
                                  op, o.what, double(y), bi, static_cast<long long>(r), static_cast<long long>(c));
                reportKernelError(Status::internal(msg));
                return false;
            }
        }
    return true;
}
void checkOperands(const char* op, const Operands& ops, const OperandBindings& bound) {
    for (int i = 0; i < ops.n; ++i)
        if (!checkBf16Operand(op, ops.op[i], bound.b[i])) return;
}

#define TS_KERN_DISPATCH(name, ...)                                                          \
    do {                                                                                     \
        TS_KERN_CUDA(name, __VA_ARGS__)                                                      \
        runOnHost(#name, #__VA_ARGS__, [](auto... a) { kernels::cpu::name(a...); },          \
                  __VA_ARGS__);                                                              \
    } while (0)

// The body of a value op: its CUDA kernel through the stream's scratch (runCudaValue) when the
// stream is native, else the CPU oracle as the stream asks (runOnHostValue).
#define TS_KERN_VALUE(type, devType, name, ...)                                              \
    do {                                                                                     \
        TS_KERN_CUDA_VALUE(type, devType, name, __VA_ARGS__)                                 \
        return runOnHostValue<type>(#name, #__VA_ARGS__,                                     \
                                    [](auto... a) { return kernels::cpu::name(a...); },      \
                                    __VA_ARGS__);                                            \
    } while (0)

}  // namespace

bool onDevice() {
    Stream* s = currentStream();
    return s && (s->native() != nullptr || s->kernelLaunch() != Stream::KernelLaunch::Now);
}

bool streamOnDevice(Stream& s) {
    return s.native() != nullptr || s.kernelLaunch() != Stream::KernelLaunch::Now;
}

void setBytes(void* dst, int value, size_t bytes) {
    if (bytes == 0) return;
#ifdef TS_HAVE_CUDA
    if (void* s = nativeStream()) {
        reportKernelError(kernels::cuda::memsetAsync(dst, value, bytes, s));
        return;
    }
#endif
    runOnHost("setBytes", "dst, value, bytes", [](void* d, int v, size_t n) { std::memset(d, v, n); }, dst, value,
              bytes);
}

void copyBytes(void* dst, const void* src, size_t bytes) {
    if (bytes == 0) return;
#ifdef TS_HAVE_CUDA
    if (void* s = nativeStream()) {
        reportKernelError(kernels::cuda::copyAsync(dst, src, bytes, s));
        return;
    }
#endif
    Stream* s = currentStream();
    const auto mode = s ? s->kernelLaunch() : Stream::KernelLaunch::Now;
    if (mode == Stream::KernelLaunch::Now) {
        std::memcpy(dst, src, bytes);
        return;
    }
    if (mode == Stream::KernelLaunch::NowHostView) {
        std::memcpy(hostAlias(dst), hostAlias(src), bytes);
        return;
    }
    // Deferred: a host source is snapshotted now (CUDA stages pageable memory at the call).
    const bool deviceSrc = isEmulatedDevicePointer(src) || isEmulatedHostView(src);
    const bool deviceDst = isEmulatedDevicePointer(dst) || isEmulatedHostView(dst);
    if (!(deviceSrc && deviceDst) && isCapturing(*s)) {  // as CUDA, which does not capture pageable copies
        reportKernelError(Status::unsupported(
            std::string("copyBytes ") + (deviceDst ? "from" : "into") + " host memory while stream '" + s->name() +
            "' is captured into a graph: every launch would copy the captured bytes again (and CUDA does not "
            "capture copies from or into pageable memory); upload before the capture into a buffer the graph reads, "
            "and read results back after the graph has run"));
        return;
    }
    void* d = hostAlias(dst);
    if (deviceSrc) {
        const void* from = hostAlias(src);
        s->deferKernel([d, from, bytes] { std::memcpy(d, from, bytes); });
    } else {
        auto snap = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                        static_cast<const char*>(src) + bytes);
        s->deferKernel([d, snap] { std::memcpy(d, snap->data(), snap->size()); });
    }
}

void copy2D(void* dst, size_t dpitch, const void* src, size_t spitch, size_t widthBytes, size_t height) {
    if (widthBytes == 0 || height == 0) return;
#ifdef TS_HAVE_CUDA
    if (void* s = nativeStream()) {
        reportKernelError(kernels::cuda::copy2DAsync(dst, dpitch, src, spitch, widthBytes, height, s));
        return;
    }
#endif
    runOnHost(
        "copy2D", "dst, dpitch, src, spitch, widthBytes, height",
        [](void* d, size_t dp, const void* s, size_t sp, size_t w, size_t h) {
            for (size_t r = 0; r < h; ++r)
                std::memcpy(static_cast<char*>(d) + r * dp, static_cast<const char*>(s) + r * sp, w);
        },
        dst, dpitch, src, spitch, widthBytes, height);
}

void download(void* dst, const void* src, size_t bytes) {
    copyBytes(dst, src, bytes);
    if (!onDevice()) return;
    Stream* s = currentStream();
    const Status st = s->synchronize();
    if (!st.isOk()) reportKernelError(st);
}

void bindBf16Twin(const float* base, const uint16_t* twin, int64_t n) {
#ifdef TS_HAVE_CUDA
    kernels::cuda::bindBf16Twin(base, twin, n);
#else
    (void)base, (void)twin, (void)n;
#endif
}

void unbindBf16Twin(const float* base) {
#ifdef TS_HAVE_CUDA
    kernels::cuda::unbindBf16Twin(base);
#else
    (void)base;
#endif
}

Bf16GemmScope::Bf16GemmScope(bool on) : m_prev(t_bf16Scope) {
    t_bf16Scope = on;
#ifdef TS_HAVE_CUDA
    m_prevCuda = kernels::cuda::bf16Gemms();
    kernels::cuda::setBf16Gemms(on);
#endif
}

bool Bf16GemmScope::active() { return t_bf16Scope; }

Bf16GemmScope::~Bf16GemmScope() {
    t_bf16Scope = m_prev;
#ifdef TS_HAVE_CUDA
    kernels::cuda::setBf16Gemms(m_prevCuda);
#endif
}

void setCheckBf16Gemms(bool on) { g_checkBf16.store(on ? 1 : 0); }

Bf16GemmCounts bf16GemmCounts() { return {g_gemmsBf16.load(), g_gemmsFp32.load()}; }

bool checkBf16Gemms() {
    int v = g_checkBf16.load();
    if (v < 0) {
        const char* e = std::getenv("TS_CHECK_BF16_GEMMS");
        int fromEnv = e && std::strcmp(e, "1") == 0 ? 1 : 0;
        // a setCheckBf16Gemms meanwhile wins over the environment
        v = g_checkBf16.compare_exchange_strong(v, fromEnv) ? fromEnv : v;
    }
    return v == 1;
}

Status runOp(Stream& s, const char* name, std::function<void()> fn) {
    OpDesc d;
    d.name = name;
    d.category = trace::Category::Memcpy;
    s.submit(d, [fn = std::move(fn)] {
        fn();
        return Status::ok();
    });
    return s.synchronize();
}

Status copyToHost(Stream& s, void* dst, const void* src, size_t bytes, const char* op) {
    return runOp(s, op, [=] { download(dst, src, bytes); });
}

Status copyFromHost(Stream& s, void* dst, const void* src, size_t bytes) {
    // The wait for the stream is runOp's: the host source stays valid until the copy ran.
    return runOp(s, "copy_from_host", [=] { copyBytes(dst, src, bytes); });
}

Result<std::vector<float>> toHost(Stream& s, const float* src, int64_t n, const char* op) {
    std::vector<float> out(static_cast<size_t>(std::max<int64_t>(n, 0)));
    TS_RETURN_IF_ERROR(copyToHost(s, out.data(), src, out.size() * sizeof(float), op));
    return out;
}

int embeddingForward(const int32_t* ids, const float* table, float* out, int T, int C,
                     int vocabStart, int vocabEnd, int vocabSize) {
    TS_KERN_VALUE(int, int, embeddingForward, ids, table, out, T, C, vocabStart, vocabEnd,
                  vocabSize);
}

double sumSquares(const float* x, int64_t n) {
    TS_KERN_VALUE(double, double, sumSquares, x, n);
}

void sumSquaresAccumulate(const float* x, int64_t n, double* acc, float* accAsFloat) {
    TS_KERN_DISPATCH(sumSquaresAccumulate, x, n, acc, accAsFloat);
}

bool allFinite(const float* x, int64_t n) {
    TS_KERN_VALUE(bool, int, allFinite, x, n);
}

int countInvalidIds(const int32_t* ids, int T, int vocabSize) {
    TS_KERN_VALUE(int, int, countInvalidIds, ids, T, vocabSize);
}

float amaxOf(const float* x, int64_t n) {
    TS_KERN_VALUE(float, float, amaxOf, x, n);
}

void amaxInto(const float* x, int64_t n, float* amax) {
#ifdef TS_HAVE_CUDA
    if (void* s = nativeStream()) {
        reportKernelError(kernels::cuda::amaxOf(x, n, amax, s));
        return;
    }
#endif
    runOnHost("amaxInto", "x, n, amax", [](const float* v, int64_t m, float* a) { *a = kernels::cpu::amaxOf(v, m); },
              x, n, amax);
}

void fp8QuantizeCurrent(const float* x, float* y, uint8_t* codes, int64_t n, const float* amax, float divisor,
                        Fp8Format f, float* observed) {
    TS_KERN_DISPATCH(fp8QuantizeCurrent, x, y, codes, n, amax, divisor, f, observed);
}

void amaxAccumulate(const float* x, int64_t n, float divisor, float* slot) {
    TS_KERN_DISPATCH(amaxAccumulate, x, n, divisor, slot);
}

void fp8QuantizeDelayed(const float* x, float* y, uint8_t* codes, int64_t n, const float* scale, float divisor,
                        Fp8Format f) {
    TS_KERN_DISPATCH(fp8QuantizeDelayed, x, y, codes, n, scale, divisor, f);
}

// The GEMMs: on the host, under a checked Bf16GemmScope, `check(op, args...)` looks at the
// operands first (in the kernel, so a deferred one sees the values its stream order gives it);
// the first operand that fails fails the op, and the GEMM still runs, so what reads its output
// reads values.
#define TS_KERN_GEMM(name, operands, ...)                                                           \
    do {                                                                                            \
        TS_KERN_CUDA(name, __VA_ARGS__)                                                             \
        const bool ts_checking_ = checkBf16Gemms();                                                 \
        const bool ts_check_ = t_bf16Scope && ts_checking_;                                         \
        if (ts_checking_) (t_bf16Scope ? g_gemmsBf16 : g_gemmsFp32).fetch_add(1);                   \
        const OperandBindings ts_bound_ = ts_check_ ? bindingsOf(operands(__VA_ARGS__)) : OperandBindings{}; \
        runOnHost(#name, #__VA_ARGS__,                                                              \
                  [ts_check_, ts_bound_](auto... a) {                                               \
                      if (ts_check_) checkOperands(#name, operands(a...), ts_bound_);               \
                      kernels::cpu::name(a...);                                                     \
                  },                                                                                \
                  __VA_ARGS__);                                                                     \
    } while (0)

void gemm(bool transA, bool transB, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc) {
    TS_KERN_GEMM(gemm, operandsGemm, transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemmStridedBatched(bool transA, bool transB, int M, int N, int K, float alpha, const float* A,
                        int lda, int64_t strideA, const float* B, int ldb, int64_t strideB,
                        float beta, float* C, int ldc, int64_t strideC, int batch) {
    TS_KERN_GEMM(gemmStridedBatched, operandsGemmStridedBatched, transA, transB, M, N, K, alpha, A, lda, strideA,
                 B, ldb, strideB, beta, C, ldc, strideC, batch);
}

void linearForward(const float* x, const float* W, const float* b, float* y, int T, int in,
                   int out) {
    TS_KERN_GEMM(linearForward, operandsLinearForward, x, W, b, y, T, in, out);
}

void linearBackward(const float* dy, const float* x, const float* W, float* dx, float* dW,
                    float* db, int T, int in, int out) {
    TS_KERN_GEMM(linearBackward, operandsLinearBackward, dy, x, W, dx, dW, db, T, in, out);
}

void linearForwardGrouped(const float* x, const float* const* W, const float* const* b, float* y, const int* off,
                          int G, int in, int out) {
    TS_KERN_CUDA(linearForwardGrouped, x, W, b, y, off, G, in, out)
    kernels::forEachGroupWithRows(off, 0, G, [&](int g, int r0, int rows) {
        linearForward(x + int64_t(r0) * in, W[g], b ? b[g] : nullptr, y + int64_t(r0) * out, rows, in, out);
    });
}

void linearBackwardGrouped(const float* dy, const float* x, const float* const* W, float* dx, float* const* dW,
                           float* const* db, const int* off, int G, int in, int out) {
    TS_KERN_CUDA(linearBackwardGrouped, dy, x, W, dx, dW, db, off, G, in, out)
    kernels::forEachGroupWithRows(off, 0, G, [&](int g, int r0, int rows) {
        linearBackward(dy + int64_t(r0) * out, x ? x + int64_t(r0) * in : nullptr, W ? W[g] : nullptr,
                       dx ? dx + int64_t(r0) * in : nullptr, dW ? dW[g] : nullptr, db ? db[g] : nullptr, rows, in,
                       out);
    });
}

void embeddingBackward(const int32_t* ids, const float* dout, float* dtable, int T, int C,
                       int vocabStart, int vocabEnd) {
    TS_KERN_DISPATCH(embeddingBackward, ids, dout, dtable, T, C, vocabStart, vocabEnd);
}

void positionEmbeddingForward(const float* table, float* out, int s, int b, int C) {
    TS_KERN_DISPATCH(positionEmbeddingForward, table, out, s, b, C);
}

void positionEmbeddingForwardBf16(const uint16_t* table, float* out, int s, int b, int C) {
    TS_KERN_DISPATCH(positionEmbeddingForwardBf16, table, out, s, b, C);
}

void embeddingLookup(const int32_t* ids, const float* table, float* out, int T, int C, int vocabStart,
                     int vocabEnd, int vocabSize) {
    TS_KERN_DISPATCH(embeddingLookup, ids, table, out, T, C, vocabStart, vocabEnd, vocabSize);
}

void embeddingLookupBf16(const int32_t* ids, const uint16_t* table, float* out, int T, int C, int vocabStart,
                         int vocabEnd, int vocabSize) {
    TS_KERN_DISPATCH(embeddingLookupBf16, ids, table, out, T, C, vocabStart, vocabEnd, vocabSize);
}

void positionEmbeddingBackward(const float* dout, float* dtable, int s, int b, int C) {
    TS_KERN_DISPATCH(positionEmbeddingBackward, dout, dtable, s, b, C);
}

void layerNormForward(const float* x, const float* w, const float* b, float* y, float* mean,
                      float* rstd, int T, int C, float eps, bool roundBf16) {
    TS_KERN_DISPATCH(layerNormForward, x, w, b, y, mean, rstd, T, C, eps, roundBf16);
}

void layerNormBackward(const float* dy, const float* x, const float* w, const float* mean,
                       const float* rstd, float* dx, float* dw, float* db, int T, int C, bool roundBf16) {
    TS_KERN_DISPATCH(layerNormBackward, dy, x, w, mean, rstd, dx, dw, db, T, C, roundBf16);
}

void layerNormForwardFused(const float* x, const float* w, const float* b, float* y, float* mean,
                           float* rstd, int T, int C, float eps, bool roundBf16) {
    TS_KERN_DISPATCH(layerNormForwardFused, x, w, b, y, mean, rstd, T, C, eps, roundBf16);
}

void layerNormBackwardFused(const float* dy, const float* x, const float* w, const float* mean,
                            const float* rstd, float* dx, float* dw, float* db, int T, int C,
                            bool roundBf16) {
    TS_KERN_DISPATCH(layerNormBackwardFused, dy, x, w, mean, rstd, dx, dw, db, T, C, roundBf16);
}

void rmsNormForward(const float* x, const float* w, float* y, float* rstd, int T, int C,
                    float eps, bool roundBf16) {
    TS_KERN_DISPATCH(rmsNormForward, x, w, y, rstd, T, C, eps, roundBf16);
}

void rmsNormBackward(const float* dy, const float* x, const float* w, const float* rstd, float* dx,
                     float* dw, int T, int C, bool roundBf16) {
    TS_KERN_DISPATCH(rmsNormBackward, dy, x, w, rstd, dx, dw, T, C, roundBf16);
}

void ropeForward(float* x, int s, int b, int n, int d, float theta, int posOffset) {
    TS_KERN_DISPATCH(ropeForward, x, s, b, n, d, theta, posOffset);
}

void ropeForwardFused(float* x, int s, int b, int n, int d, float theta, int posOffset) {
    TS_KERN_DISPATCH(ropeForwardFused, x, s, b, n, d, theta, posOffset);
}

void ropeBackward(float* dx, int s, int b, int n, int d, float theta, int posOffset) {
    TS_KERN_DISPATCH(ropeBackward, dx, s, b, n, d, theta, posOffset);
}

void splitQkvRopeForward(const float* qkv, float* q, float* k, float* v, int s, int b, int nq,
                         int ng, int d, float theta, int posOffset, bool roundBf16) {
    TS_KERN_DISPATCH(splitQkvRopeForward, qkv, q, k, v, s, b, nq, ng, d, theta, posOffset, roundBf16);
}

void splitQkv(const float* qkv, float* q, float* k, float* v, int T, int nq, int ng, int d) {
    TS_KERN_DISPATCH(splitQkv, qkv, q, k, v, T, nq, ng, d);
}

void mergeQkv(const float* dq, const float* dk, const float* dv, float* dqkv, int T, int nq, int ng, int d) {
    TS_KERN_DISPATCH(mergeQkv, dq, dk, dv, dqkv, T, nq, ng, d);
}

void ropeBackwardMergeQkv(const float* dq, const float* dk, const float* dv, float* dqkv, int s,
                          int b, int nq, int ng, int d, float theta, int posOffset) {
    TS_KERN_DISPATCH(ropeBackwardMergeQkv, dq, dk, dv, dqkv, s, b, nq, ng, d, theta, posOffset);
}

void attentionForward(const AttnDims& dims, const float* q, const float* k, const float* v,
                      float* probs, float* out, bool fusedSoftmax) {
    TS_KERN_DISPATCH(attentionForward, dims, q, k, v, probs, out, fusedSoftmax);
}

void attentionBackward(const AttnDims& dims, const float* q, const float* k, const float* v,
                       const float* probs, const float* dout, float* dq, float* dk, float* dv,
                       float* scratch, bool fusedSoftmax) {
    TS_KERN_DISPATCH(attentionBackward, dims, q, k, v, probs, dout, dq, dk, dv, scratch,
                     fusedSoftmax);
}

void attentionFlashForward(const AttnDims& dims, const float* q, const float* k, const float* v,
                           float* stats, float* out) {
    TS_KERN_DISPATCH(attentionFlashForward, dims, q, k, v, stats, out);
}

void attentionFlashBackward(const AttnDims& dims, const float* q, const float* k, const float* v,
                            const float* stats, const float* dout, float* dq, float* dk,
                            float* dv, float* scratch) {
    TS_KERN_DISPATCH(attentionFlashBackward, dims, q, k, v, stats, dout, dq, dk, dv, scratch);
}

void cpAttentionForward(const CpAttnDims& dims, const int* qPos, const float* q, const float* k,
                        const float* v, float* probs, float* out) {
    TS_KERN_DISPATCH(cpAttentionForward, dims, qPos, q, k, v, probs, out);
}

void cpAttentionBackward(const CpAttnDims& dims, const int* qPos, const float* q, const float* k,
                         const float* v, const float* probs, const float* dout, float* dq,
                         float* dk, float* dv) {
    TS_KERN_DISPATCH(cpAttentionBackward, dims, qPos, q, k, v, probs, dout, dq, dk, dv);
}

void cpRingAttentionForward(const CpAttnDims& dims, const int* qPos, const int* kPos,
                            const float* q, const float* k, const float* v, float* out, float* lse,
                            bool first) {
    TS_KERN_DISPATCH(cpRingAttentionForward, dims, qPos, kPos, q, k, v, out, lse, first);
}

void cpRingAttentionDelta(const CpAttnDims& dims, const float* out, const float* dout,
                          float* delta) {
    TS_KERN_DISPATCH(cpRingAttentionDelta, dims, out, dout, delta);
}

void cpRingAttentionBackward(const CpAttnDims& dims, const int* qPos, const int* kPos,
                             const float* q, const float* k, const float* v, const float* lse,
                             const float* delta, const float* dout, float* dq, float* dk,
                             float* dv) {
    TS_KERN_DISPATCH(cpRingAttentionBackward, dims, qPos, kPos, q, k, v, lse, delta, dout, dq, dk,
                     dv);
}

void biasGeluForward(const float* x, const float* b, float* y, int T, int C, bool roundBf16) {
    TS_KERN_DISPATCH(biasGeluForward, x, b, y, T, C, roundBf16);
}

void biasGeluForwardUnfused(const float* x, const float* b, float* y, int T, int C) {
    TS_KERN_DISPATCH(biasGeluForwardUnfused, x, b, y, T, C);
}

void biasGeluBackward(const float* dy, const float* x, const float* b, float* dx, float* db, int T,
                      int C) {
    TS_KERN_DISPATCH(biasGeluBackward, dy, x, b, dx, db, T, C);
}

void swigluForward(const float* x, float* y, int T, int F, bool roundBf16) {
    TS_KERN_DISPATCH(swigluForward, x, y, T, F, roundBf16);
}

void swigluBackward(const float* dy, const float* x, float* dx, int T, int F) {
    TS_KERN_DISPATCH(swigluBackward, dy, x, dx, T, F);
}

void dropoutForward(const float* x, float* y, uint8_t* mask, int64_t n, float p, kernels::hd::DropoutSeed seed,
                    uint64_t offset) {
    TS_KERN_DISPATCH(dropoutForward, x, y, mask, n, p, seed, offset);
}

void dropoutBackward(const float* dy, const uint8_t* mask, float* dx, int64_t n, float p) {
    TS_KERN_DISPATCH(dropoutBackward, dy, mask, dx, n, p);
}

void dropoutMask(uint8_t* mask, int64_t n, float p, kernels::hd::DropoutSeed seed, uint64_t offset) {
    TS_KERN_DISPATCH(dropoutMask, mask, n, p, seed, offset);
}

void biasDropoutAddFused(const float* x, const float* b, const float* residual, float* out,
                         uint8_t* mask, int T, int C, float p, kernels::hd::DropoutSeed seed, uint64_t offset, bool roundBf16) {
    TS_KERN_DISPATCH(biasDropoutAddFused, x, b, residual, out, mask, T, C, p, seed, offset, roundBf16);
}

void biasDropoutAddUnfused(const float* x, const float* b, const float* residual, float* out,
                           uint8_t* mask, int T, int C, float p, kernels::hd::DropoutSeed seed, uint64_t offset) {
    TS_KERN_DISPATCH(biasDropoutAddUnfused, x, b, residual, out, mask, T, C, p, seed, offset);
}

void biasDropoutAddBackward(const float* dout, const uint8_t* mask, float* dx, float* db, int T,
                            int C, float p) {
    TS_KERN_DISPATCH(biasDropoutAddBackward, dout, mask, dx, db, T, C, p);
}

void add(const float* a, const float* b, float* y, int64_t n) {
    TS_KERN_DISPATCH(add, a, b, y, n);
}

void addInPlace(float* y, const float* x, int64_t n) {
    TS_KERN_DISPATCH(addInPlace, y, x, n);
}

void scale(float* y, float alpha, int64_t n) {
    TS_KERN_DISPATCH(scale, y, alpha, n);
}

void addBias(float* y, const float* b, int T, int C) {
    TS_KERN_DISPATCH(addBias, y, b, T, C);
}

void biasGradAccumulate(const float* dy, float* db, int T, int C) {
    TS_KERN_DISPATCH(biasGradAccumulate, dy, db, T, C);
}

void crossEntropyRowMax(const float* logits, float* rowMax, int T, int Vl) {
    TS_KERN_DISPATCH(crossEntropyRowMax, logits, rowMax, T, Vl);
}

void crossEntropyStats(const float* logits, const int32_t* targets, const float* rowMax,
                       float* targetLogit, float* sumExp, int T, int Vl, int vStart) {
    TS_KERN_DISPATCH(crossEntropyStats, logits, targets, rowMax, targetLogit, sumExp, T, Vl,
                     vStart);
}

void crossEntropyLoss(const float* targetLogit, const float* sumExp, float* loss, int T) {
    TS_KERN_DISPATCH(crossEntropyLoss, targetLogit, sumExp, loss, T);
}

void crossEntropyBackward(const float* logits, const int32_t* targets, const float* rowMax,
                          const float* sumExp, const float* dloss, float* dlogits, int T, int Vl,
                          int vStart) {
    TS_KERN_DISPATCH(crossEntropyBackward, logits, targets, rowMax, sumExp, dloss, dlogits, T, Vl,
                     vStart);
}

void crossEntropyForwardUnfused(const float* logits, const int32_t* targets, float* probs,
                                float* loss, int T, int V) {
    TS_KERN_DISPATCH(crossEntropyForwardUnfused, logits, targets, probs, loss, T, V);
}

void crossEntropyBackwardUnfused(const float* probs, const int32_t* targets, const float* dloss,
                                 float* dlogits, int T, int V) {
    TS_KERN_DISPATCH(crossEntropyBackwardUnfused, probs, targets, dloss, dlogits, T, V);
}

void crossEntropyFused(float* logitsInGradOut, const int32_t* targets, const float* dloss,
                       float* loss, int T, int V) {
    TS_KERN_DISPATCH(crossEntropyFused, logitsInGradOut, targets, dloss, loss, T, V);
}

void adamwStep(float* param, const float* grad, float* m, float* v, int64_t n,
               const AdamParams& hp, uint16_t* bits) {
    TS_KERN_DISPATCH(adamwStep, param, grad, m, v, n, hp, bits);
}

void floatToBf16(const float* x, uint16_t* y, int64_t n) {
    TS_KERN_DISPATCH(floatToBf16, x, y, n);
}

void bf16ToFloat(const uint16_t* x, float* y, int64_t n) {
    TS_KERN_DISPATCH(bf16ToFloat, x, y, n);
}

void roundToBf16(float* x, int64_t n) {
    TS_KERN_DISPATCH(roundToBf16, x, n);
}

void fp8QuantizeDequantize(const float* x, float* y, uint8_t* codes, int64_t n, float scale,
                           Fp8Format f) {
    // y holds codes at `scale` from here on (until a free or the next binding over it): the bf16
    // GEMMs take them as codes (kernels/common/fp8_codes.h).
    if (y) kernels::fp8codes::map().bind(y, n, scale, int(f));
    TS_KERN_DISPATCH(fp8QuantizeDequantize, x, y, codes, n, scale, f);
}

void fp8BlockQuantizeDequantize(const float* x, float* y, uint8_t* codes, void* scales,
                                int64_t rows, int64_t cols, Fp8BlockKind kind, bool alongRows,
                                Fp8Format f, bool pow2) {
    TS_KERN_DISPATCH(fp8BlockQuantizeDequantize, x, y, codes, scales, rows, cols, kind, alongRows,
                     f, pow2);
}

void gatherRows(const float* src, const int32_t* idx, float* dst, int rows, int cols) {
    TS_KERN_DISPATCH(gatherRows, src, idx, dst, rows, cols);
}

void gatherSumRows(const float* src, const int32_t* start, const int32_t* idx, float* dst, int outRows, int cols) {
    TS_KERN_DISPATCH(gatherSumRows, src, start, idx, dst, outRows, cols);
}

void scaleRows(const float* x, int64_t xRowStride, const float* s, float* y, int rows, int cols) {
    TS_KERN_DISPATCH(scaleRows, x, xRowStride, s, y, rows, cols);
}

void moeProbGrad(const float* da, const float* act, const float* prob, const float* dy, const float* b2, float* dact,
                 float* dprob, int rows, int F, int h) {
    TS_KERN_DISPATCH(moeProbGrad, da, act, prob, dy, b2, dact, dprob, rows, F, h);
}

void weightedColumnSum(const float* dy, const float* w, float* db, int rows, int cols) {
    TS_KERN_DISPATCH(weightedColumnSum, dy, w, db, rows, cols);
}

void sigmoidGateForward(const float* x, const float* w, const float* y, float* gate, float* out, int T, int h,
                        bool bf16Gate) {
    TS_KERN_DISPATCH(sigmoidGateForward, x, w, y, gate, out, T, h, bf16Gate);
}

void sigmoidGateBackward(const float* dout, const float* y, const float* x, const float* gate, const float* w,
                         float* dy, float* dx, float* dw, int T, int h) {
    TS_KERN_DISPATCH(sigmoidGateBackward, dout, y, x, gate, w, dy, dx, dw, T, h);
}

void moeRouterProbsBackward(const float* dprob, const int32_t* rowOf, const int32_t* sel, const float* a,
                            const float* b, const float* c, const float* full, float* dl, int T, int K, int E) {
    TS_KERN_DISPATCH(moeRouterProbsBackward, dprob, rowOf, sel, a, b, c, full, dl, T, K, E);
}

void moeRouterAuxBackward(const float* logits, const float* counts, const float* global, float* dl, int T, int E,
                          int G, int microBatch, kernels::cpu::MoeScore score, double wAux, double wSeq, double wGlobal,
                          double zScale) {
    TS_KERN_DISPATCH(moeRouterAuxBackward, logits, counts, global, dl, T, E, G, microBatch, score, wAux, wSeq, wGlobal,
                     zScale);
}

void moeRouteTopK(const float* logits, const float* bias, const float* sinkhorn, const int32_t* chosen,
                  int32_t* topi, float* probs, int T, int E, const kernels::cpu::MoeTopKSpec& spec) {
    TS_KERN_DISPATCH(moeRouteTopK, logits, bias, sinkhorn, chosen, topi, probs, T, E, spec);
}

void moeSinkhorn(const float* cost, int T, int E, float* out, float tol) {
    TS_KERN_DISPATCH(moeSinkhorn, cost, T, E, out, tol);
}

void moeQbDualUpdate(const float* scores, int m, int n, int k, const float* beta, int32_t* indices, float* quantile) {
    TS_KERN_DISPATCH(moeQbDualUpdate, scores, m, n, k, beta, indices, quantile);
}

void moeRoutePlan(const int32_t* topi, const float* probs, int T, int K, int E,
                  const kernels::cpu::MoeCapacity& capacity, int32_t* offset, int32_t* routed, int32_t* tok,
                  int32_t* start, int32_t* inv, int32_t* tokExp, int32_t* rowOf, float* probT) {
    TS_KERN_DISPATCH(moeRoutePlan, topi, probs, T, K, E, capacity, offset, routed, tok, start, inv, tokExp, rowOf,
                     probT);
}

void moeRouterAuxCounts(const float* logits, int T, int E, int K, int G, int microBatch,
                        kernels::cpu::MoeScore score, float* counts, float* total, float* stats) {
    TS_KERN_DISPATCH(moeRouterAuxCounts, logits, T, E, K, G, microBatch, score, counts, total, stats);
}

void moeRouterProbsCoefficients(const float* logits, const int32_t* topi, int T, int E,
                                const kernels::cpu::MoeTopKSpec& spec, bool sinkhorn, float* a, float* b, float* c,
                                float* full) {
    TS_KERN_DISPATCH(moeRouterProbsCoefficients, logits, topi, T, E, spec, sinkhorn, a, b, c, full);
}

void moeRoutingMap(const int32_t* tokExp, const float* probT, int rows, int64_t TE, float* map) {
    TS_KERN_DISPATCH(moeRoutingMap, tokExp, probT, rows, TE, map);
}

}  // namespace ts::engine::kern
