// The promise behind a GPU's bf16 GEMMs (kern::Bf16GemmScope): every GEMM operand the engine
// hands a bf16 GEMM holds bf16 values, so the tensor cores' products are the CPU oracle's and
// only the fp32 summation order differs. kern::setCheckBf16Gemms makes the host backends look at
// every such operand; here:
//   - the check fails an op that breaks the promise, naming the operand, and passes one that
//     keeps it, on the CPU backend and on the emulated device (whose kernels run deferred);
//   - every trainer variant (tests/trainer_variants.h, what the CUDA trainer test runs) trains
//     with the check on, on both host backends: no GEMM of a bf16 model (FP8 ones included,
//     where their GEMMs take bf16 operands) sees a value bf16 would round.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/kernels.h"
#include "engine/train/trainer.h"
#include "kernels/cpu/ops.h"
#include "tests/trainer_backend_run.h"
#include "tests/trainer_variants.h"

namespace ts::engine {
namespace {

// The check on for a scope (what it was after).
class CheckBf16Gemms {
public:
    CheckBf16Gemms() : m_prev(kern::checkBf16Gemms()) { kern::setCheckBf16Gemms(true); }
    ~CheckBf16Gemms() { kern::setCheckBf16Gemms(m_prev); }

private:
    bool m_prev;
};

std::unique_ptr<Backend> backendOf(bool emulate) {
    return emulate ? makeEmulatedDeviceBackend(1) : makeCpuBackend(1);
}

// y = x W^T as an op under a bf16 GEMM scope on a fresh stream of `backend`; the stream's status.
Status linearUnderBf16Scope(bool emulate, const std::vector<float>& x, const std::vector<float>& W, int T, int in,
                            int out, bool scope) {
    auto backend = backendOf(emulate);
    if (!backend) return Status::internal("no backend");
    Device& dev = backend->device(0);
    auto stream = dev.createStream(trace::TrackKind::Compute, "compute");
    auto bx = dev.allocate(x.size() * sizeof(float), MemCategory::Activations);
    auto bw = dev.allocate(W.size() * sizeof(float), MemCategory::Params);
    auto by = dev.allocate(size_t(T) * out * sizeof(float), MemCategory::Activations);
    if (!bx.isOk() || !bw.isOk() || !by.isOk()) return Status::internal("allocation failed");
    float* px = static_cast<float*>((*bx)->data());
    float* pw = static_cast<float*>((*bw)->data());
    float* py = static_cast<float*>((*by)->data());
    TS_RETURN_IF_ERROR(kern::copyFromHost(*stream, px, x.data(), x.size() * sizeof(float)));
    TS_RETURN_IF_ERROR(kern::copyFromHost(*stream, pw, W.data(), W.size() * sizeof(float)));
    OpDesc d;
    d.name = "linear";
    d.category = trace::Category::Gemm;
    stream->submit(d, [=]() -> Status {
        kern::Bf16GemmScope gemms(scope);
        kern::linearForward(px, pw, nullptr, py, T, in, out);
        return Status::ok();
    });
    return stream->synchronize();
}

std::vector<float> values(int n, float step) {
    std::vector<float> v(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) v[size_t(i)] = step * float(i % 7 - 3);
    return v;
}

TEST(Bf16GemmCheck, FailsAGemmWhoseOperandBf16WouldRoundAndNamesIt) {
    CheckBf16Gemms on;
    const int T = 3, in = 4, out = 2;
    std::vector<float> x = values(T * in, 0.25f), W = values(out * in, 0.5f);
    for (bool emulate : {false, true}) {
        const std::string where = emulate ? "emulated device" : "CPU backend";
        EXPECT_TRUE(linearUnderBf16Scope(emulate, x, W, T, in, out, true).isOk()) << where << ": bf16 operands";
        std::vector<float> xBad = x;
        xBad[size_t(1 * in + 2)] = 1.0f + std::ldexp(1.0f, -12);  // 13 significant bits
        const Status s = linearUnderBf16Scope(emulate, xBad, W, T, in, out, true);
        ASSERT_FALSE(s.isOk()) << where;
        EXPECT_NE(s.message().find("linearForward"), std::string::npos) << where << ": " << s.toString();
        EXPECT_NE(s.message().find("operand x"), std::string::npos) << where << ": " << s.toString();
        EXPECT_NE(s.message().find("[0, 1, 2]"), std::string::npos) << where << ": " << s.toString();
        std::vector<float> wBad = W;
        wBad[0] = 0.1f;
        const Status sw = linearUnderBf16Scope(emulate, x, wBad, T, in, out, true);
        ASSERT_FALSE(sw.isOk()) << where;
        EXPECT_NE(sw.message().find("operand W"), std::string::npos) << where << ": " << sw.toString();
        // Outside a bf16 scope the GEMM is fp32 and any value is fine.
        EXPECT_TRUE(linearUnderBf16Scope(emulate, xBad, wBad, T, in, out, false).isOk()) << where;
    }
}

TEST(Bf16GemmCheck, EveryTrainerVariantKeepsItsBf16GemmOperandsBf16) {
    CheckBf16Gemms on;
    for (const auto& [name, edit] : ts::testing::trainerVariants()) {
        Config c = ts::testing::tinyTrainerConfig();
        edit(c);
        c.train_iters = 2;
        for (bool emulate : {false, true}) {
            SCOPED_TRACE(name + (emulate ? " (emulated device)" : " (CPU backend)"));
            TrainerOptions o;
            o.emulateDevice = emulate;
            const ts::testing::TrainRun r = ts::testing::trainRun(c, o);
            EXPECT_EQ(r.losses.size(), size_t(c.train_iters));
        }
    }
}

}  // namespace
}  // namespace ts::engine
