// FP8 linears (issue #16; REFERENCE.md §6), as Transformer Engine runs them under Megatron:
// the recipe from the config, and the scaling state of one FP8 tensor.
//
// What is FP8 (GptModel, gpt_fp8.cpp): the GEMM inputs of the four linears of a transformer layer
// (linear_qkv, linear_proj, linear_fc1, linear_fc2), and of every MoE expert's fc1 and fc2 (one
// scaling state per expert GEMM, as TE's GroupedLinear): the activation and the weight in E4M3 in
// the forward; the output gradient in E4M3 (fp8=e4m3) or E5M2 (fp8=hybrid) for dgrad and wgrad.
// Emulated: each tensor is quantized with its scale (round to nearest even, saturating) and
// dequantized with the inverse scale, and the GEMM runs in fp32 on those values — the numbers an
// FP8 GEMM with fp32 accumulation computes, up to summation order.
// Block recipes (mxfp8, blockwise): no scaling state; each GEMM quantizes its operands per block
// along its own reduction dimension from the high-precision tensors (fp8BlockOperand,
// fp8BlockLinearBackward; kernels/cpu/fp8_block.h), inside the MoE experts each expert's rows
// on their own (fp8BlockExpertsForward / Backward). Embedding, output layer, norms,
// attention and the first/last layers under first_last_layers_bf16 stay in bf16.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/config/config.h"
#include "kernels/cpu/ops.h"

namespace ts::engine {

struct Fp8Recipe {
    bool enabled = false;
    kernels::cpu::Fp8Format forward = kernels::cpu::Fp8Format::E4M3;   // activations and weights
    kernels::cpu::Fp8Format backward = kernels::cpu::Fp8Format::E4M3;  // output gradients (hybrid: E5M2)
    bool delayed = true;   // fp8_recipe=delayed; false: tensorwise (current scaling) or a block recipe
    // fp8_recipe=mxfp8 / blockwise (kernels/cpu/fp8_block.h): each GEMM operand quantized per
    // block along the GEMM's reduction dimension, from the high-precision tensor (no scaling state).
    enum class Block : uint8_t { None = 0, Mxfp8, Blockwise };
    Block block = Block::None;
    bool blockPow2 = true;  // blockwise: power-of-two scales (TE's default)
    int historyLen = 1;    // fp8_amax_history_len
    bool algoMax = false;  // fp8_amax_compute_algo=max (else most_recent)
    int margin = 0;        // fp8_margin
    bool wgrad = true;     // fp8_wgrad: false keeps the wgrad GEMM's output gradient in high precision
    int bf16Start = 0, bf16End = 0;  // first/last layers kept in bf16 (first_last_layers_bf16)

    static Result<Fp8Recipe> fromConfig(const Config& c);
    bool isBlock() const { return block != Block::None; }
    // Whether global layer `layer` of `numLayers` runs its linears in FP8.
    bool layerInFp8(int layer, int numLayers) const {
        return enabled && layer >= bf16Start && layer < numLayers - bf16End;
    }
};

// Delayed scaling state of one FP8 tensor (REFERENCE.md §6.2, TE's delayed_scaling kernel):
// history[0] is the running amax of the current step (observe), history[1..H-1] the earlier
// steps, oldest first... after update(): the newest step moves to the end, the oldest (history[1])
// drops out, history[0] restarts at 0. The scale used during a step comes from steps before it.
struct Fp8Meta {
    std::vector<float> history{0.0f};
    float scale = 1.0f;

    void reset(int historyLen) {
        history.assign(size_t(historyLen < 1 ? 1 : historyLen), 0.0f);
        scale = 1.0f;
    }
    void observe(float amax);  // history[0] = max(history[0], amax); NaN sticks
    // End of step: amax = max(history) (algoMax) or history[0] (most_recent); if amax is finite
    // and > 0, scale = fp8Max / amax / 2^margin (FLT_MAX if that overflows), else the scale stays;
    // then the roll.
    void update(float fp8Max, int margin, bool algoMax);
};

// Current (tensorwise) scaling (REFERENCE.md §6.3): fp8Max / amax; 1 when amax is 0 or not
// finite; FLT_MAX when the quotient overflows.
float currentScale(float amax, float fp8Max);

// Where one FP8 tensor's scaling state is while the ops that quantize it run, all of it in floats
// kernels see (no value goes back to the host per tensor): `scale`, delayed scaling's step scale
// (its meta's, written by the host after each update, so a captured graph reads each step's);
// `observed`, the amax it reports (delayed: the step's observations, accumulated; tensorwise: its
// last); `amax`, tensorwise's scratch for the raw amax.
struct Fp8TensorSlots {
    const float* scale = nullptr;
    float* observed = nullptr;
    float* amax = nullptr;
    // Tensorwise: what keeps `amax` (the codes are bound with it, kernels/common/fp8_codes.h), or,
    // where the slot is reused before the codes are done with (the next microbatch's experts),
    // `keep`, a float of the caller's that the amax is copied to and the codes bound with, and
    // what keeps that.
    std::shared_ptr<const void> amaxOwner;
    float* keep = nullptr;
    std::shared_ptr<const void> keepOwner;
    // Delayed: what keeps `scale` (the codes are bound with it).
    std::shared_ptr<const void> scaleOwner;
};

// Quantizes x [n] to FP8 and back into y (in place when y == x; codes: the FP8 bytes, or null)
// under recipe r, through the kernel dispatch, inside an op (the MoE experts, whose rows are known
// only when their ops run). `grad`: an output gradient (the backward format), whose amax and scale
// are taken for gradDivisor-times smaller values (see GptModel::fp8Quantize). Delayed: *scale,
// read when the kernel runs; the amax accumulated into *observed. Tensorwise: the scale from this tensor's amax,
// computed on the device; *observed = that amax. n = 0: delayed observes nothing, tensorwise
// records amax 0.
void fp8QuantizeTensor(const Fp8Recipe& r, const Fp8TensorSlots& q, bool grad, float gradDivisor, const float* x,
                       float* y, uint8_t* codes, int64_t n);

// Block recipes: x [rows, cols] of a GEMM operand quantized per block along `alongRows` (blocks of
// a row: the GEMM reduces over cols) into `out` (rows*cols floats, a buffer kernels see), which is
// returned; x itself when r is not a block recipe. Activations and gradients: 1x32 (mxfp8) or
// 1x128 (blockwise) blocks; weight: 1x32 or 128x128 tiles. Runs through the kernel dispatch.
const float* fp8BlockOperand(const Fp8Recipe& r, const float* x, int64_t rows, int64_t cols, bool alongRows,
                             bool weight, bool grad, float* out);
// Block recipes, the backward of y = x W^T (W [out, in]): dgrad dx = Q(dy along out) Qc(W)
// where Wcol = Qc(W) is the weight quantized along out (may be null with dx null); wgrad dW +=
// Q(dy along T)^T Q(x along T); every quantization from the high-precision tensor. work: a
// buffer of fp8BlockBackwardWorkElems(T, in, out) floats for the quantized operands.
int64_t fp8BlockBackwardWorkElems(int T, int in, int out);
void fp8BlockLinearBackward(const Fp8Recipe& r, const float* dy, const float* x, const float* Wcol, float* dx,
                            float* dW, int T, int in, int out, float* work);

// Block recipes inside the MoE experts (TE's GroupedLinear: the rows of each local expert, its
// m_split, are quantized as a tensor of their own, with the expert's own weight copies). The rows
// of all local experts lie in one buffer, expert l's at [off[l], off[l+1]); these run experts
// [l0, l1). Forward: y_l = Q(x_l along in) Wrow[l]^T (+ b[l] when b and b[l] are given), the
// quantized rows into xq (off[l1] * in floats, the same row offsets). Backward of the same:
// per expert fp8BlockLinearBackward on its own rows (the wgrad's blocks along the tokens start
// at the expert's first row), dx and dW[l] may be null; work: fp8BlockBackwardWorkElems(off[l1],
// in, out) floats, expert l's part at off[l] * (in + out).
void fp8BlockExpertsForward(const Fp8Recipe& r, const float* x, const float* const* Wrow, const float* const* b,
                            float* y, const int* off, int l0, int l1, int in, int out, float* xq);
void fp8BlockExpertsBackward(const Fp8Recipe& r, const float* dy, const float* x, const float* const* Wcol, float* dx,
                             float* const* dW, const int* off, int l0, int l1, int in, int out, float* work);

}  // namespace ts::engine
