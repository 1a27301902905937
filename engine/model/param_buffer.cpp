// Contiguous main-param / main-grad buffers in Megatron's reverse-registration layout.
#include "engine/model/param_buffer.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "engine/backend/kernels.h"
#include "kernels/cpu/ops.h"

namespace ts::engine {

const char* shardKindName(ShardKind k) {
    switch (k) {
    case ShardKind::Replicated: return "replicated";
    case ShardKind::ColumnParallel: return "column_parallel";
    case ShardKind::RowParallel: return "row_parallel";
    case ShardKind::VocabParallel: return "vocab_parallel";
    }
    return "?";
}

int ParamBuffer::add(ParamInfo info) {
    info.numel = 1;
    for (int64_t d : info.shape) info.numel *= d;
    m_params.push_back(std::move(info));
    return int(m_params.size()) - 1;
}

int ParamBuffer::find(const std::string& name) const {
    for (size_t i = 0; i < m_params.size(); ++i)
        if (m_params[i].name == name) return int(i);
    return -1;
}

ParamBuffer::~ParamBuffer() = default;

void ParamBuffer::workingMissing(int i) const {
    std::fprintf(stderr, "internal error: bf16 param '%s' read outside the part of the model that unpacked it\n",
                 info(i).name.c_str());
    std::abort();
}

Status ParamBuffer::finalize(Device& dev, bool bf16, bool bf16Gemms, const ParamPlacement* placement) {
    if (m_finalized) return Status::internal("ParamBuffer::finalize called twice");
    if (placement) {
        if (placement->offsets.size() != m_params.size())
            return Status::internal("ParamBuffer::finalize: one offset per param needed");
        for (size_t i = 0; i < m_params.size(); ++i) {
            if (placement->offsets[i] < 0 || placement->offsets[i] + m_params[i].numel > placement->numel)
                return Status::internal("ParamBuffer::finalize: param '" + m_params[i].name + "' does not fit");
            m_params[i].offset = placement->offsets[i];
        }
        m_numel = placement->numel;
    } else {
        // Reverse registration order: the last registered param starts at offset 0.
        int64_t off = 0;
        for (size_t i = m_params.size(); i-- > 0;) {
            m_params[i].offset = off;
            off += m_params[i].numel;
        }
        m_numel = off;
    }
    m_bf16 = bf16;
    m_bf16Gemms = bf16Gemms;
    int64_t mainNumel = m_numel;
    if (bf16 && placement && placement->shardMain) {
        TS_RETURN_IF_ERROR(setMainRanges(placement->mainRanges));
        mainNumel = m_mainKept;
    }
    auto main = dev.allocate(size_t(std::max<int64_t>(mainNumel, 1)) * sizeof(float), MemCategory::Params);
    if (!main) return main.status().withContext(m_mainSharded ? "allocating the main params' shard" : "allocating main params");
    auto grad = dev.allocate(size_t(std::max<int64_t>(m_numel, 1)) * sizeof(float), MemCategory::Grads);
    if (!grad) return grad.status().withContext("allocating main grads");
    m_main = std::move(main).value();
    m_grad = std::move(grad).value();
    if (bf16) {
        auto model = dev.allocate(size_t(std::max<int64_t>(m_numel, 1)) * sizeof(uint16_t), MemCategory::Params);
        if (!model) return model.status().withContext("allocating bf16 model params");
        m_model = std::move(model).value();  // zero-filled: the bits of the zero main params
        clearWorking();
    }
    // allocate() zero-fills on every backend (no host memset: on a device the memory is not the host's).
    m_finalized = true;
    return Status::ok();
}

void ParamBuffer::zeroGrads() {
    if (m_grad) kern::setBytes(m_grad->data(), 0, size_t(m_numel) * sizeof(float));
}

void ParamBuffer::syncModelParams() { syncModelParams(0, m_numel); }

void ParamBuffer::syncModelParams(int64_t begin, int64_t end) {
    if (!m_model || begin >= end) return;
    uint16_t* bits = modelBits();
    if (!m_mainSharded) {
        kern::floatToBf16(m_main->as<float>() + begin, bits + begin, end - begin);
        return;
    }
    for (size_t r = 0; r < m_mainRanges.size(); ++r) {
        const int64_t lo = std::max(begin, m_mainRanges[r].begin), hi = std::min(end, m_mainRanges[r].end);
        if (lo >= hi) continue;
        kern::floatToBf16(m_main->as<float>() + m_mainRangeAt[r] + (lo - m_mainRanges[r].begin), bits + lo, hi - lo);
    }
}

float* ParamBuffer::mainParamsAt(int64_t begin, int64_t end) {
    if (!m_mainSharded) return m_main->as<float>() + begin;
    for (size_t r = 0; r < m_mainRanges.size(); ++r)
        if (begin >= m_mainRanges[r].begin && end <= m_mainRanges[r].end)
            return m_main->as<float>() + m_mainRangeAt[r] + (begin - m_mainRanges[r].begin);
    return nullptr;
}

Status ParamBuffer::setMainRanges(std::vector<ElementRange> ranges) {
    int64_t prevEnd = 0;
    for (const ElementRange& r : ranges) {
        if (r.begin < prevEnd || r.end < r.begin || r.end > m_numel)
            return Status::internal("ParamBuffer: the kept main-param ranges must be disjoint, ascending, in the buffer");
        prevEnd = r.end;
    }
    ranges.erase(std::remove_if(ranges.begin(), ranges.end(), [](const ElementRange& r) { return r.begin == r.end; }),
                 ranges.end());
    m_mainRangeAt.clear();
    m_mainKept = 0;
    for (const ElementRange& r : ranges) {
        m_mainRangeAt.push_back(m_mainKept);
        m_mainKept += r.end - r.begin;
    }
    m_mainSharded = true;
    m_mainRanges = std::move(ranges);
    return Status::ok();
}

Result<std::vector<float>> ParamBuffer::mainParamsToHost(Stream& stream, std::vector<char>* kept) {
    if (!m_mainSharded) {
        if (kept) kept->assign(size_t(m_numel), 1);
        return kern::toHost(stream, m_main->as<float>(), m_numel);
    }
    std::vector<uint16_t> bits(static_cast<size_t>(m_numel));
    TS_RETURN_IF_ERROR(kern::copyToHost(stream, bits.data(), modelBits(), bits.size() * sizeof(uint16_t)));
    std::vector<float> image(bits.size());
    kernels::cpu::bf16ToFloat(bits.data(), image.data(), m_numel);
    TS_ASSIGN_OR_RETURN(const std::vector<float> shard, kern::toHost(stream, m_main->as<float>(), m_mainKept));
    if (kept) kept->assign(size_t(m_numel), 0);
    for (size_t r = 0; r < m_mainRanges.size(); ++r) {
        const ElementRange& g = m_mainRanges[r];
        std::copy(shard.begin() + m_mainRangeAt[r], shard.begin() + m_mainRangeAt[r] + (g.end - g.begin),
                  image.begin() + g.begin);
        if (kept) std::fill(kept->begin() + g.begin, kept->begin() + g.end, char(1));
    }
    return image;
}

Status ParamBuffer::mainParamsFromHost(Stream& stream, const std::vector<float>& image) {
    if (int64_t(image.size()) != m_numel)
        return Status::internal("ParamBuffer::mainParamsFromHost: the image has " + std::to_string(image.size()) +
                                " elements, the buffer " + std::to_string(m_numel));
    if (!m_mainSharded) {
        TS_RETURN_IF_ERROR(kern::copyFromHost(stream, m_main->as<float>(), image.data(), image.size() * sizeof(float)));
        return kern::runOp(stream, "sync_model_params", [this] { syncModelParams(); });
    }
    for (size_t r = 0; r < m_mainRanges.size(); ++r) {
        const ElementRange& g = m_mainRanges[r];
        TS_RETURN_IF_ERROR(kern::copyFromHost(stream, m_main->as<float>() + m_mainRangeAt[r], image.data() + g.begin,
                                              size_t(g.end - g.begin) * sizeof(float)));
    }
    // The whole model copy from the image (rounded as syncModelParams rounds a main).
    std::vector<uint16_t> bits(image.size());
    kernels::cpu::floatToBf16(image.data(), bits.data(), m_numel);
    return kern::copyFromHost(stream, modelBits(), bits.data(), bits.size() * sizeof(uint16_t));
}

}  // namespace ts::engine
