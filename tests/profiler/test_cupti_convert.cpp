// CUPTI record -> trace rows (profiler/gpu_activity.h) on CPU with synthetic records: clock
// alignment math, correlation linking, kernel name demangling and NCCL classification, stream
// track kinds, NVTX range pairing, and the analyses on the written rows. Expected values are
// worked out by hand in the comments (mangled names come from g++ / c++filt).
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "profiler/analysis.h"
#include "profiler/gpu_activity.h"
#include "profiler/store.h"

namespace ts::profiler::gpu {
namespace {

using trace::Category;
using trace::TrackKind;

struct Row {
    trace::Slice s;
    std::string name;
    TrackRow track;
};

// An in-memory run file, a TraceWriter and a converter over it; rows() reads back what was stored.
struct Fixture {
    std::unique_ptr<TraceStore> store;
    std::unique_ptr<TraceWriter> writer;
    std::unique_ptr<ActivityConverter> conv;

    explicit Fixture(ActivityConverter::Options opt = {}) {
        auto s = TraceStore::create(":memory:");
        EXPECT_TRUE(s.isOk()) << s.status().toString();
        store = std::move(s).value();
        writer = std::make_unique<TraceWriter>(*store, 100);
        conv = std::make_unique<ActivityConverter>(*writer, opt);
    }
    void finish() {
        conv->finish();
        const Status st = writer->finish();
        EXPECT_TRUE(st.isOk()) << st.toString();
    }
    std::vector<Row> rows() {
        std::vector<Row> out;
        auto tracks = store->tracks();
        auto strings = store->strings();
        EXPECT_TRUE(tracks.isOk() && strings.isOk());
        std::map<uint32_t, TrackRow> byId;
        for (const auto& t : tracks.value()) byId[t.id] = t;
        const Status st = store->forEachSlice({}, [&](const trace::Slice& s) {
            out.push_back({s, strings.value()[s.name], byId[s.track]});
            return true;
        });
        EXPECT_TRUE(st.isOk()) << st.toString();
        return out;
    }
    std::vector<Row> named(const std::string& name) {
        std::vector<Row> out;
        for (auto& r : rows())
            if (r.name == name) out.push_back(r);
        return out;
    }
};

KernelRecord kernel(const std::string& name, uint32_t stream, uint64_t start, uint64_t end, uint32_t corr = 0,
                    uint32_t device = 0) {
    KernelRecord k;
    k.name = name;
    k.deviceId = device;
    k.streamId = stream;
    k.startNs = start;
    k.endNs = end;
    k.correlationId = corr;
    k.grid = {128, 1, 1};
    k.block = {256, 1, 1};
    return k;
}

ApiRecord api(const std::string& name, uint32_t thread, uint64_t start, uint64_t end, uint32_t corr,
              bool driver = false) {
    ApiRecord a;
    a.name = name;
    a.threadId = thread;
    a.processId = 1;
    a.startNs = start;
    a.endNs = end;
    a.correlationId = corr;
    a.driver = driver;
    return a;
}

MarkerRecord marker(MarkerPhase phase, uint32_t id, uint64_t ts, uint32_t thread, const std::string& name = "") {
    MarkerRecord m;
    m.phase = phase;
    m.id = id;
    m.tsNs = ts;
    m.threadId = thread;
    m.processId = 1;
    m.name = name;
    return m;
}

// ---- clock alignment

TEST(CuptiConvert, ClockOffsetConstantWithOneSample) {
    // host 5'000'000 when the GPU clock read 1'000: offset +4'999'000.
    const ClockAlignment c = ClockAlignment::fromSample({5'000'000, 1'000, 10});
    EXPECT_EQ(c.toHost(1'000), 5'000'000);
    EXPECT_EQ(c.toHost(2'001'000), 7'000'000);
    EXPECT_DOUBLE_EQ(c.driftPpm(), 0.0);
}

TEST(CuptiConvert, ClockDriftIsInterpolatedLinearly) {
    // Offsets: 1000 at gpu=0 and 1000+50'000 at gpu=1e9: the host clock gained 50 us per second
    // of GPU time = 50 ppm.
    const ClockSample a{1'000, 0, 0};
    const ClockSample b{1'000'051'000, 1'000'000'000, 0};
    const ClockAlignment c = ClockAlignment::fromSamples(a, b);
    EXPECT_TRUE(c.twoPoint());
    EXPECT_NEAR(c.driftPpm(), 50.0, 1e-9);
    EXPECT_EQ(c.toHost(0), 1'000);
    EXPECT_EQ(c.toHost(1'000'000'000), 1'000'051'000);
    EXPECT_EQ(c.toHost(400'000'000), 400'000'000 + 1'000 + 20'000);     // 50'000 * 0.4
    EXPECT_EQ(c.toHost(2'000'000'000), 2'000'000'000 + 1'000 + 100'000);  // extended past the last sample
    // Degenerate span (same GPU time) falls back to the first sample's constant offset.
    const ClockAlignment d = ClockAlignment::fromSamples(a, ClockSample{9'999, 0, 0});
    EXPECT_FALSE(d.twoPoint());
    EXPECT_EQ(d.toHost(123), 1'123);
}

TEST(CuptiConvert, SampleClocksKeepsNarrowestBracket) {
    // host reads per round: (100,160) (200,210) (300,400); gpu reads 7, 8, 9.
    std::vector<int64_t> host = {100, 160, 200, 210, 300, 400};
    std::vector<int64_t> gpu = {7, 8, 9};
    size_t hi = 0, gi = 0;
    const ClockSample s = sampleClocks([&] { return host[hi++]; }, [&] { return gpu[gi++]; }, 3);
    EXPECT_EQ(s.gpuNs, 8);
    EXPECT_EQ(s.hostNs, 205);
    EXPECT_EQ(s.uncertaintyNs, 5);
    EXPECT_EQ(s.offsetNs(), 197);
}

// ---- names

TEST(CuptiConvert, DemanglesAndStripsApiVersions) {
    EXPECT_EQ(demangle("_Z24layernorm_forward_kernelPfPKfi"), "layernorm_forward_kernel(float*, float const*, int)");
    EXPECT_EQ(demangle("plain_c_kernel"), "plain_c_kernel");
    EXPECT_EQ(demangle("_Znot_really_mangled!"), "_Znot_really_mangled!");
    EXPECT_EQ(apiBaseName("cudaLaunchKernel_v7000"), "cudaLaunchKernel");
    EXPECT_EQ(apiBaseName("cuLaunchKernelEx"), "cuLaunchKernelEx");
    EXPECT_EQ(apiBaseName("cudaMemcpyAsync_v3020"), "cudaMemcpyAsync");
    EXPECT_EQ(apiBaseName("foo_vx1"), "foo_vx1");
    EXPECT_TRUE(isLaunchApi("cudaLaunchKernel"));
    EXPECT_TRUE(isLaunchApi("cuLaunchKernelEx"));
    EXPECT_TRUE(isLaunchApi("cudaMemsetAsync"));
    EXPECT_FALSE(isLaunchApi("cudaStreamSynchronize"));
}

TEST(CuptiConvert, CorrelationIdsAreDisjointFromEngineIds) {
    EXPECT_EQ(runCorrelation(0, 0), 0u);
    EXPECT_EQ(runCorrelation(0, 5), (uint64_t(1) << 62) + 5);
    EXPECT_EQ(runCorrelation(3, 5), (uint64_t(1) << 62) + (uint64_t(3) << 32) + 5);
    EXPECT_NE(runCorrelation(1, 7), runCorrelation(2, 7));
}

// ---- rows

TEST(CuptiConvert, LaunchAndKernelShareCorrelationAndAreClockAligned) {
    Fixture f({.rank = 2});
    f.conv->setClock(ClockAlignment::fromSample({1'000'000, 1'000, 0}));  // host = gpu + 999'000
    f.conv->add(api("cudaLaunchKernel_v7000", 77, 2'000, 2'500, 42));
    f.conv->add(kernel("_Z24layernorm_forward_kernelPfPKfi", 13, 3'000, 4'000, 42));
    f.conv->add(api("cudaStreamSynchronize_v3020", 77, 2'600, 4'100, 43));
    f.finish();

    auto launch = f.named("cudaLaunchKernel");
    auto k = f.named("layernorm_forward_kernel(float*, float const*, int)");
    auto sync = f.named("cudaStreamSynchronize");
    ASSERT_EQ(launch.size(), 1u);
    ASSERT_EQ(k.size(), 1u);
    ASSERT_EQ(sync.size(), 1u);
    EXPECT_EQ(launch[0].s.category, Category::Launch);
    EXPECT_EQ(sync[0].s.category, Category::Other);
    EXPECT_EQ(k[0].s.category, Category::Norm);
    EXPECT_EQ(launch[0].s.correlation, runCorrelation(2, 42));
    EXPECT_EQ(k[0].s.correlation, launch[0].s.correlation);
    EXPECT_NE(sync[0].s.correlation, k[0].s.correlation);
    EXPECT_EQ(launch[0].track.kind, TrackKind::HostThread);
    EXPECT_EQ(launch[0].track.rank, 2);
    EXPECT_EQ(sync[0].track.id, launch[0].track.id);  // same OS thread, same track
    EXPECT_EQ(k[0].track.kind, TrackKind::Compute);
    EXPECT_EQ(k[0].track.streamIndex, 13);
    EXPECT_EQ(k[0].track.rank, 2);
    EXPECT_EQ(launch[0].s.startNs, 1'001'000);
    EXPECT_EQ(launch[0].s.durNs, 500);
    EXPECT_EQ(k[0].s.startNs, 1'002'000);
    EXPECT_EQ(k[0].s.durNs, 1'000);
}

TEST(CuptiConvert, NcclKernelsInAllSpellingsGetCommTracks) {
    Fixture f;
    // NCCL >= 2.19 and <= 2.8 all-reduce on stream 20, NCCL 2.9-2.18 send/recv on stream 30.
    f.conv->add(kernel("_Z39ncclDevKernel_AllReduce_Sum_f32_RING_LL24ncclDevKernelArgsStorageILm4096EE", 20, 100, 200, 1));
    f.conv->add(kernel("_Z33ncclAllReduceRingLLKernel_sum_f3214CollectiveArgs", 20, 300, 400, 2));
    f.conv->add(kernel("_Z42ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_tP11ncclDevCommmP8ncclWork", 30, 100, 150, 3));
    f.conv->add(kernel("gemm_kernel", 7, 100, 400, 4));
    f.finish();
    auto newAr = f.named("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)");
    auto oldAr = f.named("ncclAllReduceRingLLKernel_sum_f32(CollectiveArgs)");
    auto sr = f.named("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)");
    auto gemm = f.named("gemm_kernel");
    ASSERT_EQ(newAr.size(), 1u);
    ASSERT_EQ(oldAr.size(), 1u);
    ASSERT_EQ(sr.size(), 1u);
    ASSERT_EQ(gemm.size(), 1u);
    EXPECT_EQ(newAr[0].s.category, Category::Collective);
    EXPECT_EQ(oldAr[0].s.category, Category::Collective);
    EXPECT_EQ(sr[0].s.category, Category::P2P);
    EXPECT_EQ(gemm[0].s.category, Category::Gemm);
    EXPECT_EQ(newAr[0].track.id, oldAr[0].track.id);
    EXPECT_EQ(newAr[0].track.kind, TrackKind::Comm);
    EXPECT_EQ(sr[0].track.kind, TrackKind::P2P);
    EXPECT_EQ(gemm[0].track.kind, TrackKind::Compute);
}

// One process running one rank per GPU: each device's work goes to its rank's tracks, and the
// engine's streams get the tracks the CPU backend would give them (kind and name as created,
// whatever the stream ran); an unnamed stream keeps the content rule. Correlation ids stay the
// process's (the API call and its kernel must agree, whichever GPU ran it).
TEST(CuptiConvert, DevicesMapToRanksAndEngineStreamsKeepTheirNames) {
    ActivityConverter::Options opt;
    opt.rank = 4;
    opt.rankOfDevice = {4, 5};
    Fixture f(opt);
    f.conv->nameStream(0, 13, TrackKind::Compute, "compute");
    f.conv->nameStream(0, 14, TrackKind::Comm, "dp_comm");
    f.conv->nameStream(1, 13, TrackKind::Compute, "compute");
    f.conv->add(kernel("gemm_a", 13, 100, 200, 1, 0));
    f.conv->add(kernel("reduce_grads", 14, 150, 250, 2, 0));  // not an NCCL name: the name given decides
    f.conv->add(kernel("gemm_b", 13, 100, 300, 3, 1));
    f.conv->add(kernel("gemm_c", 20, 100, 300, 4, 1));  // a stream the engine did not name
    f.conv->add(kernel("gemm_d", 21, 100, 300, 5, 2));  // a device past rankOfDevice
    f.conv->add(api("cudaLaunchKernel_v7000", 77, 90, 95, 3));
    f.finish();
    auto a = f.named("gemm_a"), r = f.named("reduce_grads"), b = f.named("gemm_b"), c = f.named("gemm_c"),
         d = f.named("gemm_d"), l = f.named("cudaLaunchKernel");
    ASSERT_EQ(a.size(), 1u);
    ASSERT_EQ(r.size(), 1u);
    ASSERT_EQ(b.size(), 1u);
    ASSERT_EQ(c.size(), 1u);
    ASSERT_EQ(d.size(), 1u);
    ASSERT_EQ(l.size(), 1u);
    EXPECT_EQ(a[0].track.name, "rank 4 compute");
    EXPECT_EQ(a[0].track.rank, 4);
    EXPECT_EQ(a[0].track.kind, TrackKind::Compute);
    EXPECT_EQ(r[0].track.name, "rank 4 dp_comm");
    EXPECT_EQ(r[0].track.kind, TrackKind::Comm);
    EXPECT_EQ(b[0].track.name, "rank 5 compute");
    EXPECT_EQ(b[0].track.rank, 5);
    EXPECT_EQ(b[0].track.device, 1);
    EXPECT_NE(a[0].track.id, b[0].track.id);
    EXPECT_EQ(c[0].track.rank, 5);
    EXPECT_EQ(c[0].track.name, "rank 5 gpu 1 stream 20 (compute)");
    EXPECT_EQ(d[0].track.rank, 4);
    EXPECT_EQ(l[0].track.rank, 4);
    EXPECT_EQ(l[0].s.correlation, b[0].s.correlation);
}

// Ranks sharing a GPU (cuda_share_gpus): rankOfDevice can name one rank per device, so each
// engine stream says which rank it works for, and its work goes to that rank's tracks.
TEST(CuptiConvert, StreamsOfRanksSharingAGpuGoToTheirOwnRanks) {
    ActivityConverter::Options opt;
    opt.rank = 0;
    opt.rankOfDevice = {2};  // the last rank placed on GPU 0
    Fixture f(opt);
    f.conv->nameStream(0, 13, TrackKind::Compute, "compute", 0);
    f.conv->nameStream(0, 14, TrackKind::Compute, "compute", 1);
    f.conv->nameStream(0, 15, TrackKind::Comm, "dp_comm", 2);
    f.conv->add(kernel("gemm_r0", 13, 100, 200, 1, 0));
    f.conv->add(kernel("gemm_r1", 14, 100, 200, 2, 0));
    f.conv->add(kernel("reduce_r2", 15, 100, 200, 3, 0));
    f.finish();
    auto r0 = f.named("gemm_r0"), r1 = f.named("gemm_r1"), r2 = f.named("reduce_r2");
    ASSERT_EQ(r0.size(), 1u);
    ASSERT_EQ(r1.size(), 1u);
    ASSERT_EQ(r2.size(), 1u);
    EXPECT_EQ(r0[0].track.name, "rank 0 compute");
    EXPECT_EQ(r0[0].track.rank, 0);
    EXPECT_EQ(r1[0].track.name, "rank 1 compute");
    EXPECT_EQ(r1[0].track.rank, 1);
    EXPECT_EQ(r2[0].track.name, "rank 2 dp_comm");
    EXPECT_EQ(r2[0].track.rank, 2);
    EXPECT_EQ(r0[0].track.device, 0);
    EXPECT_EQ(r1[0].track.device, 0);
}

TEST(CuptiConvert, OverlappingKernelsOnTwoStreamsGiveHtaOverlap) {
    Fixture f;
    // compute (stream 7): [0,100) [150,250); NCCL (stream 20): [50,200).
    // comm = 150; comm ∩ compute = [50,100) + [150,200) = 100 -> overlap 66.67 %.
    // Kernel window [0,250): compute 200, non-compute = comm not under compute = [100,150) = 50, idle 0.
    const uint64_t base = 1'000'000;
    f.conv->add(kernel("gemm_a", 7, base + 0, base + 100, 1));
    f.conv->add(kernel("gemm_b", 7, base + 150, base + 250, 2));
    f.conv->add(kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 20, base + 50,
                       base + 200, 3));
    f.finish();
    auto ov = commComputeOverlap(*f.store, 0);
    ASSERT_TRUE(ov.isOk()) << ov.status().toString();
    EXPECT_DOUBLE_EQ(ov.value().commNs, 150.0);
    EXPECT_DOUBLE_EQ(ov.value().overlappedNs, 100.0);
    EXPECT_NEAR(ov.value().pct, 100.0 * 100.0 / 150.0, 1e-9);
    auto tb = temporalBreakdown(*f.store, 0);
    ASSERT_TRUE(tb.isOk()) << tb.status().toString();
    EXPECT_DOUBLE_EQ(tb.value().kernelTimeNs, 250.0);
    EXPECT_DOUBLE_EQ(tb.value().computeNs, 200.0);
    EXPECT_DOUBLE_EQ(tb.value().nonComputeNs, 50.0);
    EXPECT_DOUBLE_EQ(tb.value().idleNs, 0.0);
}

TEST(CuptiConvert, IdleBreakdownSeesHostWaitThroughCorrelation) {
    Fixture f;
    // Stream 7: k1 [1000,1100), k2 [1200,1300) launched at host 1150 (after the gap began at 1100)
    // -> the 100 ns gap is host_wait.
    f.conv->add(api("cudaLaunchKernel_v7000", 5, 900, 950, 1));
    f.conv->add(api("cudaLaunchKernel_v7000", 5, 1150, 1160, 2));
    f.conv->add(kernel("k1", 7, 1000, 1100, 1));
    f.conv->add(kernel("k2", 7, 1200, 1300, 2));
    f.finish();
    auto idle = idleBreakdown(*f.store, 0);
    ASSERT_TRUE(idle.isOk()) << idle.status().toString();
    EXPECT_DOUBLE_EQ(idle.value().hostWaitNs, 100.0);
    EXPECT_DOUBLE_EQ(idle.value().otherNs, 0.0);
}

TEST(CuptiConvert, MemcpyAndMemsetRows) {
    Fixture f;
    MemcpyRecord c;
    c.startNs = 10;
    c.endNs = 30;
    c.streamId = 9;
    c.bytes = 4096;
    c.kind = MemcpyKind::HtoD;
    c.correlationId = 5;
    f.conv->add(c);
    MemsetRecord m;
    m.startNs = 40;
    m.endNs = 45;
    m.streamId = 9;
    m.bytes = 512;
    f.conv->add(m);
    f.finish();
    auto cp = f.named("Memcpy HtoD");
    auto ms = f.named("Memset");
    ASSERT_EQ(cp.size(), 1u);
    ASSERT_EQ(ms.size(), 1u);
    EXPECT_EQ(cp[0].s.category, Category::Memcpy);
    EXPECT_EQ(cp[0].s.bytes, 4096u);
    EXPECT_EQ(cp[0].s.durNs, 20);
    EXPECT_EQ(ms[0].s.category, Category::Memset);
    EXPECT_EQ(ms[0].s.bytes, 512u);
    EXPECT_EQ(cp[0].track.kind, TrackKind::Copy);  // a stream with copies only
    EXPECT_EQ(cp[0].track.id, ms[0].track.id);
}

TEST(CuptiConvert, NvtxRangesPairByIdAndNest) {
    Fixture f;
    f.conv->add(marker(MarkerPhase::Start, 1, 10'000, 7, "step 3"));
    f.conv->add(marker(MarkerPhase::Start, 2, 20'000, 7, "forward"));
    f.conv->add(api("cudaLaunchKernel_v7000", 7, 25'000, 26'000, 9));
    f.conv->add(marker(MarkerPhase::End, 2, 50'000, 7));
    f.conv->add(marker(MarkerPhase::Instant, 3, 60'000, 7, "checkpoint"));
    f.conv->add(marker(MarkerPhase::End, 1, 90'000, 7));
    f.conv->add(marker(MarkerPhase::End, 99, 95'000, 7));           // never started
    f.conv->add(marker(MarkerPhase::Start, 4, 96'000, 7, "open"));  // never ended
    f.conv->add(kernel("k", 3, 30'000, 40'000, 9));
    f.finish();
    auto step = f.named("step 3");
    auto fwd = f.named("forward");
    auto launch = f.named("cudaLaunchKernel");
    auto instant = f.named("checkpoint");
    ASSERT_EQ(step.size(), 1u);
    ASSERT_EQ(fwd.size(), 1u);
    ASSERT_EQ(launch.size(), 1u);
    ASSERT_EQ(instant.size(), 1u);
    EXPECT_EQ(step[0].s.category, Category::Range);
    EXPECT_EQ(step[0].s.startNs, 10'000);
    EXPECT_EQ(step[0].s.durNs, 80'000);
    EXPECT_EQ(step[0].s.depth, 0);
    EXPECT_EQ(fwd[0].s.durNs, 30'000);
    EXPECT_EQ(fwd[0].s.depth, 1);
    EXPECT_EQ(launch[0].s.depth, 2);
    EXPECT_EQ(instant[0].s.durNs, 0);
    EXPECT_EQ(instant[0].s.depth, 1);
    EXPECT_EQ(step[0].track.id, launch[0].track.id);
    EXPECT_TRUE(f.named("open").empty());
    EXPECT_EQ(f.conv->stats().unmatchedRangeEnds, 1);
    EXPECT_EQ(f.conv->stats().openRanges, 1);
    EXPECT_EQ(f.conv->stats().ranges, 2);
    // The analyses find the step from the range name.
    auto steps = stepWindows(*f.store);
    ASSERT_TRUE(steps.isOk()) << steps.status().toString();
    ASSERT_EQ(steps.value().size(), 1u);
    EXPECT_EQ(steps.value()[0].step, 3);
    EXPECT_EQ(steps.value()[0].startNs, 10'000);
    EXPECT_EQ(steps.value()[0].endNs, 90'000);
}

MemcpyRecord memcpyLater() {
    MemcpyRecord c;
    c.startNs = 300;
    c.endNs = 320;
    c.streamId = 3;
    c.bytes = 64;
    c.kind = MemcpyKind::DtoH;
    return c;
}

TEST(CuptiConvert, RangeSpanningFlushesAndBoundThreads) {
    Fixture f;
    const uint32_t engineHost = f.writer->track({0, 0, TrackKind::HostThread, 0, "rank 0 host"});
    f.conv->bindHostThread(7, engineHost);
    f.conv->add(marker(MarkerPhase::Start, 1, 100, 7, "microbatch 0"));
    f.conv->add(kernel("k", 3, 150, 160, 1));
    f.conv->flush();  // the range is still open: nothing of it is written yet
    f.conv->add(marker(MarkerPhase::End, 1, 200, 7));
    f.conv->add(memcpyLater());
    f.finish();
    auto mb = f.named("microbatch 0");
    ASSERT_EQ(mb.size(), 1u);
    EXPECT_EQ(mb[0].track.id, engineHost);
    EXPECT_EQ(mb[0].s.durNs, 100);
    // Stream 3's kind was decided at the first flush (kernel -> Compute); the later memcpy joins it.
    auto k = f.named("k");
    auto cp = f.named("Memcpy DtoH");
    ASSERT_EQ(k.size(), 1u);
    ASSERT_EQ(cp.size(), 1u);
    EXPECT_EQ(cp[0].track.id, k[0].track.id);
    EXPECT_EQ(k[0].track.kind, TrackKind::Compute);
}

TEST(CuptiConvert, DriverApiFilteredAndMalformedCounted) {
    Fixture f;
    f.conv->add(api("cuCtxGetCurrent", 7, 10, 11, 1, true));
    f.conv->add(api("cuLaunchKernelEx", 7, 20, 30, 2, true));
    f.conv->add(kernel("bad", 3, 500, 400, 3));  // end < start
    f.conv->add(kernel("zero", 3, 0, 10, 4));    // no timestamp
    f.conv->addDropped(17);
    f.finish();
    EXPECT_TRUE(f.named("cuCtxGetCurrent").empty());
    auto launch = f.named("cuLaunchKernelEx");
    ASSERT_EQ(launch.size(), 1u);
    EXPECT_EQ(launch[0].s.category, Category::Launch);
    EXPECT_EQ(launch[0].s.depth, 1);
    EXPECT_TRUE(f.named("bad").empty());
    EXPECT_TRUE(f.named("zero").empty());
    const auto& st = f.conv->stats();
    EXPECT_EQ(st.filteredDriverApi, 1);
    EXPECT_EQ(st.malformed, 2);
    EXPECT_EQ(st.kernels, 0);
    EXPECT_EQ(st.droppedByCupti, 17);
    // The counts and the clock reach the run metadata.
    auto meta = f.store->allMetadata();
    ASSERT_TRUE(meta.isOk());
    ASSERT_TRUE(meta.value().count("cupti.stats"));
    ASSERT_TRUE(meta.value().count("cupti.clock"));
    auto js = nlohmann::json::parse(meta.value()["cupti.stats"]);
    EXPECT_EQ(js["malformed"], 2);
    EXPECT_EQ(js["dropped_by_cupti"], 17);
    auto jc = nlohmann::json::parse(meta.value()["cupti.clock"]);
    EXPECT_TRUE(jc.contains("first"));
    EXPECT_TRUE(jc.contains("drift_ppm"));
}

}  // namespace
}  // namespace ts::profiler::gpu
