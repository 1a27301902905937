// Backend-independent pieces of the device cut: dtype and backend names, and the CUDA
// factory's stand-in when this build has no CUDA backend.
#include "engine/backend/backend.h"

namespace ts::engine {

size_t dtypeSize(DType t) {
    switch (t) {
        case DType::F32: return 4;
        case DType::BF16: return 2;
        case DType::F16: return 2;
        case DType::FP8E4M3: return 1;
        case DType::FP8E5M2: return 1;
        case DType::I32: return 4;
        case DType::I64: return 8;
        case DType::U8: return 1;
    }
    return 1;
}

const char* dtypeName(DType t) {
    switch (t) {
        case DType::F32: return "f32";
        case DType::BF16: return "bf16";
        case DType::F16: return "f16";
        case DType::FP8E4M3: return "fp8e4m3";
        case DType::FP8E5M2: return "fp8e5m2";
        case DType::I32: return "i32";
        case DType::I64: return "i64";
        case DType::U8: return "u8";
    }
    return "unknown";
}

const char* backendName(BackendKind k) {
    switch (k) {
        case BackendKind::Cpu: return "cpu";
        case BackendKind::Cuda: return "cuda";
        case BackendKind::EmulatedDevice: return "emulated";
    }
    return "unknown";
}

namespace {
thread_local Stream* t_currentStream = nullptr;
thread_local Status t_kernelError;
}  // namespace

Stream* currentStream() { return t_currentStream; }
CurrentStreamScope::CurrentStreamScope(Stream* s) : m_prev(t_currentStream) { t_currentStream = s; }
CurrentStreamScope::~CurrentStreamScope() { t_currentStream = m_prev; }

void reportKernelError(const Status& s) {
    if (!s.isOk() && t_kernelError.isOk()) t_kernelError = s;
}

Status takeKernelError() {
    Status s = std::move(t_kernelError);
    t_kernelError = Status::ok();
    return s;
}

#ifndef TS_HAVE_CUDA
Result<std::unique_ptr<Backend>> makeCudaBackend() {
    return Status::unsupported(
        "this trainscope build has no CUDA backend (configure with a CUDA toolkit and "
        "TS_ENABLE_CUDA=ON); use device_backend: cpu");
}
#endif

}  // namespace ts::engine
