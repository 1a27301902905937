// Backend-independent pieces of the device cut: dtype and backend names, and the CUDA
// factory's stand-in when this build has no CUDA backend.
#include "engine/backend/backend.h"

#include <cstdio>
#include <string>
#include <vector>

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

Result<std::unique_ptr<Backend>> makeSharedCudaBackend(int) { return makeCudaBackend().status(); }

Result<GpuTopology> probeGpuTopology() { return makeCudaBackend().status(); }
#endif

std::string formatGpuTopology(const GpuTopology& t) {
    const int n = t.count();
    std::string out = "       ";
    for (int j = 0; j < n; ++j) {
        char h[16];
        std::snprintf(h, sizeof h, "%-8s", ("GPU" + std::to_string(j)).c_str());
        out += h;
    }
    out += "PCI bus       NUMA\n";
    for (int i = 0; i < n; ++i) {
        char h[16];
        std::snprintf(h, sizeof h, "%-7s", ("GPU" + std::to_string(i)).c_str());
        out += h;
        for (int j = 0; j < n; ++j) {
            char c[16];
            std::snprintf(c, sizeof c, "%-8s", i == j ? "X" : t.links[size_t(i)][size_t(j)].kind());
            out += c;
        }
        const int numa = size_t(i) < t.numaNodes.size() ? t.numaNodes[size_t(i)] : -1;
        out += t.pciBusIds[size_t(i)] + "  " + (numa >= 0 ? std::to_string(numa) : std::string("-")) + "\n";
    }
    out += "NVLink = peer access with native atomics (NVLink/NVSwitch), PCIe = peer access without, "
           "host = no peer access (through host memory)\n";
    return out;
}

std::vector<std::string> tpTopologyWarnings(const GpuTopology& t, const std::vector<std::vector<int>>& tpGroups) {
    std::vector<std::string> out;
    for (const auto& g : tpGroups) {
        std::string worst;
        for (size_t a = 0; a < g.size() && worst.empty(); ++a)
            for (size_t b = 0; b < g.size() && worst.empty(); ++b) {
                const int i = g[a], j = g[b];
                if (i == j || i < 0 || j < 0 || i >= t.count() || j >= t.count()) continue;
                const GpuPeerLink& l = t.links[size_t(i)][size_t(j)];
                if (!l.p2p || !l.nativeAtomics)
                    worst = "GPU" + std::to_string(i) + " and GPU" + std::to_string(j) + " are linked over " + l.kind();
            }
        if (worst.empty()) continue;
        std::string members;
        for (int d : g) members += (members.empty() ? "GPU" : ", GPU") + std::to_string(d);
        out.push_back("tensor-parallel group " + members + " is not inside one NVLink domain (" + worst +
                      "): its all-reduces / all-gathers on every layer will be slow; keep tensor_model_parallel_size "
                      "within GPUs that share NVLink (CUDA_VISIBLE_DEVICES orders them)");
    }
    return out;
}

}  // namespace ts::engine
