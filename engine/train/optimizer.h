// AdamW over the contiguous main params/grads, with Megatron's global-norm gradient clipping
// and learning-rate schedule (megatron/core/optimizer_param_scheduler.py).
//
// Clipping: norm = sqrt(sum of squares of all main grads); coef = clip_grad / (norm + 1e-6);
// grads *= coef when coef < 1 (same as torch.nn.utils.clip_grad_norm_). Weight decay is
// decoupled (AdamW) and skipped for biases and 1-D params (Megatron's default rule).
// A non-finite grad norm fails the step with NumericalError.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/config/config.h"
#include "engine/model/layers.h"
#include "engine/model/param_buffer.h"

namespace ts::engine {

struct LrSchedule {
    double maxLr = 3e-4, minLr = 0;
    int warmupIters = 0;
    int decayIters = 0;             // lr_decay_iters (default train_iters)
    std::string style = "constant";  // constant | linear | cosine
    // lr of the iteration that follows `completedIters` completed iterations (0-based), as
    // Megatron: warmup max_lr*i/warmup (i <= warmup), then decay to min_lr.
    double lrAt(int64_t completedIters) const;
    static LrSchedule fromConfig(const Config& c);
};

struct OptimizerStepInfo {
    double gradNorm = 0;   // before clipping
    double lr = 0;
    bool clipped = false;
    float clipCoef = 1.0f;  // factor the AdamW update applies to the grads (1 = not clipped)
};

// The host-side update both optimizers run (AdamWOptimizer on a whole buffer, ShardedAdamW
// on the ranges a rank owns), so their numerics agree element by element.
struct AdamSegment {  // one contiguous run of a param: n elements of each array
    float* param = nullptr;
    float* grad = nullptr;
    float* expAvg = nullptr;
    float* expAvgSq = nullptr;
    int64_t n = 0;
    bool noWeightDecay = false;
    uint16_t* bits = nullptr;  // the bf16 model copy of these elements, written by the step (null: fp32)
};
struct AdamHyper {
    double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weightDecay = 0.01, clipGrad = 1.0;
    static AdamHyper fromConfig(const Config& c);
};
// Shared validation of the optimizer knobs (lr, betas, clip_grad).
Status validateAdamConfig(const Config& c);
// Megatron's clip_grad_norm_ from the (global) sum of squared grads: fills `info` (norm before
// clipping, lr, clipped, clipCoef = clip / (norm + 1e-6) when that is < 1, else 1). Megatron
// scales the grads in place; here adamwSegments applies clipCoef inside the update (the same
// float product g * coef, one pass over the grads fewer), so the main grads keep their
// unclipped values after the step. A non-finite norm returns NumericalError naming `iteration`.
Status clipSegmentGrads(double sumSquares, const AdamHyper& hp, double lr, int iteration, OptimizerStepInfo* info);
// One AdamW step (kernels::cpu::adamwStep) on every segment with the grads scaled by
// `gradScale` (the clip coefficient); no weight decay on noWeightDecay.
void adamwSegments(const std::vector<AdamSegment>& segs, const AdamHyper& hp, double lr, int64_t step,
                   float gradScale);

class AdamWOptimizer {
public:
    // Allocates exp_avg / exp_avg_sq (OptimizerState) for `params`.
    static Result<std::unique_ptr<AdamWOptimizer>> create(const Config& c, ParamBuffer& params, Device& dev);

    // Enqueues on the compute stream: grad norm, clipping, AdamW, bf16 copy refresh. The
    // result is valid after the stream is synchronized; a non-finite norm fails the stream
    // with NumericalError naming `iteration`.
    void enqueueStep(Exec& exec, double lr, int iteration);
    const OptimizerStepInfo& lastStep() const { return *m_info; }

    int64_t stepCount() const { return m_steps; }
    void setStepCount(int64_t n) { m_steps = n; }
    float* expAvg() { return m_m->as<float>(); }
    float* expAvgSq() { return m_v->as<float>(); }
    int64_t numel() const { return m_params.numel(); }

private:
    AdamWOptimizer(ParamBuffer& p) : m_params(p) {}
    ParamBuffer& m_params;
    std::unique_ptr<Buffer> m_m, m_v;
    AdamHyper m_hp;
    int64_t m_steps = 0;
    std::shared_ptr<OptimizerStepInfo> m_info = std::make_shared<OptimizerStepInfo>();
};

}  // namespace ts::engine
