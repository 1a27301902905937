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

#include "common/status.h"
#include "engine/config.h"
#include "engine/layers.h"
#include "engine/param_buffer.h"

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
};

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
    double m_beta1 = 0.9, m_beta2 = 0.999, m_eps = 1e-8, m_wd = 0.01, m_clip = 1.0;
    int64_t m_steps = 0;
    std::shared_ptr<OptimizerStepInfo> m_info = std::make_shared<OptimizerStepInfo>();
};

}  // namespace ts::engine
