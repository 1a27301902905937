// Model-level types shared by the GPT model, the trainer and (issue #4) the parallel
// engine: the parallel context of a rank, the model shape derived from a Config, and the
// options (fusions, precision, recompute) that select code paths.
//
// Sharding convention (Megatron-Core, REFERENCE.md §2.1): every parameter is stored per rank
// as a shard. Column-parallel linears split the rows of W[out, in] by tp, row-parallel ones the
// columns, embedding/output are vocab-parallel (rows [r*V/t, (r+1)*V/t)), norms are replicated.
// With tp = 1 the shard is the whole tensor.
#pragma once

#include <atomic>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/config/config.h"
#include "engine/model/fp8.h"

namespace ts::engine {

class Communicator;
class Stream;

// What one rank holds and whom it talks to. Communicators may be null when the group has
// size 1. Layers [layerBegin, layerEnd) of the global model live on this rank (this pp stage /
// virtual chunk); the first stage owns the embedding, the last the final norm, output layer
// and loss.
struct ParallelContext {
    int tpRank = 0, tpSize = 1;
    int ppRank = 0, ppSize = 1;
    int vppChunk = 0, vppSize = 1;
    int dpRank = 0, dpSize = 1;
    int cpRank = 0, cpSize = 1;
    int epRank = 0, epSize = 1;  // expert parallel: this rank holds experts [epRank*E/ep, (epRank+1)*E/ep)
    // Expert tensor parallel (expert_tensor_parallel_size; REFERENCE.md §5.3): each local expert's
    // fc1 split by rows (column parallel) and fc2 by columns (row parallel) over "etp".
    int etpRank = 0, etpSize = 1;
    bool sequenceParallel = false;
    Communicator* tp = nullptr;  // TP collectives are enqueued on the compute stream
    Communicator* pp = nullptr;
    Communicator* dp = nullptr;
    Communicator* amax = nullptr;  // FP8 delayed scaling: amax reduction group (tp-dp-cp), compute stream
    // The same "tp-dp-cp" group for the MoE router: global_aux_loss counts (forward) and the
    // expert-bias update's counts (end of step). Compute stream.
    Communicator* tpDpCp = nullptr;
    Communicator* cp = nullptr;    // context parallel ("cp"), compute stream
    // cp_comm_type=a2a+p2p: the all-to-all group "hcp-a2a" (compute stream; null when its size is
    // 1) and this rank's place in it; cpRank = p2p rank * hcpA2aSize + hcpA2aRank.
    Communicator* hcpA2a = nullptr;
    int hcpA2aRank = 0, hcpA2aSize = 1;
    Communicator* ep = nullptr;    // expert parallel token all-to-all ("ep"), compute stream
    Communicator* etp = nullptr;   // expert TP: the dispatched rows' all-gather / reduce-scatter ("etp"), compute stream
    // The expert tensor-and-expert-parallel group ("etp-ep", group rank etpRank + etpSize*epRank;
    // = ep with ETP 1): the token counts' all-gather and the allgather dispatcher. Compute stream.
    Communicator* etpEp = nullptr;
    int layerBegin = 0;
    int layerEnd = -1;  // -1 = num_layers
    bool firstStage = true;
    bool lastStage = true;
};

// Context parallel sharding (REFERENCE.md §4.1, Megatron's get_batch_on_this_cp_rank): the
// sequence is split into 2c equal chunks and CP rank r keeps chunks r and 2c-1-r, in that order.
// The global sequence positions of CP rank `rank`'s local rows, in local order (s/c of them).
std::vector<int> cpLocalPositions(int seq, int cp, int rank);

// Shapes after Megatron's derivations (padded vocab, ffn default, groups, kv channels).
struct ModelDims {
    int layers = 0;       // global number of transformer layers
    int hidden = 0;       // h
    int heads = 0;        // a (query heads, global)
    int groups = 0;       // query groups (kv heads, global)
    int headDim = 0;      // kv_channels
    int ffn = 0;          // F (per GLU half for SwiGLU)
    int vocab = 0;        // tokenizer vocab (targets must be < vocab)
    int paddedVocab = 0;  // V
    int seq = 0;          // s
    int microBatch = 0;   // b
    bool swiglu = false;
    bool rmsNorm = false;
    bool rope = true;
    bool learnedPos = false;  // position_embedding_type=learned_absolute: a [maxPos, h] table
    int maxPos = 0;           // max_position_embeddings (Megatron's default: seq_length)
    bool tied = true;
    bool bias = true;
    float normEps = 1e-5f;
    float ropeTheta = 10000.f;
};

// Execution options (all from Config knobs).
struct ModelOptions {
    bool fusedSoftmax = true;        // masked_softmax_fusion
    // attention_backend flash, fused or auto: core attention keeps per-row softmax stats instead of
    // the [b, a, s, s] probabilities (Megatron's TE/cuDNN default); unfused, local: probs kept.
    bool flashAttention = true;
    bool fusedBiasAct = true;        // bias_activation_fusion
    bool fusedBiasDropout = true;    // bias_dropout_fusion
    bool fusedRope = true;           // apply_rope_fusion
    bool fusedCrossEntropy = true;   // cross_entropy_loss_fusion
    bool gradAccumFusion = true;     // gradient_accumulation_fusion
    bool fusedLayerNorm = true;      // persist_layer_norm
    bool bf16 = false;
    float hiddenDropout = 0.f;
    float attentionDropout = 0.f;  // on the attention probabilities (after softmax)
    float initStd = 0.02f;
    uint64_t seed = 1234;
    // Recompute: "" | selective | full; method uniform | block; numLayers.
    std::string recomputeGranularity;
    std::string recomputeMethod;
    int recomputeNumLayers = 0;
    Fp8Recipe fp8;  // FP8 linears (engine/model/fp8.h); off unless fp8 is set
    // bf16 runs: each layer's saved activations wait for their backward as bf16 bits, 2 bytes an
    // element as Megatron-LM keeps them (GptModel::saveBf16); false keeps them in fp32 words
    // (TS_BF16_SAVED_FP32=1, to compare).
    bool bf16SavedPacked = false;
};

// TS_BF16_SAVED_FP32=1: a bf16 run keeps its saved activations in fp32 words (the same bits as
// packing them; for comparing memory and for tests).
bool bf16SavedInFp32Words();

// Derives dims/options from a config and checks that the shapes fit this engine
// (InvalidArgument with the knob names otherwise).
Result<ModelDims> modelDimsFromConfig(const Config& c);
ModelOptions modelOptionsFromConfig(const Config& c);

}  // namespace ts::engine
