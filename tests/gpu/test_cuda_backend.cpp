// The CUDA backend (engine/backend/cuda) and the NCCL communicator (engine/comm/nccl) on real
// GPUs: allocator accounting, limit, zero-fill and stream-ordered reuse; stream order and
// events across two streams; failure propagation (a failed fn, a kernel error reported through
// reportKernelError, an event of a failed stream); the host launch slices; the kernel dispatch
// (kernels.h) inside ops: launch on the op's stream, value readback, failed value ops; and every
// NCCL collective against the in-process communicator on the same inputs (one rank per device,
// up to 4; on one GPU a 1-rank group, which still runs every NCCL call and argument mapping).
// Skips (GTEST_SKIP with the reason) without a CUDA build or a device.
#include <gtest/gtest.h>

#include "tests/gpu/gpu_test_util.h"

#ifdef TS_HAVE_CUDA

#include <cuda_runtime.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/cuda/cuda_backend.h"
#include "engine/backend/kernels.h"
#include "engine/comm/inproc_communicator.h"
#include "kernels/cuda/ops_cuda.h"
#ifdef TS_HAVE_NCCL
#include "engine/comm/nccl/nccl_communicator.h"
#endif

namespace ts::engine {
namespace {

namespace kc = ts::kernels::cuda;
namespace kern = ts::engine::kern;

// Collects what a device records (slices and counters), thread-safe.
class TestRecorder final : public trace::Recorder {
public:
    uint32_t track(const trace::TrackDesc& d) override {
        std::lock_guard<std::mutex> lock(m);
        tracks.push_back(d);
        return uint32_t(tracks.size());
    }
    uint32_t intern(std::string_view text) override {
        std::lock_guard<std::mutex> lock(m);
        for (size_t i = 0; i < strings.size(); ++i)
            if (strings[i] == text) return uint32_t(i + 1);
        strings.emplace_back(text);
        return uint32_t(strings.size());
    }
    void slice(const trace::Slice& s) override {
        std::lock_guard<std::mutex> lock(m);
        slices.push_back(s);
    }
    void counter(const trace::Counter& c) override {
        std::lock_guard<std::mutex> lock(m);
        counters.push_back(c);
    }
    void metadata(std::string_view, std::string_view) override {}
    uint64_t nextCorrelation() override { return ++correlation; }
    std::string str(uint32_t id) {
        std::lock_guard<std::mutex> lock(m);
        return id == 0 || id > strings.size() ? std::string() : strings[id - 1];
    }

    std::mutex m;
    std::vector<trace::TrackDesc> tracks;
    std::vector<std::string> strings;
    std::vector<trace::Slice> slices;
    std::vector<trace::Counter> counters;
    std::atomic<uint64_t> correlation{0};
};

class CudaBackendTest : public ::testing::Test {
protected:
    void SetUp() override {
        auto be = makeCudaBackend();
        if (!be) GTEST_SKIP() << "no CUDA backend: " << be.status().message();
        m_backend = std::move(*be);
        ASSERT_GT(m_backend->deviceCount(), 0);
    }
    Device& dev() { return m_backend->device(0); }
    std::unique_ptr<Backend> m_backend;
};

std::vector<uint8_t> download(const Buffer& b, size_t bytes) {
    std::vector<uint8_t> h(bytes);
    const Status s = kc::copyToHost(h.data(), b.data(), bytes);
    EXPECT_TRUE(s.isOk()) << s.toString();
    return h;
}

// First byte of `h` that is not `v`, or -1.
int64_t firstNot(const std::vector<uint8_t>& h, uint8_t v) {
    for (size_t i = 0; i < h.size(); ++i)
        if (h[i] != v) return int64_t(i);
    return -1;
}

TEST_F(CudaBackendTest, DeviceInfoDescribesTheGpu) {
    const DeviceInfo& info = dev().info();
    EXPECT_EQ(info.backend, BackendKind::Cuda);
    EXPECT_EQ(m_backend->kind(), BackendKind::Cuda);
    EXPECT_FALSE(info.name.empty());
    EXPECT_GT(info.memoryTotal, 0);
    EXPECT_GT(info.memoryFree, 0);
    EXPECT_LE(info.memoryFree, info.memoryTotal);
    EXPECT_GT(info.smCount, 0) << info.name;
    EXPECT_GE(info.computeCapabilityMajor, 7) << info.name;  // we build for sm_80 and sm_90
    if (info.name.find("H100") != std::string::npos || info.name.find("A100") != std::string::npos) {
        EXPECT_GT(info.peakTflopsBf16, 0) << info.name << ": no row in resources/peak_flops.json";
        EXPECT_GT(info.peakTflopsFp32, 0) << info.name;
    }
    EXPECT_EQ(cudaDeviceOrdinal(dev()), 0);
    EXPECT_TRUE(dev().supports("gemm"));
    EXPECT_TRUE(dev().supports("layerNormForward"));
    EXPECT_FALSE(dev().supports("matmul"));
    EXPECT_FALSE(dev().supports("deviceAlloc"));  // runtime helper, not an op
}

TEST_F(CudaBackendTest, AllocationAccountingPeakAndCache) {
    Device& d = dev();
    d.resetPeak();
    const MemoryStats s0 = d.memoryStats();
    {
        auto a = d.allocate(1000, MemCategory::Params);
        ASSERT_TRUE(a.isOk()) << a.status().toString();
        auto b = d.allocateUninitialized(5000, MemCategory::Activations);
        ASSERT_TRUE(b.isOk()) << b.status().toString();
        EXPECT_EQ((*a)->bytes(), 1000u);
        EXPECT_EQ((*a)->category(), MemCategory::Params);
        EXPECT_EQ(&(*a)->device(), &d);
        EXPECT_EQ(reinterpret_cast<uintptr_t>((*a)->data()) % 256, 0u);
        const MemoryStats s1 = d.memoryStats();
        EXPECT_EQ(s1.current[size_t(MemCategory::Params)] - s0.current[size_t(MemCategory::Params)], 1000);
        EXPECT_EQ(s1.current[size_t(MemCategory::Activations)] - s0.current[size_t(MemCategory::Activations)], 5000);
        EXPECT_EQ(s1.currentTotal - s0.currentTotal, 6000);
        EXPECT_EQ(s1.peakTotal, s1.currentTotal);
    }
    const MemoryStats s2 = d.memoryStats();
    EXPECT_EQ(s2.currentTotal, s0.currentTotal);
    EXPECT_EQ(s2.peakTotal - s0.currentTotal, 6000) << "peak stays after the free";
    EXPECT_EQ(s2.peak[size_t(MemCategory::Activations)] - s0.current[size_t(MemCategory::Activations)], 5000);
    EXPECT_GE(s2.cached - s0.cached, 1000 + 5000) << "freed blocks are cached";
    d.resetPeak();
    EXPECT_EQ(d.memoryStats().peakTotal, d.memoryStats().currentTotal);
    {
        // Same size class again: taken from the cache (no stream exists, so nothing is pending).
        auto again = d.allocate(5000, MemCategory::Grads);
        ASSERT_TRUE(again.isOk());
        EXPECT_LT(d.memoryStats().cached, s2.cached);
    }
    EXPECT_EQ(d.allocate(16, MemCategory::Count).status().code(), ErrorCode::InvalidArgument);
}

TEST_F(CudaBackendTest, MemoryLimitFailsWithOutOfMemory) {
    Device& d = dev();
    const int64_t base = d.memoryStats().currentTotal;
    d.setMemoryLimit(base + 4096);
    auto big = d.allocate(5000, MemCategory::Activations);
    ASSERT_FALSE(big.isOk());
    EXPECT_EQ(big.status().code(), ErrorCode::OutOfMemory);
    EXPECT_NE(big.status().message().find("memory limit"), std::string::npos) << big.status().message();
    EXPECT_EQ(d.memoryStats().currentTotal, base) << "a refused allocation is not accounted";
    auto fits = d.allocate(4000, MemCategory::Activations);
    EXPECT_TRUE(fits.isOk()) << fits.status().toString();
    d.setMemoryLimit(0);
    auto after = d.allocate(5000, MemCategory::Activations);
    EXPECT_TRUE(after.isOk()) << after.status().toString();
}

TEST_F(CudaBackendTest, AllocateZeroFillsAReusedBlock) {
    Device& d = dev();
    const size_t n = size_t(1) << 20;
    void* first = nullptr;
    {
        auto dirty = d.allocateUninitialized(n, MemCategory::Activations);
        ASSERT_TRUE(dirty.isOk());
        first = (*dirty)->data();
        TS_ASSERT_OK(kc::memsetAsync((*dirty)->data(), 0xAB, n, nullptr));
        TS_ASSERT_OK(kc::deviceSynchronize());
    }
    auto clean = d.allocate(n, MemCategory::Activations);
    ASSERT_TRUE(clean.isOk());
    EXPECT_EQ((*clean)->data(), first) << "expected the cached block back (no stream was live)";
    const auto h = download(**clean, n);
    EXPECT_EQ(firstNot(h, 0), -1) << "allocate() left byte " << firstNot(h, 0) << " non-zero";
}

TEST_F(CudaBackendTest, SubmitRunsOnTheCallersThreadWithTheStreamCurrent) {
    Device& d = dev();
    auto s = d.createStream(trace::TrackKind::Compute, "compute");
    ASSERT_NE(s->native(), nullptr);
    EXPECT_EQ(s->kind(), trace::TrackKind::Compute);
    EXPECT_EQ(s->name(), "compute");
    const auto caller = std::this_thread::get_id();
    bool ran = false;
    Stream* seen = nullptr;
    int device = -1;
    s->submit(OpDesc{"probe"}, [&] {
        ran = std::this_thread::get_id() == caller;
        seen = currentStream();
        (void)cudaGetDevice(&device);
        return Status::ok();
    });
    EXPECT_TRUE(ran) << "fn must run at once, on the caller's thread";
    EXPECT_EQ(seen, s.get());
    EXPECT_EQ(device, 0);
    EXPECT_EQ(currentStream(), nullptr) << "the scope ends with the op";
    TS_ASSERT_OK(s->synchronize());
}

TEST_F(CudaBackendTest, EventsOrderTwoStreams) {
    Device& d = dev();
    auto producer = d.createStream(trace::TrackKind::Compute, "compute");
    auto consumer = d.createStream(trace::TrackKind::Comm, "comm");
    const size_t n = size_t(32) << 20;
    auto a = d.allocateUninitialized(n, MemCategory::Activations);
    auto b = d.allocate(n, MemCategory::Activations);
    ASSERT_TRUE(a.isOk() && b.isOk());
    void* pa = (*a)->data();
    void* pb = (*b)->data();
    // Many writes on the producer, so the consumer would overtake them without the event.
    for (int v = 1; v <= 20; ++v)
        producer->submit(OpDesc{"fill"}, [&, v] { return kc::memsetAsync(pa, v, n, producer->native()); });
    auto e = d.createEvent();
    producer->record(*e);
    consumer->wait(*e);
    consumer->submit(OpDesc{"copy"}, [&] { return kc::copyAsync(pb, pa, n, consumer->native()); });
    TS_ASSERT_OK(consumer->synchronize());
    EXPECT_TRUE(e->query()) << "the consumer finished after the event";
    TS_ASSERT_OK(producer->synchronize());
    const auto h = download(**b, n);
    EXPECT_EQ(firstNot(h, 20), -1) << "byte " << firstNot(h, 20) << " of the copy is not the last fill (20)";
    e->synchronize();
}

TEST_F(CudaBackendTest, FreedBlockIsNotReusedWhileAStreamMayUseIt) {
    Device& d = dev();
    auto s = d.createStream(trace::TrackKind::Compute, "compute");
    const size_t n = size_t(64) << 20;
    void* old = nullptr;
    {
        auto a = d.allocateUninitialized(n, MemCategory::Activations);
        ASSERT_TRUE(a.isOk());
        old = (*a)->data();
        for (int i = 0; i < 50; ++i)
            s->submit(OpDesc{"busy"}, [&, p = (*a)->data()] { return kc::memsetAsync(p, i, n, s->native()); });
    }  // freed while the stream is (very likely) still writing it
    auto b = d.allocateUninitialized(n, MemCategory::Activations);
    ASSERT_TRUE(b.isOk());
    if ((*b)->data() == old) {
        EXPECT_EQ(cudaStreamQuery(static_cast<cudaStream_t>(s->native())), cudaSuccess)
            << "the block came back before the stream that used it finished";
    }
    TS_ASSERT_OK(s->synchronize());
}

TEST_F(CudaBackendTest, FailedFnFailsTheStreamAndPropagatesThroughEvents) {
    Device& d = dev();
    auto s = d.createStream(trace::TrackKind::Compute, "compute");
    auto other = d.createStream(trace::TrackKind::Comm, "comm");
    s->submit(OpDesc{"broken_op"}, [] { return Status::invalid("boom"); });
    bool ranAfter = false;
    s->submit(OpDesc{"later"}, [&] {
        ranAfter = true;
        return Status::ok();
    });
    EXPECT_FALSE(ranAfter) << "work after a failure is skipped";
    const Status st = s->synchronize();
    ASSERT_FALSE(st.isOk());
    EXPECT_EQ(st.code(), ErrorCode::InvalidArgument);
    EXPECT_NE(st.message().find("boom"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("broken_op"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("compute"), std::string::npos) << st.message();
    EXPECT_EQ(s->synchronize().message(), st.message()) << "sticky: the first error stays";

    auto e = d.createEvent();
    s->record(*e);
    EXPECT_FALSE(cudaEventStatus(*e).isOk());
    other->wait(*e);
    const Status o = other->synchronize();
    EXPECT_FALSE(o.isOk()) << "waiting on an event of a failed stream fails the waiter";
    EXPECT_NE(o.message().find("boom"), std::string::npos) << o.message();

    auto thrower = d.createStream(trace::TrackKind::Compute, "thrower");
    thrower->submit(OpDesc{"throws"}, []() -> Status { throw std::runtime_error("oops"); });
    EXPECT_NE(thrower->synchronize().message().find("oops"), std::string::npos);
}

TEST_F(CudaBackendTest, ReportedKernelErrorFailsTheStream) {
    Device& d = dev();
    auto s = d.createStream(trace::TrackKind::Compute, "compute");
    reportKernelError(Status::internal("stale error outside any op"));
    s->submit(OpDesc{"fine"}, [] { return Status::ok(); });
    TS_ASSERT_OK(s->synchronize());  // an error from before the op is not the op's
    s->submit(OpDesc{"bad_kernel"}, [] {
        reportKernelError(Status::internal("launch failed: too many resources"));
        reportKernelError(Status::internal("second error"));  // the first one of an op wins
        return Status::ok();
    });
    const Status st = s->synchronize();
    ASSERT_FALSE(st.isOk());
    EXPECT_EQ(st.code(), ErrorCode::Internal);
    EXPECT_NE(st.message().find("too many resources"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("bad_kernel"), std::string::npos) << st.message();
    EXPECT_TRUE(takeKernelError().isOk()) << "the stream took the error";
}

TEST_F(CudaBackendTest, TracedSubmitRecordsAHostLaunchSlice) {
    Device& d = dev();
    TestRecorder rec;
    d.setTrace(&rec, 3);
    EXPECT_EQ(d.traceTarget().rank, 3);
    {
        auto s = d.createStream(trace::TrackKind::Compute, "compute");
        OpDesc desc{"linear_fc1.fwd", trace::Category::Gemm};
        desc.step = 2;
        desc.microbatch = 1;
        s->submit(desc, [] { return Status::ok(); });
        TS_ASSERT_OK(s->synchronize());
        auto buf = d.allocate(4096, MemCategory::Activations);  // a memory counter too
        ASSERT_TRUE(buf.isOk());
    }
    d.setTrace(nullptr, 0);
    std::lock_guard<std::mutex> lock(rec.m);
    ASSERT_EQ(rec.slices.size(), 1u);
    const trace::Slice& sl = rec.slices[0];
    EXPECT_EQ(sl.category, trace::Category::Launch);
    EXPECT_EQ(rec.strings[sl.name - 1], "linear_fc1.fwd");
    EXPECT_EQ(sl.step, 2);
    EXPECT_EQ(sl.microbatch, 1);
    EXPECT_GT(sl.correlation, 0u);
    EXPECT_GE(sl.durNs, 0);
    ASSERT_FALSE(rec.tracks.empty());
    EXPECT_EQ(rec.tracks[0].kind, trace::TrackKind::HostThread);
    EXPECT_EQ(rec.tracks[0].rank, 3);
    EXPECT_GE(rec.counters.size(), 2u) << "allocation and free report memory counters";
}

// ----- kernel dispatch (engine/backend/kernels.h) ----------------------------------------------

// Inside an op of a CUDA stream the dispatch launches the CUDA kernel on that stream; the
// value-returning ops read their result back (synchronizing that stream) and match the CPU
// oracle; outside any op it is the CPU oracle. A value op whose launch fails returns its failure
// value (not an earlier op's result left in the scratch) and fails the stream once.
TEST_F(CudaBackendTest, DispatchRunsOnTheOpsStreamAndReadsValuesBack) {
    Device& d = dev();
    auto s1 = d.createStream(trace::TrackKind::Compute, "compute");
    auto s2 = d.createStream(trace::TrackKind::Comm, "comm");
    const int64_t n = 100003;  // several blocks of every reduction, not a multiple of anything
    std::vector<float> hx(static_cast<size_t>(n));
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-2.f, 2.f);
    for (float& v : hx) v = u(rng);
    hx[12345] = -3.5f;  // the amax
    auto x = d.allocateUninitialized(size_t(n) * 4, MemCategory::Activations);
    auto y = d.allocate(size_t(n) * 4, MemCategory::Activations);
    ASSERT_TRUE(x.isOk() && y.isOk());
    auto* px = (*x)->as<float>();
    auto* py = (*y)->as<float>();
    TS_ASSERT_OK(kc::copyToDevice(px, hx.data(), hx.size() * 4));

    EXPECT_FALSE(kern::onDevice()) << "outside any op the dispatch is the CPU";
    double sum1 = -1, sum2 = -1;
    float amax = -1;
    bool finite = false, onDev = false;
    s1->submit(OpDesc{"values"}, [&] {
        onDev = kern::onDevice();
        kern::add(px, px, py, n);  // async on s1: y = 2x
        sum1 = kern::sumSquares(py, n);
        amax = kern::amaxOf(px, n);
        finite = kern::allFinite(px, n);
        return Status::ok();
    });
    s2->submit(OpDesc{"values"}, [&] {
        sum2 = kern::sumSquares(px, n);  // another stream: its own scratch
        return Status::ok();
    });
    TS_ASSERT_OK(s1->synchronize());
    TS_ASSERT_OK(s2->synchronize());
    EXPECT_TRUE(onDev);
    const double want = kernels::cpu::sumSquares(hx.data(), n);
    EXPECT_NEAR(sum1, 4 * want, 4 * want * 1e-9) << "kern::sumSquares of 2x on stream compute";
    EXPECT_NEAR(sum2, want, want * 1e-9) << "kern::sumSquares of x on stream comm";
    EXPECT_EQ(amax, kernels::cpu::amaxOf(hx.data(), n)) << "kern::amaxOf";
    EXPECT_TRUE(finite) << "kern::allFinite";

    // A failing launch (negative count): failure value, the stream fails with the kernel's error.
    double bad = -1;
    s1->submit(OpDesc{"bad_values"}, [&] {
        bad = kern::sumSquares(px, -1);
        return Status::ok();
    });
    EXPECT_EQ(bad, 0.0) << "a failed kern::sumSquares returned a stale value (the previous op's result "
                        << sum1 << "?)";
    const Status st = s1->synchronize();
    ASSERT_FALSE(st.isOk());
    EXPECT_NE(st.message().find("negative element count"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("bad_values"), std::string::npos) << st.message();
    EXPECT_TRUE(takeKernelError().isOk()) << "the stream took the error";
}

#ifdef TS_HAVE_NCCL

// ----- NCCL against the in-process communicator ------------------------------------------------

// One collective to run on every rank: element counts per rank, how to call it, how exact.
struct Case {
    std::string name;
    DType dtype = DType::F32;
    std::function<size_t(int rank)> inCount, outCount;
    std::function<void(Communicator&, Stream&, const void* in, void* out, int rank)> run;
    bool outStartsAsIn = false;  // broadcast works in place on `out`
    double rtol = 0, atol = 0;   // 0, 0 = bitwise
};

// Inputs per (case, rank): f32 in [-1, 1]; bf16 of such values; i32/i64 small integers.
std::vector<uint8_t> makeInput(const Case& c, int rank, size_t caseIndex) {
    const size_t n = c.inCount(rank), es = dtypeSize(c.dtype);
    std::vector<uint8_t> out(n * es);
    std::mt19937 rng(uint32_t(1000 * caseIndex + rank + 1));
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (size_t i = 0; i < n; ++i) {
        float f = u(rng);
        switch (c.dtype) {
            case DType::F32: std::memcpy(&out[i * 4], &f, 4); break;
            case DType::BF16: {
                uint32_t bits;
                std::memcpy(&bits, &f, 4);
                const uint16_t b = uint16_t(bits >> 16);  // truncation: any bf16 value will do
                std::memcpy(&out[i * 2], &b, 2);
                break;
            }
            case DType::I32: {
                const int32_t v = int32_t(rng() % 2001) - 1000;
                std::memcpy(&out[i * 4], &v, 4);
                break;
            }
            case DType::I64: {
                const int64_t v = int64_t(rng() % 2000001) - 1000000;
                std::memcpy(&out[i * 8], &v, 8);
                break;
            }
            default: out[i * es] = uint8_t(rng()); break;
        }
    }
    return out;
}

double valueAt(const std::vector<uint8_t>& h, DType t, size_t i) {
    switch (t) {
        case DType::F32: {
            float f;
            std::memcpy(&f, &h[i * 4], 4);
            return f;
        }
        case DType::BF16: {
            uint16_t b;
            std::memcpy(&b, &h[i * 2], 2);
            const uint32_t bits = uint32_t(b) << 16;
            float f;
            std::memcpy(&f, &bits, 4);
            return f;
        }
        case DType::I32: {
            int32_t v;
            std::memcpy(&v, &h[i * 4], 4);
            return v;
        }
        case DType::I64: {
            int64_t v;
            std::memcpy(&v, &h[i * 8], 8);
            return double(v);
        }
        default: return h[i * dtypeSize(t)];
    }
}

using Results = std::vector<std::vector<std::vector<uint8_t>>>;  // [case][rank] -> output bytes

// The cases on n ranks. counts are small (well under a millisecond each on a GPU) but not
// multiples of anything, and alltoallv's are uneven with zeros.
std::vector<Case> makeCases(int n) {
    std::vector<Case> cases;
    const size_t count = 1027;
    auto fixed = [](size_t c) { return [c](int) { return c; }; };
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg}) {
        static const char* names[] = {"sum", "max", "min", "avg"};
        Case c;
        c.name = std::string("all_reduce f32 ") + names[int(op)];
        c.inCount = c.outCount = fixed(count);
        c.run = [op, count](Communicator& comm, Stream& s, const void* in, void* out, int) {
            comm.allReduce(s, in, out, count, DType::F32, op);
        };
        // Sum/avg: NCCL adds in its own order (and avg may pre-scale by 1/n).
        if (op == ReduceOp::Sum || op == ReduceOp::Avg) c.rtol = 1e-6, c.atol = 1e-6 * n;
        cases.push_back(c);
    }
    {
        Case c;
        c.name = "all_reduce bf16 sum";
        c.dtype = DType::BF16;
        c.inCount = c.outCount = fixed(count);
        c.run = [count](Communicator& comm, Stream& s, const void* in, void* out, int) {
            comm.allReduce(s, in, out, count, DType::BF16, ReduceOp::Sum);
        };
        // NCCL rounds to bf16 after every addition along the ring (or reduces in the switch),
        // the in-process one accumulates in fp32 and rounds once: one bf16 ulp (2^-8 relative)
        // per addition. With 2 ranks both are one rounding of the same sum, so this should be
        // bitwise except for rare double-rounding ties of tiny addends.
        // Beyond 2 ranks a partial sum (|partial| <= n) is rounded too: atol covers that.
        c.rtol = (n - 1) * std::ldexp(1.0, -8);
        c.atol = n > 2 ? (n - 1) * n * std::ldexp(1.0, -8) : std::ldexp(1.0, -16);
        cases.push_back(c);
    }
    {
        Case c;
        c.name = "all_reduce i32 sum";
        c.dtype = DType::I32;
        c.inCount = c.outCount = fixed(count);
        c.run = [count](Communicator& comm, Stream& s, const void* in, void* out, int) {
            comm.allReduce(s, in, out, count, DType::I32, ReduceOp::Sum);
        };
        cases.push_back(c);
    }
    {
        // ncclAvg on an integer type is NCCL's sum then a division truncating toward zero, as
        // the in-process one (values are small and mixed in sign: no overflow, both roundings).
        Case c;
        c.name = "all_reduce i32 avg";
        c.dtype = DType::I32;
        c.inCount = c.outCount = fixed(count);
        c.run = [count](Communicator& comm, Stream& s, const void* in, void* out, int) {
            comm.allReduce(s, in, out, count, DType::I32, ReduceOp::Avg);
        };
        cases.push_back(c);
    }
    {
        Case c;
        c.name = "reduce_scatter f32 sum";
        c.inCount = fixed(count * size_t(n));
        c.outCount = fixed(count);
        c.run = [count](Communicator& comm, Stream& s, const void* in, void* out, int) {
            comm.reduceScatter(s, in, out, count, DType::F32, ReduceOp::Sum);
        };
        c.rtol = 1e-6, c.atol = 1e-6 * n;
        cases.push_back(c);
    }
    {
        Case c;
        c.name = "all_gather bf16";
        c.dtype = DType::BF16;
        c.inCount = fixed(count);
        c.outCount = fixed(count * size_t(n));
        c.run = [count](Communicator& comm, Stream& s, const void* in, void* out, int) {
            comm.allGather(s, in, out, count, DType::BF16);
        };
        cases.push_back(c);
    }
    {
        Case c;
        c.name = "broadcast i64 root " + std::to_string(n - 1);
        c.dtype = DType::I64;
        c.inCount = c.outCount = fixed(count);
        c.outStartsAsIn = true;
        c.run = [count, n](Communicator& comm, Stream& s, const void*, void* out, int) {
            comm.broadcast(s, out, count, DType::I64, n - 1);
        };
        cases.push_back(c);
    }
    {
        // Uneven, some zero: rank r sends (r + 2q + 1) % 4 * 37 elements to rank q (the own
        // part of rank 0, the self copy, is non-empty, so a 1-rank group exercises it too).
        auto sendCount = [](int r, int q) { return size_t((r + 2 * q + 1) % 4) * 37; };
        Case c;
        c.name = "all_to_allv f32 uneven";
        c.inCount = [n, sendCount](int r) {
            size_t t = 0;
            for (int q = 0; q < n; ++q) t += sendCount(r, q);
            return t;
        };
        c.outCount = [n, sendCount](int r) {
            size_t t = 0;
            for (int q = 0; q < n; ++q) t += sendCount(q, r);
            return t;
        };
        c.run = [n, sendCount](Communicator& comm, Stream& s, const void* in, void* out, int r) {
            std::vector<size_t> sc(static_cast<size_t>(n)), rc(static_cast<size_t>(n));
            for (int q = 0; q < n; ++q) sc[size_t(q)] = sendCount(r, q), rc[size_t(q)] = sendCount(q, r);
            comm.allToAllv(s, in, sc, out, rc, DType::F32);
        };
        cases.push_back(c);
    }
    {
        // Ring: rank r sends 100 + r elements to r + 1 and receives 100 + (r - 1) from r - 1.
        Case c;
        c.name = "send_recv ring f32";
        c.inCount = [](int r) { return size_t(100 + r); };
        c.outCount = [n](int r) { return size_t(100 + (r + n - 1) % n); };
        c.run = [n](Communicator& comm, Stream& s, const void* in, void* out, int r) {
            P2POp send{P2POp::Send, (r + 1) % n, const_cast<void*>(in), size_t(100 + r), DType::F32, 0};
            P2POp recv{P2POp::Recv, (r + n - 1) % n, out, size_t(100 + (r + n - 1) % n), DType::F32, 0};
            comm.batchSendRecv(s, r % 2 ? std::vector<P2POp>{recv, send} : std::vector<P2POp>{send, recv});
        };
        cases.push_back(c);
    }
    return cases;
}

struct RunOutput {
    Results results;
    std::vector<CommStats> stats;  // per rank, after all cases
    std::vector<std::string> errors;
};

// Runs every case on n rank threads. `join` gives rank r its communicator; device r is the
// rank's device; host=true: buffers are host memory (CPU backend), else device memory.
// `abortAll` is called when a rank fails, so the others fail fast instead of waiting forever in
// a collective the failed rank never joins.
RunOutput runAll(int n, Backend& backend, bool host, const std::vector<Case>& cases,
                 const std::function<Result<std::unique_ptr<Communicator>>(int)>& join,
                 const std::function<void(const Status&)>& abortAll) {
    RunOutput out;
    out.results.assign(cases.size(), std::vector<std::vector<uint8_t>>(size_t(n)));
    out.stats.resize(size_t(n));
    out.errors.resize(size_t(n));
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r)
        threads.emplace_back([&, r] {
            auto fail = [&](const std::string& what) {
                out.errors[size_t(r)] = "rank " + std::to_string(r) + ": " + what;
                abortAll(Status::comm("test: rank " + std::to_string(r) + " failed"));
            };
            if (!host && !kc::setDevice(r).isOk()) return fail("cudaSetDevice");
            Device& dev = backend.device(r);
            auto comm = join(r);  // concurrently on every rank thread (NCCL needs that)
            if (!comm) return fail(comm.status().toString());
            auto stream = dev.createStream(trace::TrackKind::Comm, "comm");
            for (size_t ci = 0; ci < cases.size(); ++ci) {
                const Case& c = cases[ci];
                const size_t es = dtypeSize(c.dtype);
                const auto input = makeInput(c, r, ci);
                const size_t outBytes = c.outCount(r) * es;
                auto in = dev.allocate(std::max<size_t>(input.size(), 1), MemCategory::CommBuffers);
                auto o = dev.allocate(std::max<size_t>(outBytes, 1), MemCategory::CommBuffers);
                if (!in || !o) return fail(c.name + ": allocation failed");
                const std::vector<uint8_t>& init = c.outStartsAsIn ? input : std::vector<uint8_t>();
                Status st;
                if (host) {
                    std::memcpy((*in)->data(), input.data(), input.size());
                    if (!init.empty()) std::memcpy((*o)->data(), init.data(), init.size());
                } else {
                    st = kc::copyToDevice((*in)->data(), input.data(), input.size());
                    if (st.isOk() && !init.empty()) st = kc::copyToDevice((*o)->data(), init.data(), init.size());
                }
                if (!st.isOk()) return fail(c.name + ": upload: " + st.toString());
                c.run(**comm, *stream, (*in)->data(), (*o)->data(), r);
                st = stream->synchronize();
                if (!st.isOk()) return fail(c.name + ": " + st.toString());
                auto& res = out.results[ci][size_t(r)];
                res.resize(outBytes);
                if (host) std::memcpy(res.data(), (*o)->data(), outBytes);
                else if (Status d = kc::copyToHost(res.data(), (*o)->data(), outBytes); !d.isOk())
                    return fail(c.name + ": download: " + d.toString());
            }
            out.stats[size_t(r)] = (*comm)->stats();
        });
    for (auto& t : threads) t.join();
    return out;
}

// makeSharedCudaBackend: three ranks' devices over the visible GPUs (all on one GPU where there is
// one), each with its own accounting; their managed buffers are reached from the host once their
// stream is synchronized, and a kernel on one rank's stream reads what the host wrote into another
// rank's buffer: the in-process communicator's way between ranks sharing a GPU.
TEST(CudaSharedBackend, RanksShareAGpuWithTheirOwnAccountingAndHostReachableBuffers) {
    auto one = makeCudaBackend();
    if (!one) GTEST_SKIP() << "no CUDA backend: " << one.status().message();
    const int gpus = (*one)->deviceCount();
    const int64_t gpuMemory = (*one)->device(0).info().memoryTotal;
    one->reset();
    EXPECT_EQ(makeSharedCudaBackend(0).status().code(), ErrorCode::InvalidArgument);
    auto be = makeSharedCudaBackend(3);
    ASSERT_TRUE(be.isOk()) << be.status().toString();
    ASSERT_EQ((*be)->deviceCount(), 3);
    for (int i = 0; i < 3; ++i) EXPECT_EQ((*be)->device(i).info().index, i % gpus) << "device " << i;
    if (gpus == 1) {
        EXPECT_EQ((*be)->device(0).info().memoryTotal, gpuMemory / 3);
    }
    Device& a = (*be)->device(0);
    Device& b = (*be)->device(1);
    const int64_t bBefore = b.memoryStats().currentTotal;
    const int64_t n = 4099;
    auto x = a.allocate(size_t(n) * 4, MemCategory::Activations);
    auto y = b.allocate(size_t(n) * 4, MemCategory::Activations);
    ASSERT_TRUE(x.isOk() && y.isOk());
    EXPECT_EQ(b.memoryStats().currentTotal - bBefore, n * 4) << "device 0's buffer is not device 1's";
    float* px = (*x)->as<float>();
    float* py = (*y)->as<float>();
    for (int64_t i = 0; i < n; ++i) px[i] = float(i % 97) - 48.f;  // the host writes rank 0's buffer
    auto sb = b.createStream(trace::TrackKind::Compute, "compute");
    sb->submit(OpDesc{"add"}, [&] {
        kern::add(px, px, py, n);  // rank 1's stream: y = 2x
        return Status::ok();
    });
    TS_ASSERT_OK(sb->synchronize());
    int64_t wrong = -1;
    for (int64_t i = 0; i < n && wrong < 0; ++i)
        if (py[i] != 2.f * (float(i % 97) - 48.f)) wrong = i;  // the host reads rank 1's buffer
    EXPECT_EQ(wrong, -1) << "y[" << wrong << "] = " << (wrong >= 0 ? py[wrong] : 0.f);
}

class NcclTest : public CudaBackendTest {
protected:
    void SetUp() override {
        CudaBackendTest::SetUp();
        if (IsSkipped()) return;
        // One rank per device (NCCL refuses two ranks on one GPU). On one GPU the group has one
        // rank: no data crosses a link, but every NCCL call, its dtype/count arguments, the
        // all-to-all displacements and self copy, send/recv to self, stats and abort still run.
        m_n = std::min(m_backend->deviceCount(), 4);
    }
    int m_n = 0;
};

TEST_F(NcclTest, EveryCollectiveMatchesTheInProcessCommunicator) {
    const int n = m_n;
    const auto cases = makeCases(n);
    std::vector<int> all(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) all[size_t(r)] = r;

    auto cpu = makeCpuBackend(n);
    CommWorld inprocWorld(n);
    const RunOutput want = runAll(
        n, *cpu, true, cases, [&](int r) { return inprocWorld.join("world", all, r); },
        [&](const Status& why) { inprocWorld.abort(why); });
    for (const auto& e : want.errors) ASSERT_TRUE(e.empty()) << "in-process: " << e;

    NcclWorld ncclWorld(n);
    const RunOutput got = runAll(
        n, *m_backend, false, cases, [&](int r) { return ncclWorld.join("world", all, r); },
        [&](const Status& why) { ncclWorld.abort(why); });
    for (const auto& e : got.errors) ASSERT_TRUE(e.empty()) << "NCCL: " << e;

    for (size_t ci = 0; ci < cases.size(); ++ci) {
        const Case& c = cases[ci];
        for (int r = 0; r < n; ++r) {
            const auto& g = got.results[ci][size_t(r)];
            const auto& w = want.results[ci][size_t(r)];
            ASSERT_EQ(g.size(), w.size()) << c.name << " rank " << r;
            const size_t count = g.size() / dtypeSize(c.dtype);
            int bad = 0;
            for (size_t i = 0; i < count && bad < 5; ++i) {
                const double gv = valueAt(g, c.dtype, i), wv = valueAt(w, c.dtype, i);
                const bool ok = (c.rtol == 0 && c.atol == 0)
                                    ? std::memcmp(&g[i * dtypeSize(c.dtype)], &w[i * dtypeSize(c.dtype)],
                                                  dtypeSize(c.dtype)) == 0
                                    : std::fabs(gv - wv) <= c.atol + c.rtol * std::fabs(wv);
                if (!ok) {
                    ++bad;
                    ADD_FAILURE() << c.name << " on " << n << " ranks: rank " << r << " element " << i << ": nccl "
                                  << gv << ", in-process " << wv;
                }
            }
        }
    }
    for (int r = 0; r < n; ++r) {
        EXPECT_EQ(got.stats[size_t(r)].ops, want.stats[size_t(r)].ops) << "rank " << r;
        EXPECT_EQ(got.stats[size_t(r)].bytesSent, want.stats[size_t(r)].bytesSent) << "rank " << r;
        EXPECT_EQ(got.stats[size_t(r)].bytesReceived, want.stats[size_t(r)].bytesReceived) << "rank " << r;
    }
}

TEST_F(NcclTest, AbortFailsLaterOpsWithCommError) {
    const int n = std::min(m_n, 2);
    std::vector<int> members;
    for (int r = 0; r < n; ++r) members.push_back(r);
    NcclWorld world(n);
    std::vector<std::string> errors(static_cast<size_t>(n));
    std::vector<Status> after(static_cast<size_t>(n));
    std::barrier sync(n);
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r)
        threads.emplace_back([&, r] {
            if (!kc::setDevice(r).isOk()) {
                errors[size_t(r)] = "cudaSetDevice";
                sync.arrive_and_drop();
                return;
            }
            auto comm = world.join("dp", members, r);
            if (!comm) {
                errors[size_t(r)] = comm.status().toString();
                sync.arrive_and_drop();
                return;
            }
            Device& dev = m_backend->device(r);
            auto s = dev.createStream(trace::TrackKind::Comm, "dp");
            auto buf = dev.allocate(4096, MemCategory::Grads);
            (*comm)->allReduce(*s, (*buf)->data(), (*buf)->data(), 1024, DType::F32, ReduceOp::Sum);
            if (Status st = s->synchronize(); !st.isOk()) errors[size_t(r)] = st.toString();
            sync.arrive_and_wait();
            if (r == 0) (*comm)->abort(Status::comm("rank 1 failed (test)"));  // aborts every member's
            sync.arrive_and_wait();
            (*comm)->allReduce(*s, (*buf)->data(), (*buf)->data(), 1024, DType::F32, ReduceOp::Sum);
            after[size_t(r)] = s->synchronize();
        });
    for (auto& t : threads) t.join();
    for (int r = 0; r < n; ++r) {
        ASSERT_TRUE(errors[size_t(r)].empty()) << "rank " << r << ": " << errors[size_t(r)];
        EXPECT_EQ(after[size_t(r)].code(), ErrorCode::CommError) << "rank " << r << ": " << after[size_t(r)].toString();
        EXPECT_NE(after[size_t(r)].message().find("rank 1 failed (test)"), std::string::npos)
            << after[size_t(r)].message();
    }
    EXPECT_FALSE(world.abortStatus().isOk());
    EXPECT_FALSE(world.join("dp", members, 0).isOk()) << "an aborted world refuses new groups";
}

#endif  // TS_HAVE_NCCL

}  // namespace
}  // namespace ts::engine

#else  // !TS_HAVE_CUDA

TEST(CudaBackend, NotBuilt) { GTEST_SKIP() << "this build has no CUDA backend"; }

#endif
