// GptModel's embedding (first pipeline stage): the vocab-parallel lookup (TP rank r holds the
// rows [r*V/t, (r+1)*V/t) of the table), summed over TP or, with sequence parallel, summed and
// split along s in one reduce-scatter, then dropout; and its backward into the main grad.
// With position_embedding_type=learned_absolute, as Megatron-Core's LanguageModelEmbedding:
// the lookup is all-reduced over TP, the replicated position table [max_pos, h] is added
// (position ids 0..s-1 for every sample), and only then, with sequence parallel, the sum is
// scattered to the SP region (split along s, no communication); backward all-gathers along s
// and every TP rank accumulates the full position-embedding grad.
#include "engine/model/gpt.h"

#include "engine/model/gpt_internal.h"

namespace ts::engine {

Status GptModel::embeddingForward(MbState& st, int mb) {
    const int T = m_d.seq * m_d.microBatch, h = m_d.hidden;
    const int64_t Th = int64_t(T) * h, ThL = stageTensorElems();
    const bool bf = m_o.bf16;
    auto data = st.data;
    // The tables are only gathered from, so bf16 reads the model copy's bits (no working copy:
    // useWeights is not needed), fp32 the main params. The backward reads no weight.
    const uint16_t* bits = m_params.modelBits();
    auto bitsOf = [&](int i) { return bits + m_params.info(i).offset; };
    TS_ASSIGN_OR_RETURN(TensorPtr emb, m_exec.alloc(Th));
    const int vStart = m_vocabStart, vEnd = m_vocabStart + m_vocabL, V = m_d.paddedVocab;
    const KernelIds ids = st.ids;
    {
        const float* E = bits ? nullptr : m_params.modelParam(m_embW);
        const uint16_t* Eb = bits ? bitsOf(m_embW) : nullptr;
        m_exec.op("embedding.fwd", Category::Embedding, 0, uint64_t(Th) * 4 + uint64_t(Th) * (bits ? 2 : 4), [=] {
            if (Eb) k::embeddingLookupBf16(ids.ptr, Eb, fp(emb), T, h, vStart, vEnd, V);
            else k::embeddingLookup(ids.ptr, E, fp(emb), T, h, vStart, vEnd, V);
        });
    }
    if (m_posW >= 0) {
        // Megatron: reduce_scatter_embeddings is off with a position embedding; the word
        // embedding is all-reduced, the positions added, then scatter_to_sequence_parallel_region.
        tpAllReduce(emb, Th);
        const float* Pw = bits ? nullptr : m_params.modelParam(m_posW);
        const uint16_t* Pb = bits ? bitsOf(m_posW) : nullptr;
        const int b = m_d.microBatch;
        // Per contiguous segment of rows with its first global position (context parallel: the
        // rank's two sequence chunks; otherwise the whole sequence from 0).
        auto segs = std::make_shared<std::vector<RopeSegment>>(m_ropeSegs);
        m_exec.op("position_embedding.fwd", Category::Embedding, double(Th), uint64_t(Th) * (bits ? 10 : 12), [=] {
            for (const RopeSegment& sg : *segs) {
                float* rows = fp(emb) + int64_t(sg.start) * b * h;
                if (Pb) k::positionEmbeddingForwardBf16(Pb + int64_t(sg.pos) * h, rows, sg.len, b, h);
                else k::positionEmbeddingForward(Pw + int64_t(sg.pos) * h, rows, sg.len, b, h);
            }
        });
        if (m_sp) {
            TS_ASSIGN_OR_RETURN(TensorPtr local, allocUninitialized(m_exec, ThL));
            const int64_t off = int64_t(m_ctx.tpRank) * ThL;
            TensorPtr full = emb;
            m_exec.op("embedding_scatter_to_sp", Category::Memcpy, 0, uint64_t(ThL) * 8, [=] {
                k::copyBytes(local->data(), fp(full) + off, size_t(ThL) * sizeof(float));
            });
            emb = local;
        }
    } else if (m_sp) {
        // Partial vocab-parallel lookups summed and split along s in one reduce-scatter
        // (Megatron's reduce_scatter_embeddings).
        TS_ASSIGN_OR_RETURN(emb, seqReduceScatter(emb, ThL));
    } else {
        tpAllReduce(emb, Th);  // partial vocab-parallel lookups summed over TP
    }
    const float p = m_o.hiddenDropout;
    if (p > 0) {
        // Mask elements numbered as in the single device's [s*b, h] (hiddenDropPieces).
        auto pieces = std::make_shared<const std::vector<DropPiece>>(hiddenDropPieces());
        TS_ASSIGN_OR_RETURN(TensorPtr dropped, m_exec.alloc(ThL));
        TS_ASSIGN_OR_RETURN(st.embMask, m_exec.alloc(ThL, MemCategory::Activations, 1));
        TensorPtr mask = st.embMask;
        const kernels::hd::DropoutSeed seed = dropSeed(mb, -1, 0);
        m_exec.op("embedding_dropout", Category::Elementwise, double(ThL), uint64_t(ThL) * 9, [=] {
            for (const DropPiece& pc : *pieces)
                k::dropoutForward(fp(emb) + pc.local, fp(dropped) + pc.local, mask->as<uint8_t>() + pc.local, pc.n, p,
                                  seed, uint64_t(pc.global));
            if (bf) k::roundToBf16(fp(dropped), ThL);
        });
        emb = dropped;
    } else if (bf) {
        roundBf16(emb, ThL);
    }
    st.hidden = emb;
    return Status::ok();
}

Status GptModel::embeddingBackward(MbState& st, TensorPtr dh) {
    const int T = m_d.seq * m_d.microBatch, h = m_d.hidden;
    const int64_t Th = int64_t(T) * h, ThL = stageTensorElems();
    m_exec.setLayer(-1);
    const float p = m_o.hiddenDropout;
    TensorPtr demb = dh;
    if (p > 0) {
        TS_ASSIGN_OR_RETURN(demb, m_exec.alloc(ThL));
        TensorPtr mask = st.embMask, src = dh;
        m_exec.op("embedding_dropout.bwd", Category::Elementwise, double(ThL), uint64_t(ThL) * 9,
                  [=] { k::dropoutBackward(fp(src), mask->as<uint8_t>(), fp(demb), ThL, p); });
    }
    // SP: backward of the embedding's reduce-scatter (or of the scatter to the SP region after
    // the position add) = all-gather of the grad along s.
    if (m_sp) { TS_ASSIGN_OR_RETURN(demb, seqGather(demb, ThL)); }
    if (m_posW >= 0) {
        float* PG = m_params.mainGrad(m_posW);
        const int b = m_d.microBatch;
        TensorPtr g = demb;
        auto segs = std::make_shared<std::vector<RopeSegment>>(m_ropeSegs);
        m_exec.op("position_embedding.bwd", Category::Embedding, double(Th), uint64_t(Th) * 8, [=] {
            for (const RopeSegment& sg : *segs)
                k::positionEmbeddingBackward(fp(g) + int64_t(sg.start) * b * h, PG + int64_t(sg.pos) * h, sg.len, b, h);
        });
    }
    float* G = m_params.mainGrad(m_embW);
    auto data = st.data;
    const int vStart = m_vocabStart, vEnd = m_vocabStart + m_vocabL;
    m_exec.op("embedding.bwd", Category::Embedding, double(Th), uint64_t(Th) * 8,
              [=, ids = st.ids] {
                  k::embeddingBackward(ids.ptr, fp(demb), G, T, h, vStart, vEnd);
              });
    return Status::ok();
}

}  // namespace ts::engine
