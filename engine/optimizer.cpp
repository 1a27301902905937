// AdamW + global-norm clipping + Megatron lr schedule.
#include "engine/optimizer.h"

#include <cmath>
#include <cstring>

#include "kernels/cpu/ops.h"

namespace ts::engine {

namespace k = ts::kernels::cpu;

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

Result<std::unique_ptr<AdamWOptimizer>> AdamWOptimizer::create(const Config& c, ParamBuffer& params, Device& dev) {
    if (c.lr < 0) return Status::invalid("lr must be >= 0");
    if (c.adam_beta1 < 0 || c.adam_beta1 >= 1 || c.adam_beta2 < 0 || c.adam_beta2 >= 1)
        return Status::invalid("adam_beta1 and adam_beta2 must be in [0, 1)");
    if (c.clip_grad < 0) return Status::invalid("clip_grad must be >= 0 (0 disables clipping)");
    if (c.lr_decay_style != "constant" && c.lr_decay_style != "linear" && c.lr_decay_style != "cosine")
        return Status::invalid("lr_decay_style must be constant, linear or cosine");
    std::unique_ptr<AdamWOptimizer> o(new AdamWOptimizer(params));
    o->m_beta1 = c.adam_beta1;
    o->m_beta2 = c.adam_beta2;
    o->m_eps = c.adam_eps;
    o->m_wd = c.weight_decay;
    o->m_clip = c.clip_grad;
    const size_t bytes = size_t(std::max<int64_t>(params.numel(), 1)) * sizeof(float);
    auto m = dev.allocate(bytes, MemCategory::OptimizerState);
    if (!m) return m.status().withContext("allocating Adam exp_avg");
    auto v = dev.allocate(bytes, MemCategory::OptimizerState);
    if (!v) return v.status().withContext("allocating Adam exp_avg_sq");
    o->m_m = std::move(m).value();
    o->m_v = std::move(v).value();
    std::memset(o->m_m->data(), 0, bytes);
    std::memset(o->m_v->data(), 0, bytes);
    return o;
}

void AdamWOptimizer::enqueueStep(Exec& exec, double lr, int iteration) {
    ++m_steps;
    const int64_t n = m_params.numel();
    float* grads = m_params.mainGrads();
    auto info = m_info;
    const double clip = m_clip;
    exec.setLayer(-1);
    exec.opStatus("optimizer.grad_norm", trace::Category::Optimizer, 2.0 * double(n), uint64_t(n) * 4, [=]() -> Status {
        const double norm = std::sqrt(k::sumSquares(grads, n));
        info->gradNorm = norm;
        info->lr = lr;
        info->clipped = false;
        if (!std::isfinite(norm))
            return Status::numerical("gradient norm is " + std::to_string(norm) + " at iteration " +
                                     std::to_string(iteration) + " (NaN/inf in the gradients)");
        if (clip > 0) {
            const double coef = clip / (norm + 1e-6);
            if (coef < 1.0) {
                k::scale(grads, float(coef), n);
                info->clipped = true;
            }
        }
        return Status::ok();
    });
    k::AdamParams base;
    base.lr = float(lr);
    base.beta1 = float(m_beta1);
    base.beta2 = float(m_beta2);
    base.eps = float(m_eps);
    base.step = m_steps;
    ParamBuffer* params = &m_params;
    float* mBuf = expAvg();
    float* vBuf = expAvgSq();
    const float wd = float(m_wd);
    exec.op("optimizer.adamw", trace::Category::Optimizer, 12.0 * double(n), uint64_t(n) * 20, [=] {
        for (int i = 0; i < params->count(); ++i) {
            const ParamInfo& p = params->info(i);
            k::AdamParams hp = base;
            hp.weightDecay = p.noWeightDecay ? 0.f : wd;
            k::adamwStep(params->mainParam(i), params->mainGrad(i), mBuf + p.offset, vBuf + p.offset, p.numel, hp);
        }
        params->syncModelParams();
    });
}

}  // namespace ts::engine
