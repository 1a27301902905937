// Stream-ordered device memory of one op call (StreamWorkspace) and the bf16 twin of an operand
// made for the bf16 GEMMs of one call (Bf16Twin): attention.cu, attention_cp.cu, rope.cu, gemm.cu.
#pragma once

#include "common/status.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/ops_cuda.h"

#include <cstdint>

namespace ts::kernels::cuda::detail {

// Device memory allocated and freed in stream order (cudaMallocAsync / cudaFreeAsync): the
// workspace of one op call, released on the stream when the call's launches are queued.
class StreamWorkspace {
public:
    explicit StreamWorkspace(void* stream) : m_stream(asStream(stream)) {}
    StreamWorkspace(const StreamWorkspace&) = delete;
    StreamWorkspace& operator=(const StreamWorkspace&) = delete;
    ~StreamWorkspace() {
        if (m_ptr) (void)cudaFreeAsync(m_ptr, m_stream);
    }
    // On failure the runtime's last-error state is cleared, so the next launch check does not
    // report this allocation.
    Status allocate(size_t bytes, const char* what) {
        const cudaError_t err = cudaMallocAsync(&m_ptr, bytes, m_stream);
        if (err != cudaSuccess) {
            m_ptr = nullptr;
            (void)cudaGetLastError();
        }
        return fromCuda(err, what);
    }
    void* get() const { return m_ptr; }

private:
    cudaStream_t m_stream;
    void* m_ptr = nullptr;
};

// A stream-ordered bf16 array bound as the twin of the floats [base, base + n) while it lives
// (ops_cuda.h bindBf16Twin), so that the bf16 GEMMs enqueued meanwhile read it instead of
// converting their operand's whole span per call. cover(..., true) converts base once (a span
// another twin already covers is left to it); with false the caller's row kernels write the bits
// next to the floats they write, before any GEMM reads them, so that span always gets its own
// twin (bound over any outer one: the GEMMs' lookup finds the innermost). Unbound on destruction,
// then freed in stream order (after the GEMMs queued). Where the allocation fails nothing is
// bound and bits() is null: the GEMMs convert per call as before.
class Bf16Twin {
public:
    explicit Bf16Twin(void* stream) : m_ws(stream), m_stream(stream) {}
    Bf16Twin(const Bf16Twin&) = delete;
    Bf16Twin& operator=(const Bf16Twin&) = delete;
    ~Bf16Twin() {
        if (m_base) unbindBf16Twin(m_base);
    }
    void cover(const float* base, int64_t n, bool convert) {
        if (!base || n <= 0) return;
        if (convert && boundBf16Twin(base, n)) return;
        if (!m_ws.allocate(sizeof(uint16_t) * static_cast<size_t>(n), "bf16 twin").isOk()) return;
        uint16_t* b = static_cast<uint16_t*>(m_ws.get());
        if (convert && !floatToBf16(base, b, n, m_stream).isOk()) return;
        bindBf16Twin(base, b, n);
        m_base = base;
    }
    // The bits a row kernel writes (null unless this object bound a twin).
    uint16_t* bits() const { return m_base ? static_cast<uint16_t*>(m_ws.get()) : nullptr; }

private:
    StreamWorkspace m_ws;  // freed after the destructor's unbind
    void* m_stream;
    const float* m_base = nullptr;
};

}  // namespace ts::kernels::cuda::detail
