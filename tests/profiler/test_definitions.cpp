// The two sets of definitions (profiler/analysis.h Definitions): each rule on a small
// constructed trace, rows in -> numbers out, in both sets where they differ.
#include <gtest/gtest.h>

#include <map>

#include "profiler/analysis.h"
#include "trace_builder.h"

using namespace ts;
using namespace ts::profiler;
using ts::profiler::testing::TraceBuilder;
using trace::Category;
using trace::TrackKind;

namespace {
const Definitions kOurs = Definitions::trainscope();
const Definitions kHta = Definitions::hta();

// Marks the store as an imported trace with its time origin (the analyses read both).
void imported(TraceBuilder& b, int64_t originNs = 0) {
    b.writer->metadata("import.source", "kineto");
    b.writer->metadata("import.time_origin_unix_ns", std::to_string(originNs));
}
}  // namespace

TEST(Definitions, ByName) {
    EXPECT_EQ(definitionsByName("hta")->set, Definitions::Set::Hta);
    EXPECT_EQ(definitionsByName("trainscope")->set, Definitions::Set::Trainscope);
    EXPECT_EQ(definitionsByName("default")->set, Definitions::Set::Trainscope);
    EXPECT_FALSE(definitionsByName("pytorch").isOk());
}

// HTA 0.5.0's kernel types (hta/common/types.py patterns) on names that tell them apart.
TEST(Definitions, HtaKernelClasses) {
    EXPECT_EQ(htaKernelClass("ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)"), KernelClass::Communication);
    EXPECT_EQ(htaKernelClass("rcclKernel_x"), KernelClass::Compute);  // HTA 0.5: ^nccl only
    EXPECT_EQ(htaKernelClass("Memcpy HtoD (Pinned -> Device)"), KernelClass::NonCompute);
    EXPECT_EQ(htaKernelClass("dma_copy_in"), KernelClass::NonCompute);
    EXPECT_EQ(htaKernelClass("Stream Sync"), KernelClass::NonCompute);
    EXPECT_EQ(htaKernelClass("Stream Wait Event"), KernelClass::Compute);  // no "Sync" in it (HTA 0.5)
    EXPECT_TRUE(isGpuWaitName("Stream Wait Event"));                      // ours: a wait
    EXPECT_EQ(htaKernelClass("my_kernel_with_dmabuf"), KernelClass::NonCompute);  // (.*dma)
    EXPECT_EQ(htaKernelClass("Cijk_Alik_Bljk_SB_Bias_AS_SAV"), KernelClass::Compute);
    EXPECT_EQ(htaKernelClass("triton_poi_fused_add_cos_sin_0"), KernelClass::Compute);
}

// Rule 3: cuda_sync rows on a stream ("Stream Sync") are non-compute time in the temporal
// breakdown in both sets (HTA counts .*Sync as non-compute), never compute.
TEST(Definitions, SyncRowsAreNonCompute) {
    for (const Definitions& defs : {kOurs, kHta}) {
        SCOPED_TRACE(defs.name());
        TraceBuilder b;
        imported(b);
        auto g = b.track(0, TrackKind::Compute, 7);
        b.put(g, Category::Gemm, 0, 1000, "gemm_kernel");
        b.put(g, Category::Other, 1000, 2000, "Stream Sync");
        b.put(g, Category::Gemm, 3000, 4000, "gemm_kernel");
        auto t = temporalBreakdown(b.done(), 0, defs);
        ASSERT_TRUE(t.isOk()) << t.status().toString();
        EXPECT_DOUBLE_EQ(t->kernelTimeNs, 4000);
        EXPECT_DOUBLE_EQ(t->computeNs, 2000);
        EXPECT_DOUBLE_EQ(t->nonComputeNs, 1000);
        EXPECT_DOUBLE_EQ(t->idleNs, 1000);
        auto k = kernelBreakdown(*b.store, 0, 10, INT64_MIN, INT64_MAX, defs);
        ASSERT_TRUE(k.isOk());
        std::map<std::string, int64_t> classes;
        for (const auto& c : k->byClass) classes[c.name] = c.count;
        EXPECT_EQ(classes, (std::map<std::string, int64_t>{{"compute", 2}, {"wait", 1}}));
    }
}

// Rule 6: the idle breakdown takes kernels only: a sync row does not split a gap, and an
// overlapping consecutive kernel is skipped (ours) or summed as a negative gap (HTA).
TEST(Definitions, IdleBreakdownGapsAndOverlaps) {
    auto build = [](TraceBuilder& b) {
        imported(b);
        auto h = b.track(0, TrackKind::HostThread, 0);
        auto g = b.track(0, TrackKind::Compute, 7);
        // Launches long before their kernels (no host wait); kernels from T: a [0, 1) us, a sync
        // row [2, 3), b [10, 12), c [11, 13) (c overlaps b by 1 us; whole us, so HTA's rounding
        // changes nothing).
        const int64_t T = 1000000;
        for (int c = 1; c <= 3; ++c) b.put(h, Category::Launch, c * 10, c * 10 + 5, "cudaLaunchKernel", "", uint64_t(c));
        b.put(g, Category::Gemm, T, T + 1000, "a", "", 1);
        b.put(g, Category::Other, T + 2000, T + 3000, "Stream Sync");
        b.put(g, Category::Gemm, T + 10000, T + 12000, "b", "", 2);
        b.put(g, Category::Gemm, T + 11000, T + 13000, "c", "", 3);
    };
    {
        TraceBuilder b;
        build(b);
        auto r = idleBreakdown(b.done(), 0, INT64_MIN, INT64_MAX, kOurs);
        ASSERT_TRUE(r.isOk()) << r.status().toString();
        EXPECT_DOUBLE_EQ(r->kernelWaitNs, 9000);  // a ends at 1 us, b starts at 10 us: 9 us < 30 us
        EXPECT_DOUBLE_EQ(r->otherNs, 0);
        EXPECT_DOUBLE_EQ(r->hostWaitNs, 0);
    }
    {
        TraceBuilder b;
        build(b);
        auto r = idleBreakdown(b.done(), 0, INT64_MIN, INT64_MAX, kHta);
        ASSERT_TRUE(r.isOk()) << r.status().toString();
        EXPECT_DOUBLE_EQ(r->kernelWaitNs, 9000 - 1000);  // c starts 1 us before b ends
    }
}

// Rule 2 and 4: the last-step cut-off. Two host steps; the GPU-side copy of the last step
// starts later than its host range. Ours cuts at the host start, HTA at the later copy.
// With a single step nothing is dropped in either set.
TEST(Definitions, LastStepCutOff) {
    auto build = [](TraceBuilder& b, bool twoSteps) {
        imported(b);
        auto h = b.track(0, TrackKind::HostThread, 0);
        auto g = b.track(0, TrackKind::Compute, 7);
        b.putStep(h, 1, 0, 100000);
        if (twoSteps) b.putStep(h, 2, 100000, 200000);
        // GPU-side copy of the last step, on the stream: starts at 150 us.
        auto& copy = b.add(g, Category::Range, twoSteps ? 150000 : 50000, 250000,
                           twoSteps ? "ProfilerStep#2" : "ProfilerStep#1");
        copy.step = twoSteps ? 2 : 1;
        b.commitLast();
        b.put(h, Category::Launch, 10000, 11000, "cudaLaunchKernel", "", 1);
        b.put(h, Category::Launch, 120000, 121000, "cudaLaunchKernel", "", 2);  // in the last host step
        b.put(h, Category::Launch, 170000, 171000, "cudaLaunchKernel", "", 3);  // after the GPU copy began
        b.put(g, Category::Gemm, 20000, 30000, "k1", "", 1);
        b.put(g, Category::Gemm, 160000, 170000, "k2", "", 2);
        b.put(g, Category::Gemm, 180000, 190000, "k3", "", 3);
    };
    struct Case {
        bool twoSteps;
        Definitions defs;
        double kernelTimeNs;
    } cases[] = {
        {true, kOurs, 10000},           // k1 only
        {true, kHta, 170000 - 20000},   // k1, k2 (launched before the GPU copy started at 150 us)
        {false, kOurs, 190000 - 20000}, // one step: everything
        {false, kHta, 190000 - 20000},
    };
    for (const auto& c : cases) {
        SCOPED_TRACE(std::string(c.defs.name()) + (c.twoSteps ? " two steps" : " one step"));
        TraceBuilder b;
        build(b, c.twoSteps);
        auto t = temporalBreakdown(b.done(), 0, c.defs);
        ASSERT_TRUE(t.isOk()) << t.status().toString();
        EXPECT_DOUBLE_EQ(t->kernelTimeNs, c.kernelTimeNs);
        // Rule 7: the kernel breakdown sees the same kernels.
        auto k = kernelBreakdown(*b.store, 0, 10, INT64_MIN, INT64_MAX, c.defs);
        ASSERT_TRUE(k.isOk()) << k.status().toString();
        int64_t count = 0;
        for (const auto& s : k->byCategory) count += s.count;
        EXPECT_EQ(count, c.kernelTimeNs == 10000 ? 1 : c.kernelTimeNs == 150000 ? 2 : 3);
        ASSERT_EQ(k->byClass.size(), 1u);
        EXPECT_EQ(k->byClass[0].name, "compute");
        EXPECT_EQ(k->byClass[0].count, count);
    }
}

// Rule 5: a host op that names a GPU stream (Triton cpu_op with args.stream) is never a
// kernel in our set; HTA counts it as GPU time (its temporal breakdown takes every event
// with a stream).
TEST(Definitions, HostOpsWithStream) {
    for (const Definitions& defs : {kOurs, kHta}) {
        SCOPED_TRACE(defs.name());
        TraceBuilder b;
        imported(b);
        auto h = b.track(0, TrackKind::HostThread, 0);
        auto g = b.track(0, TrackKind::Compute, 7);
        b.put(h, Category::Other, 0, 95000, "triton_poi_fused_add_0", "stream 0");
        b.put(g, Category::Elementwise, 90000, 92000, "triton_poi_fused_add_0", "", 5);
        auto t = temporalBreakdown(b.done(), 0, defs);
        ASSERT_TRUE(t.isOk()) << t.status().toString();
        EXPECT_DOUBLE_EQ(t->kernelTimeNs, defs.set == Definitions::Set::Hta ? 95000 : 2000);
        EXPECT_DOUBLE_EQ(t->computePct, 100);
        // Never in the idle breakdown (HTA's takes GPU activity categories only).
        auto idle = idleBreakdown(*b.store, 0, INT64_MIN, INT64_MAX, defs);
        ASSERT_TRUE(idle.isOk());
        EXPECT_DOUBLE_EQ(idle->idleNs(), 0);
    }
}

// Rule 1: HTA rounds each event inward to whole us on the trace's absolute clock (start up,
// end down); ours keeps ns. Origin 1 234 567 890 123 456 700 ns: stored 0 = ...700 ns.
TEST(Definitions, InwardMicrosecondRounding) {
    const int64_t origin = 1234567890123456700;
    auto build = [&](TraceBuilder& b) {
        imported(b, origin);
        auto g = b.track(0, TrackKind::Compute, 7);
        b.put(g, Category::Gemm, 0, 2500, "a");          // abs ...456.700 .. 459.200 us -> 457 .. 459
        b.put(g, Category::Memcpy, 2500, 3100, "Memcpy HtoD");  // 459.2 .. 459.8 -> empty
        b.put(g, Category::Gemm, 4000, 5600, "b");       // 460.7 .. 462.3 -> 461 .. 462
    };
    {
        TraceBuilder b;
        build(b);
        auto t = temporalBreakdown(b.done(), 0, kOurs);
        ASSERT_TRUE(t.isOk());
        EXPECT_DOUBLE_EQ(t->kernelTimeNs, 5600);
        EXPECT_DOUBLE_EQ(t->computeNs, 2500 + 1600);
        EXPECT_DOUBLE_EQ(t->nonComputeNs, 600);
    }
    {
        TraceBuilder b;
        build(b);
        auto t = temporalBreakdown(b.done(), 0, kHta);
        ASSERT_TRUE(t.isOk());
        EXPECT_DOUBLE_EQ(t->kernelTimeNs, 462000 - 457000);
        EXPECT_DOUBLE_EQ(t->computeNs, 2000 + 1000);
        EXPECT_DOUBLE_EQ(t->nonComputeNs, 0);
    }
}

// Rule 8: allocator counters are never added together; engine categories are.
TEST(Definitions, MemoryAllocatedAndReservedSeparately) {
    TraceBuilder b;
    imported(b);
    b.track(0, TrackKind::HostThread, 0);
    auto counter = [&](const char* name, int64_t ts, double v) {
        trace::Counter c;
        c.rank = 0;
        c.name = b.writer->intern(name);
        c.tsNs = ts;
        c.value = v;
        b.writer->counter(c);
    };
    counter("memory.allocated", 0, 100);
    counter("memory.reserved", 0, 300);
    counter("memory.allocated", 10, 250);
    counter("memory.reserved", 10, 400);
    counter("memory.allocated", 20, 50);
    auto m = memorySummary(b.done(), 0);
    ASSERT_TRUE(m.isOk()) << m.status().toString();
    EXPECT_DOUBLE_EQ(m->peakTotalBytes, 250);
    ASSERT_TRUE(m->peakAllocatedBytes && m->peakReservedBytes);
    EXPECT_DOUBLE_EQ(*m->peakAllocatedBytes, 250);
    EXPECT_DOUBLE_EQ(*m->peakReservedBytes, 400);
    EXPECT_NE(m->measure.find("allocated"), std::string::npos);

    TraceBuilder e;
    e.track(0, TrackKind::HostThread, 0);
    for (auto [name, v] : {std::pair{"memory.params", 10.0}, {"memory.grads", 20.0}}) {
        trace::Counter c;
        c.name = e.writer->intern(name);
        c.tsNs = 5;
        c.value = v;
        e.writer->counter(c);
    }
    auto m2 = memorySummary(e.done(), 0);
    ASSERT_TRUE(m2.isOk());
    EXPECT_DOUBLE_EQ(m2->peakTotalBytes, 30);
    EXPECT_FALSE(m2->peakAllocatedBytes.has_value());
}

// Rule 9: no FLOPs -> MFU and throughput are null with a reason, never 0.
TEST(Definitions, MfuUnknownWithoutFlops) {
    TraceBuilder b;
    imported(b);
    auto h = b.track(0, TrackKind::HostThread, 0);
    auto g = b.track(0, TrackKind::Compute, 7);
    b.putStep(h, 1, 0, 1000);
    b.put(g, Category::Gemm, 0, 500, "gemm");
    b.writer->metadata("device_name", "NVIDIA H100 80GB HBM3");
    AnalyzeOptions opt;
    opt.criticalPath = false;
    auto doc = analyzeRun(b.done(), opt);
    ASSERT_TRUE(doc.isOk()) << doc.status().toString();
    const auto& s = (*doc)["steps"][0];
    EXPECT_TRUE(s["mfu"].is_null());
    EXPECT_TRUE(s["model_tflops"].is_null());
    EXPECT_NE(s["mfu_unknown_reason"].get<std::string>().find("no FLOPs"), std::string::npos);
    EXPECT_TRUE((*doc)["ranks"][0]["memory"]["peak_memory_bytes"].is_null());
    std::string text = formatAnalysisText(*doc);
    EXPECT_NE(text.find("MFU unknown (no FLOPs"), std::string::npos) << text;
}
