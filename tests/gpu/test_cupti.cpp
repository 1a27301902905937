// CUPTI capture on a real device: a LayerNorm and a cuBLAS linear inside NVTX ranges, with
// host<->device copies, recorded by profiler/cupti's collector into an in-memory run file.
// Checks kernels, copies (bytes), ranges, launch<->kernel correlation, that aligned GPU
// timestamps fall inside the host window that contained the work, and that the analyses run.
// Skips without a CUPTI+CUDA build or without a device.
#include <gtest/gtest.h>

#include "tests/gpu/gpu_test_util.h"

#if defined(TS_HAVE_CUPTI) && defined(TS_HAVE_CUDA)

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/nvtx.h"
#include "kernels/cuda/ops_cuda.h"
#include "profiler/analysis.h"
#include "profiler/cupti/cupti_collector.h"
#include "profiler/store.h"

namespace ts::profiler {
namespace {

namespace kc = ts::kernels::cuda;

struct Row {
    trace::Slice s;
    std::string name;
    trace::TrackKind kind;
};

TEST(Cupti, CapturesKernelsCopiesRangesAndCorrelation) {
    int count = 0;
    const Status ds = kc::deviceCount(&count);
    if (!ds.isOk() || count == 0)
        GTEST_SKIP() << "no CUDA device available (" << (ds.isOk() ? "0 devices" : ds.toString()) << ")";

    auto store = TraceStore::create(":memory:");
    ASSERT_TRUE(store.isOk()) << store.status().toString();
    TraceWriter writer(*store.value());

    const int T = 64, C = 256, OUT = 512;
    const size_t xBytes = sizeof(float) * T * C;
    std::vector<float> hx(T * C, 0.5f), hw(C, 1.0f), hb(C, 0.0f), hW(size_t(OUT) * C, 0.01f), hy(size_t(T) * OUT);
    void *dx = nullptr, *dw = nullptr, *db = nullptr, *dn = nullptr, *dmean = nullptr, *drstd = nullptr,
         *dW = nullptr, *dy = nullptr;
    // Allocate before capture so the window holds only the work under test.
    TS_ASSERT_OK(kc::deviceAlloc(&dx, xBytes));
    TS_ASSERT_OK(kc::deviceAlloc(&dw, sizeof(float) * C));
    TS_ASSERT_OK(kc::deviceAlloc(&db, sizeof(float) * C));
    TS_ASSERT_OK(kc::deviceAlloc(&dn, xBytes));
    TS_ASSERT_OK(kc::deviceAlloc(&dmean, sizeof(float) * T));
    TS_ASSERT_OK(kc::deviceAlloc(&drstd, sizeof(float) * T));
    TS_ASSERT_OK(kc::deviceAlloc(&dW, sizeof(float) * OUT * C));
    TS_ASSERT_OK(kc::deviceAlloc(&dy, sizeof(float) * T * OUT));
    // kernels/cuda makes its cuBLAS handle on the first GEMM: one untimed GEMM here keeps the handle's
    // creation out of the captured window.
    TS_ASSERT_OK(kc::linearForward(static_cast<float*>(dn), static_cast<float*>(dW), nullptr, static_cast<float*>(dy),
                                   T, C, OUT, nullptr));
    TS_ASSERT_OK(kc::streamSynchronize(nullptr));

    cupti::CuptiCollector::Options opt;
    opt.rank = 0;
    auto collector = cupti::CuptiCollector::start(writer, opt);
    ASSERT_TRUE(collector.isOk()) << collector.status().toString();
    const int64_t hostFrom = monotonicNs();
    {
        nvtx::ScopedRange step("step 0");
        TS_ASSERT_OK(kc::copyToDevice(dx, hx.data(), xBytes));
        TS_ASSERT_OK(kc::copyToDevice(dw, hw.data(), sizeof(float) * C));
        TS_ASSERT_OK(kc::copyToDevice(db, hb.data(), sizeof(float) * C));
        TS_ASSERT_OK(kc::copyToDevice(dW, hW.data(), sizeof(float) * OUT * C));
        {
            nvtx::ScopedRange fwd("forward");
            TS_ASSERT_OK(kc::layerNormForward(static_cast<float*>(dx), static_cast<float*>(dw),
                                              static_cast<float*>(db), static_cast<float*>(dn),
                                              static_cast<float*>(dmean), static_cast<float*>(drstd), T, C, 1e-5f,
                                              false, nullptr));
            TS_ASSERT_OK(kc::linearForward(static_cast<float*>(dn), static_cast<float*>(dW), nullptr,
                                           static_cast<float*>(dy), T, C, OUT, nullptr));
        }
        TS_ASSERT_OK(kc::streamSynchronize(nullptr));
        TS_ASSERT_OK(kc::copyToHost(hy.data(), dy, sizeof(float) * T * OUT));
    }
    const int64_t hostTo = monotonicNs();
    TS_ASSERT_OK(collector.value()->stop());
    const bool nvtxOn = collector.value()->nvtxCaptured();
    const auto stats = collector.value()->stats();
    collector.value().reset();
    TS_ASSERT_OK(writer.finish());
    for (void* p : {dx, dw, db, dn, dmean, drstd, dW, dy}) (void)kc::deviceFree(p);

    auto tracks = store.value()->tracks();
    auto strings = store.value()->strings();
    ASSERT_TRUE(tracks.isOk() && strings.isOk());
    std::map<uint32_t, trace::TrackKind> kindOf;
    for (const auto& t : tracks.value()) kindOf[t.id] = t.kind;
    std::vector<Row> rows;
    TS_ASSERT_OK(store.value()->forEachSlice({}, [&](const trace::Slice& s) {
        rows.push_back({s, strings.value()[s.name], kindOf[s.track]});
        return true;
    }));
    EXPECT_EQ(stats.malformed, 0);
    EXPECT_EQ(stats.droppedByCupti, 0);

    std::vector<Row> kernels, copies, host, ranges;
    for (const auto& r : rows) {
        if (r.kind == trace::TrackKind::HostThread) {
            (r.s.category == trace::Category::Range ? ranges : host).push_back(r);
        } else if (r.s.category == trace::Category::Memcpy) {
            copies.push_back(r);
        } else if (classify(r.s.category) == KernelClass::Compute ||
                   classify(r.s.category) == KernelClass::Communication) {
            kernels.push_back(r);
        }
    }
    ASSERT_GE(kernels.size(), 2u) << "layernorm + at least one cuBLAS kernel";
    EXPECT_TRUE(std::any_of(kernels.begin(), kernels.end(), [](const Row& r) { return r.s.category == trace::Category::Norm; }))
        << "the LayerNorm kernel is classified Norm";
    // Copies: 4 HtoD (x, w, b, W) and 1 DtoH (y), with their sizes.
    std::multiset<uint64_t> htod, dtoh;
    for (const auto& c : copies) (c.name == "Memcpy HtoD" ? htod : dtoh).insert(c.s.bytes);
    EXPECT_EQ(htod.count(xBytes), 1u);
    EXPECT_EQ(htod.count(sizeof(float) * OUT * C), 1u);
    EXPECT_EQ(dtoh.count(sizeof(float) * T * OUT), 1u);

    // Every kernel has a host launch with the same correlation, and starts after it was launched.
    std::map<uint64_t, const Row*> launchOf;
    for (const auto& h : host)
        if (h.s.correlation != 0 && h.s.category == trace::Category::Launch) launchOf[h.s.correlation] = &h;
    for (const auto& k : kernels) {
        ASSERT_NE(k.s.correlation, 0u) << k.name;
        auto it = launchOf.find(k.s.correlation);
        ASSERT_NE(it, launchOf.end()) << "no launch for " << k.name;
        // Clock alignment within a few microseconds: a kernel cannot start before its launch call.
        EXPECT_GE(k.s.startNs, it->second->s.startNs - 5'000) << k.name;
    }
    // Aligned timestamps lie in the host window that contained all the work (+-50 us slack).
    for (const auto& r : rows) {
        EXPECT_GE(r.s.startNs, hostFrom - 50'000) << r.name;
        EXPECT_LE(r.s.startNs + r.s.durNs, hostTo + 50'000) << r.name;
    }
    // NVTX ranges (the collector set NVTX_INJECTION64_PATH before this process's first NVTX call).
    EXPECT_TRUE(nvtxOn);
    std::map<std::string, Row> rangeByName;
    for (const auto& r : ranges) rangeByName[r.name] = r;
    ASSERT_TRUE(rangeByName.count("step 0")) << "NVTX range 'step 0' not captured";
    ASSERT_TRUE(rangeByName.count("forward"));
    const auto& st = rangeByName["step 0"].s;
    const auto& fw = rangeByName["forward"].s;
    EXPECT_LE(st.startNs, fw.startNs);
    EXPECT_GE(st.startNs + st.durNs, fw.startNs + fw.durNs);
    EXPECT_EQ(fw.depth, st.depth + 1);

    // The analyses run on the captured rows.
    auto ov = commComputeOverlap(*store.value(), 0);
    ASSERT_TRUE(ov.isOk()) << ov.status().toString();
    EXPECT_EQ(ov.value().commNs, 0.0);  // no NCCL here
    auto tb = temporalBreakdown(*store.value(), 0);
    ASSERT_TRUE(tb.isOk()) << tb.status().toString();
    EXPECT_GT(tb.value().computeNs, 0.0);
    auto kb = kernelBreakdown(*store.value(), 0);
    ASSERT_TRUE(kb.isOk()) << kb.status().toString();
    EXPECT_GT(kb.value().totalNs, 0.0);
    auto steps = stepWindows(*store.value());
    ASSERT_TRUE(steps.isOk()) << steps.status().toString();
    ASSERT_EQ(steps.value().size(), 1u);
    auto meta = store.value()->allMetadata();
    ASSERT_TRUE(meta.isOk());
    EXPECT_TRUE(meta.value().count("cupti.clock"));
}

}  // namespace
}  // namespace ts::profiler

#else  // !(TS_HAVE_CUPTI && TS_HAVE_CUDA)

TEST(Cupti, Skipped) { GTEST_SKIP() << "built without CUPTI/CUDA"; }

#endif
