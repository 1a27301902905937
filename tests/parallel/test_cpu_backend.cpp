// CPU backend: stream ordering, events across streams/devices, failure propagation, memory
// accounting and limits, and the trace hooks (checked with an in-memory recorder).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/backend_trace.h"
#include "engine/backend/cpu_backend.h"
#include "tests/parallel/fake_recorder.h"

using namespace ts;
using namespace ts::engine;
using namespace std::chrono_literals;

namespace {

OpDesc op(const char* name) {
    OpDesc d;
    d.name = name;
    return d;
}

}  // namespace

TEST(CpuBackend, DevicesAreVirtualAndNamed) {
    auto be = makeCpuBackend(3);
    ASSERT_EQ(be->deviceCount(), 3);
    EXPECT_EQ(be->kind(), BackendKind::Cpu);
    EXPECT_EQ(be->device(2).info().index, 2);
    EXPECT_EQ(be->device(2).info().name, "cpu:2 (virtual)");
    EXPECT_TRUE(be->device(0).supports("matmul"));
}

TEST(CpuBackend, StreamRunsInSubmissionOrderOnItsOwnThread) {
    auto be = makeCpuBackend(1);
    auto s = be->device(0).createStream(trace::TrackKind::Compute, "compute");
    std::vector<int> order;
    std::vector<std::thread::id> threads;
    for (int i = 0; i < 500; ++i)
        s->submit(op("append"), [&, i] {
            order.push_back(i);  // only the stream thread touches it
            threads.push_back(std::this_thread::get_id());
            return Status::ok();
        });
    ASSERT_TRUE(s->synchronize().isOk());
    ASSERT_EQ(order.size(), 500u);
    for (int i = 0; i < 500; ++i) EXPECT_EQ(order[size_t(i)], i);
    for (auto& t : threads) EXPECT_EQ(t, threads.front());
    EXPECT_NE(threads.front(), std::this_thread::get_id());
}

TEST(CpuBackend, SubmitDoesNotWaitForTheWork) {
    auto be = makeCpuBackend(1);
    auto s = be->device(0).createStream(trace::TrackKind::Compute, "compute");
    std::promise<void> release;
    auto released = release.get_future().share();
    std::atomic<bool> ran{false};
    s->submit(op("blocked"), [&] {
        released.wait();
        ran = true;
        return Status::ok();
    });
    // We got here while the op is blocked: submit is asynchronous.
    EXPECT_FALSE(ran.load());
    release.set_value();
    ASSERT_TRUE(s->synchronize().isOk());
    EXPECT_TRUE(ran.load());
}

// keepUntilPassed: what earlier work uses through raw pointers lives until the stream has run
// that work, then goes at once, in the stream's order (also on a failed stream), untraced.
TEST(CpuBackend, KeepUntilPassedHoldsUntilTheEarlierWorkRan) {
    test::FakeRecorder rec;
    auto be = makeCpuBackend(1);
    Device& d = be->device(0);
    d.setTrace(&rec, 0);
    auto s = d.createStream(trace::TrackKind::Compute, "compute");
    auto buf = d.allocate(4096, MemCategory::Activations);
    ASSERT_TRUE(buf.isOk());
    std::shared_ptr<Buffer> owned(std::move(*buf));
    std::weak_ptr<Buffer> watch = owned;
    std::promise<void> release;
    auto released = release.get_future().share();
    s->submit(op("collective"), [&, p = owned->data()] {
        released.wait();
        static_cast<char*>(p)[0] = 1;  // the raw pointer is still good
        return Status::ok();
    });
    s->keepUntilPassed(std::move(owned));
    std::atomic<bool> afterSawItFreed{false};
    s->submit(op("later"), [&] {
        afterSawItFreed = watch.expired();
        return Status::ok();
    });
    std::this_thread::sleep_for(20ms);
    EXPECT_FALSE(watch.expired()) << "freed before the work that uses it ran";
    EXPECT_EQ(d.memoryStats().current[size_t(MemCategory::Activations)], 4096);
    release.set_value();
    ASSERT_TRUE(s->synchronize().isOk());
    EXPECT_TRUE(afterSawItFreed.load()) << "not freed before the stream's next item";
    EXPECT_EQ(d.memoryStats().current[size_t(MemCategory::Activations)], 0);
    ASSERT_FALSE(rec.slices.empty());
    for (const trace::Slice& sl : rec.slices)  // the two ops' launches and runs, nothing else
        EXPECT_TRUE(rec.str(sl.name) == "collective" || rec.str(sl.name) == "later") << rec.str(sl.name);

    // A failed stream skips work but still lets go of what it kept.
    auto t = d.createStream(trace::TrackKind::Compute, "failing");
    auto other = d.allocate(64, MemCategory::Activations);
    ASSERT_TRUE(other.isOk());
    std::shared_ptr<Buffer> kept(std::move(*other));
    std::weak_ptr<Buffer> keptWatch = kept;
    t->submit(op("fails"), [] { return Status::internal("broken"); });
    t->keepUntilPassed(std::move(kept));
    EXPECT_FALSE(t->synchronize().isOk());
    EXPECT_TRUE(keptWatch.expired());
}

TEST(CpuBackend, EventOrdersWorkAcrossDevices) {
    auto be = makeCpuBackend(2);
    auto a = be->device(0).createStream(trace::TrackKind::Compute, "compute");
    auto b = be->device(1).createStream(trace::TrackKind::Comm, "comm");
    auto e = be->device(0).createEvent();
    for (int rep = 0; rep < 20; ++rep) {
        std::atomic<int> produced{0};
        int seen = -1;
        a->submit(op("produce"), [&] {
            std::this_thread::sleep_for(2ms);
            produced = 7;
            return Status::ok();
        });
        a->record(*e);
        b->wait(*e);
        b->submit(op("consume"), [&] {
            seen = produced.load();
            return Status::ok();
        });
        ASSERT_TRUE(b->synchronize().isOk());
        EXPECT_EQ(seen, 7) << "rep " << rep;
        EXPECT_TRUE(e->query());
    }
}

TEST(CpuBackend, WaitUsesTheLatestRecordAtWaitTime) {
    auto be = makeCpuBackend(1);
    auto a = be->device(0).createStream(trace::TrackKind::Compute, "a");
    auto b = be->device(0).createStream(trace::TrackKind::Compute, "b");
    auto e = be->device(0).createEvent();
    // Never recorded: wait is a no-op (CUDA semantics), so b runs.
    bool ran = false;
    b->wait(*e);
    b->submit(op("x"), [&] { ran = true; return Status::ok(); });
    ASSERT_TRUE(b->synchronize().isOk());
    EXPECT_TRUE(ran);

    std::promise<void> gate1, gate2;
    auto g1 = gate1.get_future().share();
    auto g2 = gate2.get_future().share();
    std::atomic<int> stage{0};
    a->submit(op("first"), [&] { g1.wait(); stage = 1; return Status::ok(); });
    a->record(*e);
    a->submit(op("second"), [&] { g2.wait(); stage = 2; return Status::ok(); });
    a->record(*e);
    int seen = -1;
    b->wait(*e);  // must wait for the second record
    b->submit(op("read"), [&] { seen = stage.load(); return Status::ok(); });
    EXPECT_FALSE(e->query());
    gate1.set_value();
    std::this_thread::sleep_for(10ms);
    EXPECT_EQ(seen, -1);
    gate2.set_value();
    ASSERT_TRUE(b->synchronize().isOk());
    EXPECT_EQ(seen, 2);
    e->synchronize();
    EXPECT_TRUE(e->query());
}

TEST(CpuBackend, FailedOpSkipsLaterWorkAndSynchronizeReturnsIt) {
    auto be = makeCpuBackend(1);
    auto s = be->device(0).createStream(trace::TrackKind::Compute, "compute");
    int ran = 0;
    s->submit(op("ok"), [&] { ++ran; return Status::ok(); });
    s->submit(op("linear_fc1.fwd"), [&] { return Status::numerical("NaN in output"); });
    s->submit(op("later"), [&] { ++ran; return Status::ok(); });
    Status st = s->synchronize();
    EXPECT_EQ(st.code(), ErrorCode::NumericalError);
    EXPECT_NE(st.message().find("NaN in output"), std::string::npos);
    EXPECT_NE(st.message().find("linear_fc1.fwd"), std::string::npos);
    EXPECT_NE(st.message().find("compute"), std::string::npos);
    EXPECT_EQ(ran, 1);
    // Sticky: later work is skipped too and the first error is kept.
    s->submit(op("after"), [&] { ++ran; return Status::internal("other"); });
    EXPECT_EQ(s->synchronize().code(), ErrorCode::NumericalError);
    EXPECT_EQ(ran, 1);
}

TEST(CpuBackend, ExceptionBecomesInternalError) {
    auto be = makeCpuBackend(1);
    auto s = be->device(0).createStream(trace::TrackKind::Compute, "compute");
    s->submit(op("throws"), []() -> Status { throw std::runtime_error("boom"); });
    Status st = s->synchronize();
    EXPECT_EQ(st.code(), ErrorCode::Internal);
    EXPECT_NE(st.message().find("boom"), std::string::npos);
}

TEST(CpuBackend, FailurePropagatesThroughEvents) {
    auto be = makeCpuBackend(2);
    auto a = be->device(0).createStream(trace::TrackKind::Compute, "compute");
    auto b = be->device(1).createStream(trace::TrackKind::Compute, "compute");
    auto e = be->device(0).createEvent();
    bool consumerRan = false;
    a->submit(op("bad"), [] { return Status::comm("peer 3 failed"); });
    a->record(*e);
    b->wait(*e);
    b->submit(op("consumer"), [&] { consumerRan = true; return Status::ok(); });
    Status sb = b->synchronize();
    EXPECT_EQ(sb.code(), ErrorCode::CommError);
    EXPECT_NE(sb.message().find("peer 3 failed"), std::string::npos);
    EXPECT_FALSE(consumerRan);
    EXPECT_EQ(eventStatus(*e).code(), ErrorCode::CommError);
    EXPECT_EQ(a->synchronize().code(), ErrorCode::CommError);
}

TEST(CpuBackend, MemoryAccountingPerCategoryWithPeaks) {
    auto be = makeCpuBackend(2);
    Device& d = be->device(1);
    {
        auto p = d.allocate(1000, MemCategory::Params);
        ASSERT_TRUE(p.isOk());
        auto g = d.allocate(3000, MemCategory::Grads);
        ASSERT_TRUE(g.isOk());
        {
            auto act = d.allocate(5000, MemCategory::Activations);
            ASSERT_TRUE(act.isOk());
            // Zero-initialized and 64-byte aligned.
            const auto* bytes = (*act)->as<uint8_t>();
            for (size_t i = 0; i < 5000; ++i) ASSERT_EQ(bytes[i], 0) << i;
            EXPECT_EQ(reinterpret_cast<uintptr_t>((*act)->data()) % 64, 0u);
            EXPECT_EQ((*act)->bytes(), 5000u);
            EXPECT_EQ((*act)->category(), MemCategory::Activations);
            EXPECT_EQ(&(*act)->device(), &d);
            MemoryStats m = d.memoryStats();
            EXPECT_EQ(m.current[size_t(MemCategory::Activations)], 5000);
            EXPECT_EQ(m.currentTotal, 9000);
        }
        MemoryStats m = d.memoryStats();
        EXPECT_EQ(m.current[size_t(MemCategory::Params)], 1000);
        EXPECT_EQ(m.current[size_t(MemCategory::Grads)], 3000);
        EXPECT_EQ(m.current[size_t(MemCategory::Activations)], 0);
        EXPECT_EQ(m.peak[size_t(MemCategory::Activations)], 5000);
        EXPECT_EQ(m.currentTotal, 4000);
        EXPECT_EQ(m.peakTotal, 9000);
        d.resetPeak();
        m = d.memoryStats();
        EXPECT_EQ(m.peak[size_t(MemCategory::Activations)], 0);
        EXPECT_EQ(m.peakTotal, 4000);
    }
    EXPECT_EQ(d.memoryStats().currentTotal, 0);
    EXPECT_EQ(be->device(0).memoryStats().peakTotal, 0);  // devices are independent
}

TEST(CpuBackend, MemoryLimitGivesOutOfMemoryNamingEverything) {
    auto be = makeCpuBackend(2);
    Device& d = be->device(1);
    d.setMemoryLimit(10000);
    auto a = d.allocate(6000, MemCategory::Params);
    ASSERT_TRUE(a.isOk());
    auto b = d.allocate(5000, MemCategory::Activations);
    ASSERT_FALSE(b.isOk());
    EXPECT_EQ(b.status().code(), ErrorCode::OutOfMemory);
    const std::string& msg = b.status().message();
    EXPECT_NE(msg.find("cpu:1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("activations"), std::string::npos) << msg;
    EXPECT_NE(msg.find("5000 bytes"), std::string::npos) << msg;
    EXPECT_NE(msg.find("9.77 KiB"), std::string::npos) << msg;  // 10000 B limit
    // The failed request is not accounted; what fits still fits.
    EXPECT_EQ(d.memoryStats().currentTotal, 6000);
    EXPECT_TRUE(d.allocate(4000, MemCategory::Activations).isOk());
    d.setMemoryLimit(0);
    EXPECT_TRUE(d.allocate(1 << 20, MemCategory::Workspace).isOk());
}

TEST(CpuBackend, TraceRecordsLaunchAndExecutionWithCorrelation) {
    test::FakeRecorder rec;
    auto be = makeCpuBackend(1);
    Device& d = be->device(0);
    d.setTrace(&rec, 3);
    auto s = d.createStream(trace::TrackKind::Comm, "comm dp");
    OpDesc desc;
    desc.name = "all_reduce";
    desc.category = trace::Category::Collective;
    desc.flops = 12.5;
    desc.bytes = 4096;
    desc.group = "dp";
    desc.step = 2;
    desc.microbatch = 1;
    desc.chunk = 0;
    desc.layer = 5;
    s->submit(desc, [] {
        std::this_thread::sleep_for(1ms);
        return Status::ok();
    });
    ASSERT_TRUE(s->synchronize().isOk());

    ASSERT_EQ(rec.slices.size(), 2u);
    const trace::Slice* launch = nullptr;
    const trace::Slice* exec = nullptr;
    for (auto& sl : rec.slices) (sl.category == trace::Category::Launch ? launch : exec) = &sl;
    ASSERT_TRUE(launch && exec);
    const auto& hostTrack = rec.trackDesc(launch->track);
    const auto& streamTrack = rec.trackDesc(exec->track);
    EXPECT_EQ(hostTrack.kind, trace::TrackKind::HostThread);
    EXPECT_EQ(hostTrack.name, "rank 3 host");
    EXPECT_EQ(hostTrack.rank, 3);
    EXPECT_EQ(streamTrack.kind, trace::TrackKind::Comm);
    EXPECT_EQ(streamTrack.name, "rank 3 comm dp");
    EXPECT_EQ(streamTrack.rank, 3);
    EXPECT_NE(launch->correlation, 0u);
    EXPECT_EQ(launch->correlation, exec->correlation);
    EXPECT_EQ(rec.str(exec->name), "all_reduce");
    EXPECT_EQ(rec.str(launch->name), "all_reduce");
    EXPECT_EQ(exec->category, trace::Category::Collective);
    EXPECT_EQ(rec.str(exec->group), "dp");
    EXPECT_DOUBLE_EQ(exec->flops, 12.5);
    EXPECT_EQ(exec->bytes, 4096u);
    EXPECT_EQ(exec->step, 2);
    EXPECT_EQ(exec->microbatch, 1);
    EXPECT_EQ(exec->chunk, 0);
    EXPECT_EQ(exec->layer, 5);
    EXPECT_GE(exec->durNs, 1'000'000);
    EXPECT_LE(launch->startNs, exec->startNs);
}

TEST(CpuBackend, TraceOffRecordsNothingAndCorrelationsAreUnique) {
    test::FakeRecorder rec;
    auto be = makeCpuBackend(2);
    auto s0 = be->device(0).createStream(trace::TrackKind::Compute, "compute");
    s0->submit(op("untraced"), [] { return Status::ok(); });
    ASSERT_TRUE(s0->synchronize().isOk());
    EXPECT_TRUE(rec.slices.empty());
    EXPECT_TRUE(rec.tracks.empty());

    be->device(0).setTrace(&rec, 0);
    be->device(1).setTrace(&rec, 1);
    auto s1 = be->device(1).createStream(trace::TrackKind::Compute, "compute");
    for (int i = 0; i < 10; ++i) {
        s0->submit(op("k"), [] { return Status::ok(); });
        s1->submit(op("k"), [] { return Status::ok(); });
    }
    ASSERT_TRUE(s0->synchronize().isOk());
    ASSERT_TRUE(s1->synchronize().isOk());
    ASSERT_EQ(rec.slices.size(), 40u);
    std::map<uint64_t, int> perCorrelation;
    for (auto& sl : rec.slices) ++perCorrelation[sl.correlation];
    EXPECT_EQ(perCorrelation.size(), 20u);
    for (auto& [c, n] : perCorrelation) EXPECT_EQ(n, 2) << c;
    // One host track per (thread, rank), one track per stream.
    int hostTracks = 0;
    for (auto& t : rec.tracks) hostTracks += t.kind == trace::TrackKind::HostThread;
    EXPECT_EQ(hostTracks, 2);
    EXPECT_EQ(rec.tracks.size(), 4u);

    be->device(0).setTrace(nullptr, 0);
    const size_t before = rec.slices.size();
    s0->submit(op("off again"), [] { return Status::ok(); });
    ASSERT_TRUE(s0->synchronize().isOk());
    EXPECT_EQ(rec.slices.size(), before);
}

TEST(CpuBackend, RangesNestWithDepthOnTheHostTrack) {
    test::FakeRecorder rec;
    auto be = makeCpuBackend(1);
    Device& d = be->device(0);
    d.setTrace(&rec, 0);
    {
        RangeScope step(d, range::kStep, {.step = 4});
        {
            RangeScope mb(d, range::kMicrobatch, {.step = 4, .microbatch = 1});
            RangeScope fwd(d, range::kForward, {.step = 4, .microbatch = 1, .chunk = 0});
        }
        RangeScope mb2(d, range::kMicrobatch, {.step = 4, .microbatch = 2});
    }
    ASSERT_EQ(rec.slices.size(), 4u);
    std::map<std::string, std::vector<const trace::Slice*>> byName;
    for (auto& s : rec.slices) {
        EXPECT_EQ(s.category, trace::Category::Range);
        EXPECT_EQ(rec.trackDesc(s.track).kind, trace::TrackKind::HostThread);
        byName[rec.str(s.name)].push_back(&s);
    }
    const trace::Slice* st = byName["step"].at(0);
    const trace::Slice* fwd = byName["forward"].at(0);
    ASSERT_EQ(byName["microbatch"].size(), 2u);
    EXPECT_EQ(st->depth, 0);
    EXPECT_EQ(byName["microbatch"][0]->depth, 1);
    EXPECT_EQ(byName["microbatch"][1]->depth, 1);
    EXPECT_EQ(fwd->depth, 2);
    EXPECT_EQ(fwd->microbatch, 1);
    EXPECT_EQ(st->step, 4);
    // Children lie inside their parents.
    EXPECT_LE(st->startNs, fwd->startNs);
    EXPECT_GE(st->startNs + st->durNs, fwd->startNs + fwd->durNs);

    // No recorder: nothing recorded.
    d.setTrace(nullptr, 0);
    { RangeScope r(d, range::kStep); }
    EXPECT_EQ(rec.slices.size(), 4u);
}

TEST(CpuBackend, MemoryCountersGoToTheRecorder) {
    test::FakeRecorder rec;
    auto be = makeCpuBackend(1);
    be->device(0).setTrace(&rec, 5);
    {
        auto b = be->device(0).allocate(256, MemCategory::Grads);
        ASSERT_TRUE(b.isOk());
    }
    ASSERT_EQ(rec.counters.size(), 2u);
    EXPECT_EQ(rec.str(rec.counters[0].name), "memory.grads");
    EXPECT_EQ(rec.counters[0].rank, 5);
    EXPECT_EQ(rec.counters[0].value, 256);
    EXPECT_EQ(rec.counters[1].value, 0);
}
