// ParamBuffer: all parameters of one model chunk in one contiguous fp32 main-param buffer
// and one contiguous fp32 main-grad buffer (Megatron's ParamAndGradBuffer, REFERENCE.md
// §3.1). Parameters are laid out in REVERSE registration order (backprop order), so the
// data-parallel engine can cut the grad buffer into buckets whose first bucket holds the
// last layers. With bf16 a separate model copy, the params' bf16 bits (2 bytes an element, as
// Megatron-LM's bf16 params), is what forward/backward read: GptModel unpacks the part of the
// model it runs into fp32 words (setWorking; on a device the bf16 GEMMs read the bits); the
// optimizer updates the fp32 main params and refreshes the copy. With bf16 and the distributed
// optimizer the fp32 main params exist only for the ranges this rank's optimizer owns
// (ParamPlacement::shardMain, Megatron's "6 + 12/d bytes per parameter", REFERENCE.md §7.1),
// and the param all-gather fills the rest of the model copy.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/backend/backend.h"

namespace ts::engine {

enum class ShardKind : uint8_t {
    Replicated = 0,  // norms (and all params when tp = 1)
    ColumnParallel,  // rows of W[out, in] split by tp
    RowParallel,     // columns of W[out, in] split by tp
    VocabParallel,   // rows of the [V, h] table split by tp
};
const char* shardKindName(ShardKind k);

struct ParamInfo {
    std::string name;                // "layers.0.self_attention.linear_qkv.weight"
    std::vector<int64_t> shape;      // local shard shape
    std::vector<int64_t> fullShape;  // unsharded shape
    ShardKind shard = ShardKind::Replicated;
    bool noWeightDecay = false;      // biases and 1-D params (Megatron's default rule)
    bool sequenceParallel = false;   // norm weights with SP: grads summed over TP
    bool sharedEmbedding = false;    // tied word embedding / output weight
    bool expert = false;             // MoE expert weight: on one EP rank, grads reduced over edp
    int partitionStride = 1;         // 2 for SwiGLU fc1: each shard is [gate_r ; up_r]
    int64_t numel = 0;
    int64_t offset = 0;              // elements from the buffer start (after finalize)
};

struct ElementRange {
    int64_t begin = 0, end = 0;  // elements of a chunk's buffer
};

// Where finalize puts the params: the data-parallel engine's layout (Megatron's padded buckets),
// decided from the registered params before any memory is allocated.
struct ParamPlacement {
    std::vector<int64_t> offsets;  // per param, registration index order
    int64_t numel = 0;             // >= the unpadded size
    // bf16 with the distributed optimizer: only the fp32 main params of the ranges this rank's
    // optimizer owns are kept.
    bool shardMain = false;
    std::vector<ElementRange> mainRanges;
};

class ParamBuffer {
public:
    ParamBuffer() = default;
    ~ParamBuffer();
    ParamBuffer(const ParamBuffer&) = delete;
    ParamBuffer& operator=(const ParamBuffer&) = delete;
    // Registers a parameter; returns its index. Only before finalize().
    int add(ParamInfo info);
    // Lays out (reverse registration order) and allocates: main params (Params), main grads
    // (Grads) and, with bf16, the model copy as bf16 bits (Params). `bf16Gemms`: the GEMMs take
    // bf16 operands (GptModel's constructor: a bf16 model), so a device's GEMMs may read the bits
    // directly. Memory is zeroed.
    // With `placement`, the params go where it says (and with bf16 and shardMain only the kept
    // main params are allocated): no buffer is moved or allocated twice.
    Status finalize(Device& dev, bool bf16, bool bf16Gemms = true, const ParamPlacement* placement = nullptr);

    int count() const { return int(m_params.size()); }
    const ParamInfo& info(int i) const { return m_params[size_t(i)]; }
    const std::vector<ParamInfo>& params() const { return m_params; }
    int find(const std::string& name) const;  // -1 if absent
    int64_t numel() const { return m_numel; }
    bool bf16() const { return m_bf16; }

    // The whole fp32 main-param buffer; null when only a shard is kept (ParamPlacement::shardMain:
    // use mainParamsAt, mainParamsToHost / mainParamsFromHost).
    float* mainParams() { return m_mainSharded ? nullptr : m_main->as<float>(); }
    float* mainGrads() { return m_grad->as<float>(); }
    float* mainParam(int i) { return m_mainSharded ? nullptr : mainParams() + info(i).offset; }
    // The main param of buffer element `begin`, which with a sharded main must lie in a kept
    // range (so does the run [begin, end) the caller reads through it; null otherwise).
    float* mainParamsAt(int64_t begin, int64_t end);
    // bf16 with a placement's shardMain: only the fp32 main params of its ranges exist, in one
    // compact buffer (the distributed optimizer's layout: a rank updates the main params it owns
    // and the param all-gather brings the rest of the model copy).
    bool mainSharded() const { return m_mainSharded; }
    const std::vector<ElementRange>& mainRanges() const { return m_mainRanges; }
    // Host image of the whole main-param buffer: the fp32 main params where this buffer keeps
    // them, elsewhere (a sharded main) the bf16 model copy's values; `kept` (optional) gets 1
    // where the value is a main param. Waits for `stream`.
    Result<std::vector<float>> mainParamsToHost(Stream& stream, std::vector<char>* kept = nullptr);
    // Sets the main params this buffer keeps from a host image of the whole buffer and refreshes
    // the whole model copy from it, on `stream`, waited for.
    Status mainParamsFromHost(Stream& stream, const std::vector<float>& image);
    float* mainGrad(int i) { return mainGrads() + info(i).offset; }
    // The bf16 model copy: the params' bf16 bits, 2 bytes an element (Megatron-LM's bf16
    // params); null in fp32.
    uint16_t* modelBits() { return m_model ? m_model->as<uint16_t>() : nullptr; }
    const uint16_t* modelBits() const { return m_model ? m_model->as<uint16_t>() : nullptr; }
    // What forward/backward read as fp32 words: in fp32 the main params; with bf16 the working
    // copy GptModel unpacked from the model bits for the part of the model it runs
    // (setWorking). Reading a bf16 param outside that part is a bug and aborts, naming it.
    float* modelParam(int i) {
        if (!m_model) return mainParams() + info(i).offset;
        float* p = m_working[size_t(i)];
        if (!p) workingMissing(i);
        return p;
    }
    // bf16: where modelParam(i) points until clearWorking.
    void setWorking(int i, float* p) { m_working[size_t(i)] = p; }
    void clearWorking() { m_working.assign(m_params.size(), nullptr); }
    // Whether kernels with bf16 GEMMs see the model bits (finalize's bf16Gemms).
    bool bf16Gemms() const { return m_bf16Gemms; }

    void zeroGrads();
    // Refreshes the bf16 model copy from the main params (no-op in fp32).
    void syncModelParams();
    // Refreshes the bf16 model copy of elements [begin, end) of the buffer (no-op in fp32). With
    // a sharded main, only the kept ranges' part of [begin, end) is refreshed (the whole-buffer
    // form: every kept range).
    void syncModelParams(int64_t begin, int64_t end);

private:
    std::vector<ParamInfo> m_params;
    std::unique_ptr<Buffer> m_main, m_grad, m_model;  // m_model: bf16 bits
    std::vector<float*> m_working;                     // per param, bf16 (sized by finalize): modelParam's pointer
    // With a sharded main: the kept ranges (none empty), where each starts in the compact m_main,
    // and how many elements they hold.
    std::vector<ElementRange> m_mainRanges;
    std::vector<int64_t> m_mainRangeAt;
    int64_t m_mainKept = 0;
    bool m_mainSharded = false;
    [[noreturn]] void workingMissing(int i) const;
    // Sets the kept main-param ranges (finalize with a sharding placement) and m_mainKept.
    Status setMainRanges(std::vector<ElementRange> ranges);
    int64_t m_numel = 0;
    bool m_bf16 = false;
    bool m_bf16Gemms = true;  // finalize's: whether the GEMMs take bf16 operands
    bool m_finalized = false;
};

}  // namespace ts::engine
