// AdamW + global-norm clipping + Megatron lr schedule.
#include "engine/train/optimizer.h"

#include <cmath>
#include <cstring>

#include "engine/backend/kernels.h"

namespace ts::engine {

namespace k = ts::engine::kern;

double LrSchedule::lrAt(int64_t i) const {
    if (warmupIters > 0 && i <= warmupIters) return maxLr * double(i) / double(warmupIters);
    if (style == "constant") return maxLr;
    const int64_t decay = std::max<int64_t>(decayIters, warmupIters + 1);
    if (i > decay) return minLr;
    const double ratio = double(i - warmupIters) / double(decay - warmupIters);
    double coef = 1.0;
    if (style == "linear") coef = 1.0 - ratio;
    else if (style == "cosine") coef = 0.5 * (std::cos(M_PI * ratio) + 1.0);
    return minLr + coef * (maxLr - minLr);
}

LrSchedule LrSchedule::fromConfig(const Config& c) {
    LrSchedule s;
    s.maxLr = c.lr;
    s.minLr = c.min_lr;
    s.warmupIters = c.lr_warmup_iters;
    s.decayIters = c.train_iters;
    s.style = c.lr_decay_style;
    return s;
}

AdamHyper AdamHyper::fromConfig(const Config& c) {
    AdamHyper h;
    h.beta1 = c.adam_beta1;
    h.beta2 = c.adam_beta2;
    h.eps = c.adam_eps;
    h.weightDecay = c.weight_decay;
    h.clipGrad = c.clip_grad;
    return h;
}

Status validateAdamConfig(const Config& c) {
    if (c.lr < 0) return Status::invalid("lr must be >= 0");
    if (c.adam_beta1 < 0 || c.adam_beta1 >= 1 || c.adam_beta2 < 0 || c.adam_beta2 >= 1)
        return Status::invalid("adam_beta1 and adam_beta2 must be in [0, 1)");
    if (c.clip_grad < 0) return Status::invalid("clip_grad must be >= 0 (0 disables clipping)");
    return Status::ok();
}

Status clipSegmentGrads(double sumSquares, const AdamHyper& hp, double lr, int iteration, OptimizerStepInfo* info) {
    const double norm = std::sqrt(sumSquares);
    info->gradNorm = norm;
    info->lr = lr;
    info->clipped = false;
    info->clipCoef = 1.0f;
    if (!std::isfinite(norm))
        return Status::numerical("gradient norm is " + std::to_string(norm) + " at iteration " +
                                 std::to_string(iteration) + " (NaN/inf in the gradients)");
    if (hp.clipGrad > 0) {
        const double coef = hp.clipGrad / (norm + 1e-6);
        if (coef < 1.0) {
            info->clipCoef = float(coef);
            info->clipped = true;
        }
    }
    return Status::ok();
}

void adamwSegments(const std::vector<AdamSegment>& segs, const AdamHyper& hp, double lr, int64_t step,
                   float gradScale) {
    k::AdamParams base;
    base.lr = float(lr);
    base.beta1 = float(hp.beta1);
    base.beta2 = float(hp.beta2);
    base.eps = float(hp.eps);
    base.step = step;
    base.gradScale = gradScale;
    for (const AdamSegment& s : segs) {
        k::AdamParams p = base;
        p.weightDecay = s.noWeightDecay ? 0.f : float(hp.weightDecay);
        k::adamwStep(s.param, s.grad, s.expAvg, s.expAvgSq, s.n, p, s.bits);
    }
}

Result<std::unique_ptr<AdamWOptimizer>> AdamWOptimizer::create(const Config& c, ParamBuffer& params, Device& dev) {
    TS_RETURN_IF_ERROR(validateAdamConfig(c));
    if (c.lr_decay_style != "constant" && c.lr_decay_style != "linear" && c.lr_decay_style != "cosine")
        return Status::invalid("lr_decay_style must be constant, linear or cosine");
    std::unique_ptr<AdamWOptimizer> o(new AdamWOptimizer(params));
    o->m_hp = AdamHyper::fromConfig(c);
    const size_t bytes = size_t(std::max<int64_t>(params.numel(), 1)) * sizeof(float);
    auto m = dev.allocate(bytes, MemCategory::OptimizerState);
    if (!m) return m.status().withContext("allocating Adam exp_avg");
    auto v = dev.allocate(bytes, MemCategory::OptimizerState);
    if (!v) return v.status().withContext("allocating Adam exp_avg_sq");
    o->m_m = std::move(m).value();
    o->m_v = std::move(v).value();
    // allocate() zero-fills exp_avg and exp_avg_sq on every backend.
    return o;
}

void AdamWOptimizer::enqueueStep(Exec& exec, double lr, int iteration) {
    ++m_steps;
    const int64_t n = m_params.numel();
    float* grads = m_params.mainGrads();
    // One segment per param (weight decay is per param); built now, as the buffers are final.
    // With bf16 the step writes the model copy's bits in the same pass (an unsharded main: the
    // bits lie at the main's offsets).
    auto segs = std::make_shared<std::vector<AdamSegment>>();
    uint16_t* bits = m_params.modelBits();
    for (int i = 0; i < m_params.count(); ++i) {
        const ParamInfo& p = m_params.info(i);
        segs->push_back({m_params.mainParam(i), m_params.mainGrad(i), expAvg() + p.offset, expAvgSq() + p.offset,
                         p.numel, p.noWeightDecay, bits ? bits + p.offset : nullptr});
    }
    auto info = m_info;
    const AdamHyper hp = m_hp;
    const int64_t step = m_steps;
    exec.setLayer(-1);
    // The norm is summed over the whole buffer in one pass (its summation order is part of
    // the bit-exact contract of single-device runs).
    exec.opStatus("optimizer.grad_norm", trace::Category::Optimizer, 2.0 * double(n), uint64_t(n) * 4,
                  [=]() -> Status { return clipSegmentGrads(k::sumSquares(grads, n), hp, lr, iteration, info.get()); });
    exec.op("optimizer.adamw", trace::Category::Optimizer, 12.0 * double(n), uint64_t(n) * 20,
            [=] { adamwSegments(*segs, hp, lr, step, info->clipCoef); });
}

}  // namespace ts::engine
