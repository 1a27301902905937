// The emulated device backend (engine/backend/emulated_backend.h): buffer pointers trap on the
// host, submit runs fn at once and kernels later in stream order, the kernel dispatch on it
// gives the CPU backend's bits, events order two streams, the in-process communicator works on
// its memory, and the allocator accounts like the CPU backend's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/cpu_backend.h"
#include "engine/backend/graph.h"
#include "engine/backend/kernels.h"
#include "engine/comm/inproc_communicator.h"
#include "engine/model/layers.h"
#include "tests/parallel/fake_recorder.h"

namespace ts::engine {
namespace {

namespace k = ts::engine::kern;

TensorPtr upload(Device& dev, const std::vector<float>& v) {
    auto r = dev.allocate(v.size() * sizeof(float), MemCategory::Activations);
    EXPECT_TRUE(r.isOk()) << r.status().toString();
    TensorPtr t(std::move(r).value());
    std::memcpy(hostAlias(t->data()), v.data(), v.size() * sizeof(float));  // identity on the CPU
    return t;
}

std::vector<float> download(const TensorPtr& t, size_t n) {
    std::vector<float> v(n);
    std::memcpy(v.data(), hostAlias(t->data()), n * sizeof(float));
    return v;
}

std::vector<float> ramp(size_t n, float scale, float offset) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = offset + scale * float((i * 37) % 101) / 101.0f;
    return v;
}

// Holds a stream's worker until release(): a communication-category op (queued whole, so it runs
// on the worker, in stream order) that waits on a future.
struct StreamGate {
    std::promise<void> open;
    void close(Stream& s) {
        OpDesc d;
        d.name = "test.gate";
        d.category = trace::Category::Collective;
        auto f = open.get_future().share();
        s.submit(d, [f] {
            f.wait();
            return Status::ok();
        });
    }
    void release() { open.set_value(); }
};

TEST(EmulatedDevice, BackendAndDeviceSayWhatTheyAre) {
    auto be = makeEmulatedDeviceBackend(2);
    EXPECT_EQ(be->kind(), BackendKind::EmulatedDevice);
    EXPECT_STREQ(backendName(be->kind()), "emulated");
    ASSERT_EQ(be->deviceCount(), 2);
    EXPECT_EQ(be->device(1).info().index, 1);
    EXPECT_EQ(be->device(1).info().backend, BackendKind::EmulatedDevice);
    EXPECT_EQ(be->device(0).info().name, "emulated:0");
}

TEST(EmulatedDevice, HostAliasMapsDeviceViewToHostViewAndLeavesOtherPointersAlone) {
    auto be = makeEmulatedDeviceBackend(1);
    auto r = be->device(0).allocate(4096, MemCategory::Params);
    ASSERT_TRUE(r.isOk()) << r.status().toString();
    TensorPtr b(std::move(r).value());
    float* dev = b->as<float>();
    EXPECT_TRUE(isEmulatedDevicePointer(dev));
    EXPECT_TRUE(isEmulatedDevicePointer(dev + 1000));  // interior pointers too
    float* host = static_cast<float*>(hostAlias(dev));
    EXPECT_NE(static_cast<void*>(host), static_cast<void*>(dev));
    EXPECT_FALSE(isEmulatedDevicePointer(host));
    EXPECT_TRUE(isEmulatedHostView(host));
    EXPECT_EQ(hostAlias(dev + 7), static_cast<void*>(host + 7));
    // Writing through the host view works and reads back through a second alias.
    host[7] = 42.0f;
    EXPECT_EQ(static_cast<float*>(hostAlias(dev))[7], 42.0f);
    EXPECT_EQ(host[0], 0.0f);  // allocate() zero-fills
    // Anything else is left alone.
    std::vector<float> v(4);
    EXPECT_EQ(hostAlias(v.data()), static_cast<void*>(v.data()));
    EXPECT_FALSE(isEmulatedDevicePointer(v.data()));
    EXPECT_EQ(hostAlias(nullptr), nullptr);
    auto cpu = makeCpuBackend(1);
    auto c = cpu->device(0).allocate(64, MemCategory::Params);
    ASSERT_TRUE(c.isOk());
    EXPECT_EQ(hostAlias((*c)->data()), (*c)->data());
}

TEST(EmulatedDeviceDeathTest, HostReadOfABufferPointerDiesWithSigsegv) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    EXPECT_EXIT(
        {
            auto be = makeEmulatedDeviceBackend(1);
            auto r = be->device(0).allocate(256, MemCategory::Activations);
            if (!r.isOk()) std::_Exit(3);
            volatile float v = (*r)->as<float>()[0];  // host code reading device memory
            (void)v;
            std::_Exit(0);
        },
        ::testing::KilledBySignal(SIGSEGV), "host code touched emulated device memory");
}

TEST(EmulatedDeviceDeathTest, HostWriteInsideAnOpDiesWithSigsegv) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    EXPECT_EXIT(
        {
            auto be = makeEmulatedDeviceBackend(1);
            Device& d = be->device(0);
            auto s = d.createStream(trace::TrackKind::Compute, "compute");
            auto r = d.allocate(256, MemCategory::Activations);
            if (!r.isOk()) std::_Exit(3);
            TensorPtr t(std::move(r).value());
            Exec ex(d, *s);
            ex.op("host_fill", trace::Category::Memset, 0, 0, [t] { std::memset(t->data(), 0, 256); });
            (void)ex.synchronize();
            std::_Exit(0);
        },
        ::testing::KilledBySignal(SIGSEGV), "host code touched emulated device memory");
}

TEST(EmulatedDevice, SubmitRunsFnNowAndItsKernelsLaterInStreamOrder) {
    auto be = makeEmulatedDeviceBackend(1);
    Device& d = be->device(0);
    auto s = d.createStream(trace::TrackKind::Compute, "compute");
    TensorPtr x = upload(d, {1.0f, 1.0f, 1.0f, 1.0f});
    StreamGate gate;
    gate.close(*s);  // nothing queued from here on runs before release()

    const std::thread::id caller = std::this_thread::get_id();
    std::thread::id fnThread;
    Exec ex(d, *s);
    ex.op("scale", trace::Category::Elementwise, 0, 0, [x] { k::scale(x->as<float>(), 3.0f, 4); });
    float seenAtSubmit = -1;
    ex.op("read", trace::Category::Other, 0, 0, [x, &seenAtSubmit, &fnThread] {
        fnThread = std::this_thread::get_id();
        EXPECT_TRUE(k::onDevice());
        seenAtSubmit = static_cast<float*>(hostAlias(x->data()))[0];  // host peeks at the host view
    });
    EXPECT_EQ(fnThread, caller);   // fn ran at submit, on the submitting thread
    EXPECT_EQ(seenAtSubmit, 1.0f);  // before the kernel the earlier op queued
    gate.release();
    ASSERT_TRUE(ex.synchronize().isOk());
    EXPECT_EQ(download(x, 4), std::vector<float>(4, 3.0f));
}

// The same ops through Exec::op on both backends: linear, LayerNorm, a value-returning op and a
// kernel using its value; bit-identical results.
struct SequenceResult {
    std::vector<float> y, z, mean, rstd;
    double sumSq = 0;
    float amax = 0;
};

SequenceResult runSequence(Backend& be) {
    constexpr int T = 6, in = 16, out = 24;
    Device& d = be.device(0);
    auto s = d.createStream(trace::TrackKind::Compute, "compute");
    Exec ex(d, *s);
    TensorPtr x = upload(d, ramp(size_t(T) * in, 2.0f, -1.0f));
    TensorPtr W = upload(d, ramp(size_t(out) * in, 0.5f, -0.25f));
    TensorPtr b = upload(d, ramp(out, 0.1f, 0.0f));
    TensorPtr lw = upload(d, ramp(out, 0.2f, 0.9f));
    TensorPtr lb = upload(d, ramp(out, 0.1f, -0.05f));
    auto alloc = [&](size_t n) {
        auto r = ex.alloc(int64_t(n));
        EXPECT_TRUE(r.isOk());
        return std::move(r).value();
    };
    TensorPtr y = alloc(size_t(T) * out), z = alloc(size_t(T) * out), mean = alloc(T), rstd = alloc(T);
    SequenceResult res;
    ex.op("linear", trace::Category::Gemm, 0, 0, [=] { k::linearForward(fp(x), fp(W), fp(b), fp(y), T, in, out); });
    ex.op("layernorm", trace::Category::Norm, 0, 0,
          [=] { k::layerNormForward(fp(y), fp(lw), fp(lb), fp(z), fp(mean), fp(rstd), T, out, 1e-5f); });
    ex.op("norms", trace::Category::Optimizer, 0, 0, [=, &res] {
        res.sumSq = k::sumSquares(fp(z), int64_t(T) * out);
        res.amax = k::amaxOf(fp(y), int64_t(T) * out);
        k::scale(fp(z), float(1.0 / std::sqrt(res.sumSq)), int64_t(T) * out);  // uses the value
    });
    EXPECT_TRUE(ex.synchronize().isOk());
    res.y = download(y, size_t(T) * out);
    res.z = download(z, size_t(T) * out);
    res.mean = download(mean, T);
    res.rstd = download(rstd, T);
    return res;
}

void expectBitIdentical(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    for (size_t i = 0; i < a.size(); ++i)
        ASSERT_EQ(std::memcmp(&a[i], &b[i], sizeof(float)), 0) << what << "[" << i << "]: " << a[i] << " vs " << b[i];
}

TEST(EmulatedDevice, KernelDispatchGivesTheCpuBackendsBits) {
    auto cpu = makeCpuBackend(1);
    auto emu = makeEmulatedDeviceBackend(1);
    const SequenceResult c = runSequence(*cpu);
    const SequenceResult e = runSequence(*emu);
    expectBitIdentical(c.y, e.y, "linearForward y");
    expectBitIdentical(c.z, e.z, "layerNormForward+scale z");
    expectBitIdentical(c.mean, e.mean, "layerNorm mean");
    expectBitIdentical(c.rstd, e.rstd, "layerNorm rstd");
    EXPECT_EQ(c.sumSq, e.sumSq);
    EXPECT_GT(e.sumSq, 0.0);
    EXPECT_EQ(c.amax, e.amax);
}

TEST(EmulatedDevice, KernelOnHostMemoryFailsTheStreamNamingTheArgument) {
    auto be = makeEmulatedDeviceBackend(1);
    Device& d = be->device(0);
    auto s = d.createStream(trace::TrackKind::Compute, "compute");
    TensorPtr y = upload(d, {0, 0, 0, 0});
    std::vector<float> hostX = {1, 2, 3, 4};
    Exec ex(d, *s);
    ex.op("add_host", trace::Category::Elementwise, 0, 0, [y, &hostX] { k::add(hostX.data(), fp(y), fp(y), 4); });
    const Status st = ex.synchronize();
    ASSERT_FALSE(st.isOk());
    EXPECT_NE(st.message().find("kernel add: argument 'a'"), std::string::npos) << st.toString();
    EXPECT_NE(st.message().find("add_host"), std::string::npos) << st.toString();
    EXPECT_EQ(download(y, 4), std::vector<float>(4, 0.0f));  // the kernel was not queued
}

TEST(EmulatedDevice, FailedFnFailsTheStreamInOrderAndSkipsLaterFns) {
    auto be = makeEmulatedDeviceBackend(1);
    Device& d = be->device(0);
    auto s = d.createStream(trace::TrackKind::Compute, "compute");
    TensorPtr x = upload(d, {1, 1});
    auto before = d.createEvent();
    OpDesc od;
    od.name = "first";
    s->submit(od, [x] {
        k::scale(x->as<float>(), 2.0f, 2);
        return Status::ok();
    });
    s->record(*before);
    od.name = "broken";
    s->submit(od, [] { return Status::invalid("broken op"); });
    ASSERT_FALSE(s->synchronize().isOk());
    EXPECT_TRUE(eventStatus(*before).isOk());  // recorded before the failure, in stream order
    bool ran = false;
    od.name = "after";
    s->submit(od, [&ran] {
        ran = true;
        return Status::ok();
    });
    const Status st = s->synchronize();
    EXPECT_FALSE(ran);
    EXPECT_NE(st.message().find("broken op"), std::string::npos) << st.toString();
    EXPECT_EQ(download(x, 2), std::vector<float>(2, 2.0f));
}

TEST(EmulatedDevice, RecordAndWaitOrderKernelsOfTwoStreams) {
    auto be = makeEmulatedDeviceBackend(1);
    Device& d = be->device(0);
    auto a = d.createStream(trace::TrackKind::Compute, "compute");
    auto b = d.createStream(trace::TrackKind::Comm, "side");
    TensorPtr x = upload(d, {1, 1, 1});
    TensorPtr y = upload(d, {0, 0, 0});
    StreamGate gate;
    gate.close(*a);
    Exec ea(d, *a), eb(d, *b);
    ea.op("scale", trace::Category::Elementwise, 0, 0, [x] { k::scale(fp(x), 2.0f, 3); });
    auto e = d.createEvent();
    a->record(*e);
    b->wait(*e);
    eb.op("double", trace::Category::Elementwise, 0, 0, [x, y] { k::add(fp(x), fp(x), fp(y), 3); });
    gate.release();
    ASSERT_TRUE(b->synchronize().isOk());
    EXPECT_EQ(download(y, 3), std::vector<float>(3, 4.0f));  // read x after a's kernel (2 + 2)
    ASSERT_TRUE(a->synchronize().isOk());
}

// All-reduce over the in-process communicator between two devices, then a kernel in stream order.
std::vector<std::vector<float>> allReduceThenScale(Backend& be) {
    CommWorld world(2);
    std::vector<std::unique_ptr<Communicator>> comms;
    std::vector<std::unique_ptr<Stream>> streams;
    std::vector<TensorPtr> bufs;
    for (int r = 0; r < 2; ++r) {
        auto c = world.join("dp", {0, 1}, r);
        EXPECT_TRUE(c.isOk());
        comms.push_back(std::move(c).value());
        streams.push_back(be.device(r).createStream(trace::TrackKind::Compute, "compute"));
        bufs.push_back(upload(be.device(r), ramp(1000, 1.0f + float(r), float(r))));
    }
    for (int r = 0; r < 2; ++r) {
        comms[size_t(r)]->allReduce(*streams[size_t(r)], bufs[size_t(r)]->data(), bufs[size_t(r)]->data(), 1000,
                                    DType::F32, ReduceOp::Sum);
        Exec ex(be.device(r), *streams[size_t(r)]);
        TensorPtr t = bufs[size_t(r)];
        ex.op("scale", trace::Category::Elementwise, 0, 0, [t] { k::scale(fp(t), 0.5f, 1000); });
    }
    std::vector<std::vector<float>> out;
    for (int r = 0; r < 2; ++r) {
        EXPECT_TRUE(streams[size_t(r)]->synchronize().isOk());
        out.push_back(download(bufs[size_t(r)], 1000));
    }
    return out;
}

TEST(EmulatedDevice, InprocAllReduceBetweenTwoDevicesGivesTheCpuResult) {
    auto cpu = makeCpuBackend(2);
    auto emu = makeEmulatedDeviceBackend(2);
    const auto c = allReduceThenScale(*cpu);
    const auto e = allReduceThenScale(*emu);
    for (int r = 0; r < 2; ++r) expectBitIdentical(c[size_t(r)], e[size_t(r)], r ? "rank 1" : "rank 0");
    EXPECT_NE(c[0][5], 0.0f);
}

TEST(EmulatedDevice, AccountingMatchesTheCpuBackend) {
    auto be = makeEmulatedDeviceBackend(1);
    Device& d = be->device(0);
    void* first = nullptr;
    {
        auto a = d.allocateUninitialized(100000, MemCategory::Activations);
        ASSERT_TRUE(a.isOk());
        first = (*a)->data();
        EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % 256, 0u);
        std::memset(hostAlias(first), 0xAB, 100000);  // garbage a later allocate must clear
        EXPECT_EQ(d.memoryStats().current[size_t(MemCategory::Activations)], 100000);
        EXPECT_EQ(d.memoryStats().cached, 0);
    }
    MemoryStats st = d.memoryStats();
    EXPECT_EQ(st.currentTotal, 0);
    EXPECT_GE(st.cached, 100000);
    auto b = d.allocate(99000, MemCategory::Workspace);  // same size class: same block, zeroed
    ASSERT_TRUE(b.isOk());
    EXPECT_EQ((*b)->data(), first);
    const auto* bytes = static_cast<const uint8_t*>(hostAlias((*b)->data()));
    for (size_t i = 0; i < 99000; ++i) ASSERT_EQ(bytes[i], 0) << i;
    st = d.memoryStats();
    EXPECT_EQ(st.current[size_t(MemCategory::Workspace)], 99000);
    EXPECT_EQ(st.current[size_t(MemCategory::Activations)], 0);
    EXPECT_EQ(st.peak[size_t(MemCategory::Activations)], 100000);
    EXPECT_EQ(st.peakTotal, 100000);
    EXPECT_EQ(st.cached, 0);
    d.resetPeak();
    EXPECT_EQ(d.memoryStats().peakTotal, 99000);

    d.setMemoryLimit(1 << 20);
    auto big = d.allocate(900000, MemCategory::Activations);
    ASSERT_TRUE(big.isOk()) << big.status().toString();
    auto tooMuch = d.allocate(200000, MemCategory::Params);
    ASSERT_FALSE(tooMuch.isOk());
    EXPECT_EQ(tooMuch.status().code(), ErrorCode::OutOfMemory);
    EXPECT_NE(tooMuch.status().message().find("emulated:0"), std::string::npos);
    EXPECT_EQ(d.memoryStats().currentTotal, 999000);
}

TEST(EmulatedDevice, AFreedBlockIsReusedOnlyAfterTheWorkQueuedBeforeTheFree) {
    auto be = makeEmulatedDeviceBackend(1);
    Device& d = be->device(0);
    auto s = d.createStream(trace::TrackKind::Compute, "compute");
    StreamGate gate;
    gate.close(*s);
    void* freed = nullptr;
    {
        TensorPtr t = upload(d, std::vector<float>(1024, 1.0f));
        freed = t->data();
        Exec ex(d, *s);
        ex.op("scale", trace::Category::Elementwise, 0, 0, [t] { k::scale(fp(t), 2.0f, 1024); });
    }  // last host reference gone while the kernel is still queued
    auto r = d.allocate(4096, MemCategory::Activations);
    ASSERT_TRUE(r.isOk());
    EXPECT_NE((*r)->data(), freed);  // the queued kernel still owns that block
    gate.release();
    ASSERT_TRUE(s->synchronize().isOk());
    auto again = d.allocate(4096, MemCategory::Activations);
    ASSERT_TRUE(again.isOk());
    EXPECT_EQ((*again)->data(), freed);
    EXPECT_EQ(static_cast<float*>(hostAlias((*again)->data()))[3], 0.0f);  // zeroed after the kernel ran
}

TEST(EmulatedDevice, OpsAppearOnTheStreamTrackWhenTheyExecute) {
    auto be = makeEmulatedDeviceBackend(1);
    Device& d = be->device(0);
    test::FakeRecorder rec;
    d.setTrace(&rec, 3);
    auto s = d.createStream(trace::TrackKind::Compute, "compute");
    TensorPtr x = upload(d, {1, 2, 3, 4});
    Exec ex(d, *s);
    ex.op("scale_op", trace::Category::Elementwise, 10, 16, [x] { k::scale(fp(x), 2.0f, 4); });
    ASSERT_TRUE(ex.synchronize().isOk());
    d.setTrace(nullptr, 0);
    const trace::Slice* launch = nullptr;
    const trace::Slice* exec = nullptr;
    for (const auto& sl : rec.slices) {
        if (rec.str(sl.name) != "scale_op") continue;
        (sl.category == trace::Category::Launch ? launch : exec) = &sl;
    }
    ASSERT_NE(launch, nullptr);
    ASSERT_NE(exec, nullptr);
    EXPECT_EQ(exec->category, trace::Category::Elementwise);
    EXPECT_EQ(exec->correlation, launch->correlation);
    EXPECT_EQ(exec->flops, 10.0);
    EXPECT_EQ(rec.trackDesc(exec->track).kind, trace::TrackKind::Compute);
    EXPECT_EQ(rec.trackDesc(exec->track).rank, 3);
    EXPECT_GE(exec->startNs, launch->startNs);
}

// ----- stream graphs (graph.h) ------------------------------------------------------------

TEST(EmulatedDeviceGraph, CaptureRunsHostCodeOnceAndEachLaunchRunsTheKernelsAgain) {
    auto be = makeEmulatedDeviceBackend(1);
    Device& d = be->device(0);
    auto s = d.createStream(trace::TrackKind::Compute, "compute");
    TensorPtr x = upload(d, {1.0f, 2.0f, 3.0f, 4.0f});
    Exec ex(d, *s);
    int hostRuns = 0;
    ASSERT_TRUE(beginCapture(*s).isOk());
    EXPECT_TRUE(isCapturing(*s));
    ex.op("scale", trace::Category::Elementwise, 0, 0, [x, &hostRuns] {
        ++hostRuns;
        k::scale(fp(x), 2.0f, 4);
    });
    ex.op("add", trace::Category::Elementwise, 0, 0, [x] { k::addInPlace(fp(x), fp(x), 2); });
    auto g = endCapture(*s);
    ASSERT_TRUE(g.isOk()) << g.status().toString();
    EXPECT_FALSE(isCapturing(*s));
    EXPECT_EQ((*g)->nodes(), 2);
    ASSERT_TRUE(ex.synchronize().isOk());
    EXPECT_EQ(download(x, 4), (std::vector<float>{1, 2, 3, 4}));  // captured, not run
    ASSERT_TRUE((*g)->launch(*s, 7).isOk());
    ASSERT_TRUE(ex.synchronize().isOk());
    EXPECT_EQ(download(x, 4), (std::vector<float>{4, 8, 6, 8}));
    ASSERT_TRUE((*g)->launch(*s, 8).isOk());
    ASSERT_TRUE(ex.synchronize().isOk());
    EXPECT_EQ(download(x, 4), (std::vector<float>{16, 32, 12, 16}));
    EXPECT_EQ(hostRuns, 1);  // the host code ran at capture only
    // Work after the capture runs at once again.
    ex.op("scale", trace::Category::Elementwise, 0, 0, [x] { k::scale(fp(x), 0.5f, 4); });
    ASSERT_TRUE(ex.synchronize().isOk());
    EXPECT_EQ(download(x, 4), (std::vector<float>{8, 16, 6, 8}));
}

TEST(EmulatedDeviceGraph, AHostWaitOrAnEventFailsTheCaptureNamingTheOp) {
    auto be = makeEmulatedDeviceBackend(1);
    Device& d = be->device(0);
    auto s = d.createStream(trace::TrackKind::Compute, "compute");
    TensorPtr x = upload(d, {3.0f, 4.0f});
    Exec ex(d, *s);
    ASSERT_TRUE(beginCapture(*s).isOk());
    ex.op("norm_read", trace::Category::Optimizer, 0, 0, [x] { (void)k::sumSquares(fp(x), 2); });
    auto g = endCapture(*s);
    ASSERT_FALSE(g.isOk());
    EXPECT_NE(g.status().message().find("host waited"), std::string::npos) << g.status().toString();
    EXPECT_NE(g.status().message().find("norm_read"), std::string::npos) << g.status().toString();
    // The stream is usable afterwards: not capturing, not failed.
    double sumSq = 0;
    ex.op("norm_read", trace::Category::Optimizer, 0, 0, [x, &sumSq] { sumSq = k::sumSquares(fp(x), 2); });
    ASSERT_TRUE(ex.synchronize().isOk());
    EXPECT_EQ(sumSq, 25.0);

    ASSERT_TRUE(beginCapture(*s).isOk());
    auto e = d.createEvent();
    s->record(*e);
    auto g2 = endCapture(*s);
    ASSERT_FALSE(g2.isOk());
    EXPECT_NE(g2.status().message().find("record()"), std::string::npos) << g2.status().toString();

    // An upload from host memory: a graph would copy the captured bytes at every launch.
    ASSERT_TRUE(beginCapture(*s).isOk());
    auto hostData = std::make_shared<std::vector<float>>(2, 7.0f);
    ex.op("upload", trace::Category::Memcpy, 0, 8, [x, hostData] { k::copyBytes(x->data(), hostData->data(), 8); });
    auto g3 = endCapture(*s);
    ASSERT_FALSE(g3.isOk());
    EXPECT_NE(g3.status().message().find("copyBytes from host memory"), std::string::npos) << g3.status().toString();
    EXPECT_NE(g3.status().message().find("'upload'"), std::string::npos) << g3.status().toString();
    ASSERT_TRUE(beginCapture(*s).isOk());
    ex.op("readback", trace::Category::Memcpy, 0, 8, [x, hostData] { k::copyBytes(hostData->data(), x->data(), 8); });
    auto g4 = endCapture(*s);
    ASSERT_FALSE(g4.isOk());
    EXPECT_NE(g4.status().message().find("copyBytes into host memory"), std::string::npos) << g4.status().toString();

    // One graph per device at a time.
    ASSERT_TRUE(beginCapture(*s).isOk());
    auto first = endCapture(*s);
    ASSERT_TRUE(first.isOk()) << first.status().toString();
    const Status second = beginCapture(*s);
    EXPECT_EQ(second.code(), ErrorCode::InvalidArgument);
    EXPECT_NE(second.message().find("another graph"), std::string::npos) << second.toString();
    first->reset();

    ASSERT_TRUE(beginCapture(*s).isOk());
    auto other = d.createStream(trace::TrackKind::Compute, "second");
    const Status twice = beginCapture(*other);
    EXPECT_EQ(twice.code(), ErrorCode::InvalidArgument);
    EXPECT_NE(twice.message().find("already capturing"), std::string::npos) << twice.toString();
    EXPECT_TRUE(endCapture(*s).isOk());
}

TEST(EmulatedDeviceGraph, TheGraphKeepsItsBlocksCountedAndZeroesWhatItAllocated) {
    auto be = makeEmulatedDeviceBackend(1);
    Device& d = be->device(0);
    auto s = d.createStream(trace::TrackKind::Compute, "compute");
    Exec ex(d, *s);
    constexpr int n = 4096;
    TensorPtr ones = upload(d, std::vector<float>(n, 1.0f));
    auto before = d.allocate(n * sizeof(float), MemCategory::Workspace);  // alive into the capture
    ASSERT_TRUE(before.isOk());
    TensorPtr early(std::move(before).value());
    void* earlyAddr = early->data();
    const auto live = [&] { return d.memoryStats().currentTotal; };
    const int64_t base = live();

    ASSERT_TRUE(beginCapture(*s).isOk());
    auto r = ex.alloc(n);  // zeroed: by a recorded memset when the graph runs
    ASSERT_TRUE(r.isOk());
    TensorPtr acc = *r;
    void* tempAddr = nullptr;
    {
        auto t = ex.alloc(n, MemCategory::Workspace);
        ASSERT_TRUE(t.isOk());
        TensorPtr tmp = *t;
        tempAddr = tmp->data();
        ex.op("tmp", trace::Category::Elementwise, 0, 0, [tmp, ones] { k::addInPlace(fp(tmp), fp(ones), n); });
        ex.op("acc", trace::Category::Elementwise, 0, 0, [acc, tmp, early] {
            k::addInPlace(fp(acc), fp(tmp), n);
            k::addInPlace(fp(early), fp(tmp), n);
        });
    }  // tmp freed inside the capture: the graph keeps its block
    auto g = endCapture(*s);
    ASSERT_TRUE(g.isOk()) << g.status().toString();
    EXPECT_EQ(live(), base + 2 * int64_t(n) * 4);  // acc, and tmp's block held by the graph
    EXPECT_EQ((*g)->poolBytes(), 2 * int64_t(n) * 4);
    early.reset();  // alive during the capture: the graph keeps its block too
    EXPECT_EQ(live(), base + 2 * int64_t(n) * 4);
    EXPECT_EQ((*g)->poolBytes(), 3 * int64_t(n) * 4);
    for (int i = 0; i < 3; ++i) {
        auto other = d.allocate(n * sizeof(float), MemCategory::Activations);
        ASSERT_TRUE(other.isOk());
        EXPECT_NE((*other)->data(), tempAddr) << "a block the graph uses was handed out again";
        EXPECT_NE((*other)->data(), earlyAddr) << "a block the graph uses was handed out again";
        ASSERT_TRUE((*g)->launch(*s, i).isOk());
        ASSERT_TRUE(ex.synchronize().isOk());
        // Zeroed by each launch, then tmp (zeroed too) added: 1 every time, not 1, 2, 3.
        EXPECT_EQ(download(acc, n), std::vector<float>(n, 1.0f)) << "launch " << i;
    }
    g->reset();  // the graph goes: its blocks are the device's again
    EXPECT_EQ(live(), base);  // ones and acc: early's and tmp's blocks are no longer counted
    std::vector<void*> got;
    std::vector<TensorPtr> keep;
    for (int i = 0; i < 4; ++i) {
        auto b = d.allocate(n * sizeof(float), MemCategory::Activations);
        ASSERT_TRUE(b.isOk());
        got.push_back((*b)->data());
        keep.emplace_back(std::move(b).value());
    }
    EXPECT_NE(std::find(got.begin(), got.end(), tempAddr), got.end()) << "the graph's block was not given back";
}

TEST(EmulatedDeviceGraph, AnotherThreadsAllocationDuringACaptureIsNotTheGraphs) {
    auto be = makeEmulatedDeviceBackend(1);
    Device& d = be->device(0);
    auto s = d.createStream(trace::TrackKind::Compute, "compute");
    constexpr size_t bytes = 8192;
    {
        auto dirty = d.allocateUninitialized(bytes, MemCategory::Workspace);
        ASSERT_TRUE(dirty.isOk());
        std::memset(hostAlias((*dirty)->data()), 0xAB, bytes);
    }  // back in the cache, dirty
    ASSERT_TRUE(s->synchronize().isOk());
    ASSERT_TRUE(beginCapture(*s).isOk());
    TensorPtr other;
    std::thread([&] {
        auto r = d.allocate(bytes, MemCategory::Workspace);
        ASSERT_TRUE(r.isOk());
        other = TensorPtr(std::move(r).value());
    }).join();
    auto g = endCapture(*s);
    ASSERT_TRUE(g.isOk()) << g.status().toString();
    EXPECT_EQ((*g)->nodes(), 0) << "the other thread's zero fill was recorded into the graph";
    const auto* b = static_cast<const uint8_t*>(hostAlias(other->data()));
    for (size_t i = 0; i < bytes; ++i) ASSERT_EQ(b[i], 0) << "not zeroed at allocation, byte " << i;
}

TEST(EmulatedDeviceGraph, CpuStreamsCannotBeCaptured) {
    auto be = makeCpuBackend(1);
    auto s = be->device(0).createStream(trace::TrackKind::Compute, "compute");
    const Status st = beginCapture(*s);
    EXPECT_EQ(st.code(), ErrorCode::Unsupported);
    EXPECT_NE(st.message().find("cuda_graph_impl"), std::string::npos) << st.toString();
    EXPECT_FALSE(isCapturing(*s));
}

}  // namespace
}  // namespace ts::engine
