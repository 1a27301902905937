// FP8 recipe and scaling state (see fp8.h).
#include "engine/model/fp8.h"

#include "engine/backend/kernels.h"
#include "kernels/common/fp8_codes.h"
#include "kernels/common/row_groups.h"

#include <cfloat>
#include <cmath>

namespace ts::engine {

Result<Fp8Recipe> Fp8Recipe::fromConfig(const Config& c) {
    Fp8Recipe r;
    if (c.fp8.empty()) return r;
    if (c.fp8_recipe != "delayed" && c.fp8_recipe != "tensorwise" && c.fp8_recipe != "mxfp8" &&
        c.fp8_recipe != "blockwise")
        return Status::unsupported("fp8_recipe=" + c.fp8_recipe +
                                   " is not executed by the engine yet; use delayed, tensorwise, mxfp8 or blockwise");
    r.enabled = true;
    // Megatron passes --fp8-format to every recipe (MXFP8BlockScaling / Float8BlockScaling(fp8_format=...)).
    r.backward = c.fp8 == "hybrid" ? kernels::cpu::Fp8Format::E5M2 : kernels::cpu::Fp8Format::E4M3;
    r.delayed = c.fp8_recipe == "delayed";
    if (c.fp8_recipe == "mxfp8") r.block = Block::Mxfp8;
    if (c.fp8_recipe == "blockwise") r.block = Block::Blockwise;
    r.historyLen = std::max(1, c.fp8_amax_history_len);
    r.algoMax = c.fp8_amax_compute_algo == "max";
    r.margin = c.fp8_margin;
    r.wgrad = c.fp8_wgrad;
    if (!r.wgrad)
        return Status::unsupported("fp8_wgrad=false (a high-precision wgrad under fp8) is not executed by the engine "
                                   "yet; leave fp8_wgrad true");
    if (c.first_last_layers_bf16) {
        r.bf16Start = std::max(0, c.num_layers_at_start_in_bf16);
        r.bf16End = std::max(0, c.num_layers_at_end_in_bf16);
    }
    return r;
}

void Fp8Meta::observe(float amax) {
    float& a = history[0];
    if (std::isnan(amax) || std::isnan(a)) a = NAN;
    else a = std::max(a, amax);
}

void Fp8Meta::update(float fp8Max, int margin, bool algoMax) {
    const size_t H = history.size();
    const float last = history[0];
    float amax = 0.0f;
    std::vector<float> rolled(H);
    for (size_t i = 0; i < H; ++i) {
        const float a = i + 1 < H ? history[i + 1] : last;
        amax = (std::isnan(a) || std::isnan(amax)) ? NAN : std::max(amax, a);
        rolled[i] = i > 0 ? a : 0.0f;
    }
    if (!algoMax) amax = last;
    if (std::isfinite(amax) && amax > 0.0f) {
        float s = fp8Max / amax / std::exp2(float(margin));
        if (std::isinf(s)) s = FLT_MAX;
        scale = s;
    }
    history = std::move(rolled);
}

float currentScale(float amax, float fp8Max) {
    if (!std::isfinite(amax) || amax == 0.0f) return 1.0f;
    const float s = fp8Max / amax;
    return std::isinf(s) ? FLT_MAX : s;
}

void fp8QuantizeTensor(const Fp8Recipe& r, const Fp8TensorSlots& q, bool grad, float gradDivisor, const float* x,
                       float* y, uint8_t* codes, int64_t n) {
    const kernels::cpu::Fp8Format fmt = grad ? r.backward : r.forward;
    const float g = grad ? gradDivisor : 1.0f;
    if (n == 0) {
        if (!r.delayed) kern::setBytes(q.observed, 0, sizeof(float));
        return;
    }
    if (r.delayed) {
        kern::amaxAccumulate(x, n, g, q.observed);
        // the step's scale, read where kernels see it (a captured graph reads each step's)
        kern::fp8QuantizeDelayed(x, y, codes, n, q.scale, g, fmt);
        kernels::fp8codes::map().bindScaleAt(y, n, q.scale, g, int(fmt), q.scaleOwner);
        return;
    }
    kern::amaxInto(x, n, q.amax);
    kern::fp8QuantizeCurrent(x, y, codes, n, q.amax, g, fmt, q.observed);
    // y holds codes at the scale of that amax, bound with it for the GEMMs that take them.
    const float* from = q.amax;
    std::shared_ptr<const void> owner = q.amaxOwner;
    if (q.keep) {
        kern::copyBytes(q.keep, q.amax, sizeof(float));
        from = q.keep;
        owner = q.keepOwner;
    }
    kernels::fp8codes::map().bindCurrent(y, n, from, g, int(fmt), std::move(owner));
}

const float* fp8BlockOperand(const Fp8Recipe& r, const float* x, int64_t rows, int64_t cols, bool alongRows,
                             bool weight, bool grad, float* out) {
    namespace k = kern;
    if (!r.isBlock()) return x;
    const k::Fp8BlockKind kind = r.block == Fp8Recipe::Block::Mxfp8 ? k::Fp8BlockKind::Mx1x32
                                 : weight                           ? k::Fp8BlockKind::Block128x128
                                                                    : k::Fp8BlockKind::Block1x128;
    k::fp8BlockQuantizeDequantize(x, out, nullptr, nullptr, rows, cols, kind, alongRows,
                                  grad ? r.backward : r.forward, r.blockPow2);
    return out;
}

int64_t fp8BlockBackwardWorkElems(int T, int in, int out) { return int64_t(T) * (int64_t(in) + out); }

void fp8BlockLinearBackward(const Fp8Recipe& r, const float* dy, const float* x, const float* Wcol, float* dx,
                            float* dW, int T, int in, int out, float* work) {
    // work: [T, out] for dy (rowwise for the dgrad, then columnwise for the wgrad), [T, in] for x.
    float* dyQ = work;
    float* xQ = work + int64_t(T) * out;
    if (dx) {
        const float* dyRow = fp8BlockOperand(r, dy, T, out, true, false, true, dyQ);
        kern::linearBackward(dyRow, nullptr, Wcol, dx, nullptr, nullptr, T, in, out);
    }
    if (!dW) return;
    const float* dyCol = fp8BlockOperand(r, dy, T, out, false, false, true, dyQ);
    const float* xCol = fp8BlockOperand(r, x, T, in, false, false, false, xQ);
    kern::linearBackward(dyCol, xCol, nullptr, nullptr, dW, nullptr, T, in, out);
}

void fp8BlockExpertsForward(const Fp8Recipe& r, const float* x, const float* const* Wrow, const float* const* b,
                            float* y, const int* off, int l0, int l1, int in, int out, float* xq) {
    kernels::forEachGroupWithRows(off, l0, l1, [&](int l, int r0, int rows) {
        const float* xl = fp8BlockOperand(r, x + int64_t(r0) * in, rows, in, true, false, false, xq + int64_t(r0) * in);
        kern::linearForward(xl, Wrow[l], b ? b[l] : nullptr, y + int64_t(r0) * out, rows, in, out);
    });
}

void fp8BlockExpertsBackward(const Fp8Recipe& r, const float* dy, const float* x, const float* const* Wcol, float* dx,
                             float* const* dW, const int* off, int l0, int l1, int in, int out, float* work) {
    kernels::forEachGroupWithRows(off, l0, l1, [&](int l, int r0, int rows) {
        fp8BlockLinearBackward(r, dy + int64_t(r0) * out, x + int64_t(r0) * in, Wcol[l],
                               dx ? dx + int64_t(r0) * in : nullptr, dW ? dW[l] : nullptr, rows, in, out,
                               work + int64_t(r0) * (in + out));
    });
}

}  // namespace ts::engine
