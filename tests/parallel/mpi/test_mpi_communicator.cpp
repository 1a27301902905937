// MPI communicator, run as `mpirun -np N test_mpi_communicator` (CTest label `mpi`): every
// collective against values each rank can compute on its own, p2p ring, concurrent groups on
// two streams, timeout and abort. Works for any N >= 1 (CTest uses 2).
#include <gtest/gtest.h>
// The C++ bindings are deprecated and not warning-clean; only the C API is used.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <algorithm>
#include <cstring>
#include <numeric>
#include <thread>

#include "engine/backend/backend.h"
#include "engine/comm/mpi/mpi_communicator.h"

using namespace ts;
using namespace ts::engine;
using namespace std::chrono_literals;

namespace {

MpiRuntime* g_mpi = nullptr;

std::vector<int> allRanks() {
    std::vector<int> r(size_t(g_mpi->worldSize()));
    std::iota(r.begin(), r.end(), 0);
    return r;
}

struct Fixture {
    Fixture() : backend(makeCpuBackend(1)) {
        stream = backend->device(0).createStream(trace::TrackKind::Comm, "comm");
        auto c = g_mpi->createGroup("world", allRanks());
        EXPECT_TRUE(c.isOk()) << c.status().toString();
        comm = std::move(c).value();
    }
    std::unique_ptr<Backend> backend;
    std::unique_ptr<Stream> stream;
    std::unique_ptr<Communicator> comm;
};

uint16_t bf16(float f) {  // exact for small integers
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return uint16_t(u >> 16);
}
float unbf16(uint16_t b) {
    uint32_t u = uint32_t(b) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

}  // namespace

TEST(MpiComm, AllReduceAllDtypesAndOps) {
    Fixture f;
    const int n = f.comm->size(), me = f.comm->rank();
    const size_t count = 1001;
    std::vector<float> a(count), out(count), inplace(count), mx(count), avg(count);
    std::vector<int32_t> ia(count);
    std::vector<uint16_t> b(count);
    for (size_t i = 0; i < count; ++i) {
        a[i] = float(me + 1) * float(i % 7);
        inplace[i] = a[i];
        mx[i] = a[i];
        avg[i] = a[i];
        ia[i] = int32_t(me * 1000 + int(i));
        b[i] = bf16(float(me + int(i % 5)));
    }
    f.comm->allReduce(*f.stream, a.data(), out.data(), count, DType::F32, ReduceOp::Sum);
    f.comm->allReduce(*f.stream, inplace.data(), inplace.data(), count, DType::F32, ReduceOp::Sum);
    f.comm->allReduce(*f.stream, mx.data(), mx.data(), count, DType::F32, ReduceOp::Max);
    f.comm->allReduce(*f.stream, avg.data(), avg.data(), count, DType::F32, ReduceOp::Avg);
    f.comm->allReduce(*f.stream, ia.data(), ia.data(), count, DType::I32, ReduceOp::Min);
    f.comm->allReduce(*f.stream, b.data(), b.data(), count, DType::BF16, ReduceOp::Sum);
    ASSERT_TRUE(f.stream->synchronize().isOk());
    const float tri = float(n * (n + 1) / 2);
    for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(out[i], tri * float(i % 7)) << i;
        ASSERT_EQ(inplace[i], out[i]);
        ASSERT_EQ(mx[i], float(n) * float(i % 7));
        ASSERT_NEAR(avg[i], tri * float(i % 7) / float(n), 1e-5);
        ASSERT_EQ(ia[i], int32_t(i));
        ASSERT_EQ(unbf16(b[i]), float(n * (n - 1) / 2 + n * int(i % 5)));
    }
    EXPECT_EQ(f.comm->stats().ops, 6u);
}

TEST(MpiComm, ReduceScatterAllGatherBroadcastAllToAll) {
    Fixture f;
    const int n = f.comm->size(), me = f.comm->rank();
    const size_t c = 17;
    std::vector<float> send(c * size_t(n)), rs(c);
    for (size_t i = 0; i < send.size(); ++i) send[i] = float(me) + float(i);
    f.comm->reduceScatter(*f.stream, send.data(), rs.data(), c, DType::F32, ReduceOp::Sum);
    std::vector<int32_t> gathered(c * size_t(n), -1);
    for (size_t i = 0; i < c; ++i) gathered[size_t(me) * c + i] = int32_t(me * 100 + int(i));
    f.comm->allGather(*f.stream, gathered.data() + size_t(me) * c, gathered.data(), c, DType::I32);  // in place
    std::vector<uint16_t> bc(9, uint16_t(me));
    f.comm->broadcast(*f.stream, bc.data(), bc.size(), DType::BF16, n - 1);
    // all-to-all: rank q sends q+p+1 elements valued q*10+p to rank p.
    std::vector<size_t> sc(static_cast<size_t>(n)), rc(static_cast<size_t>(n));
    std::vector<float> a2aSend, a2aRecv;
    for (int p = 0; p < n; ++p) {
        sc[size_t(p)] = size_t(me + p + 1);
        rc[size_t(p)] = size_t(p + me + 1);
        for (size_t i = 0; i < sc[size_t(p)]; ++i) a2aSend.push_back(float(me * 10 + p));
    }
    a2aRecv.assign(std::accumulate(rc.begin(), rc.end(), size_t(0)), -1.0f);
    f.comm->allToAllv(*f.stream, a2aSend.data(), sc, a2aRecv.data(), rc, DType::F32);
    ASSERT_TRUE(f.stream->synchronize().isOk());
    for (size_t i = 0; i < c; ++i) {
        // sum over q of (q + me*c + i)
        EXPECT_EQ(rs[i], float(n * (n - 1) / 2) + float(n) * float(size_t(me) * c + i));
    }
    for (int q = 0; q < n; ++q)
        for (size_t i = 0; i < c; ++i) EXPECT_EQ(gathered[size_t(q) * c + i], q * 100 + int(i));
    for (auto v : bc) EXPECT_EQ(v, uint16_t(n - 1));
    size_t off = 0;
    for (int q = 0; q < n; ++q)
        for (size_t i = 0; i < rc[size_t(q)]; ++i) EXPECT_EQ(a2aRecv[off++], float(q * 10 + me));
}

TEST(MpiComm, RingSendRecvAndTwoGroupsOnTwoStreams) {
    Fixture f;
    const int n = f.comm->size(), me = f.comm->rank();
    auto self = g_mpi->createGroup("self", {g_mpi->worldRank()});
    ASSERT_TRUE(self.isOk());
    auto other = f.backend->device(0).createStream(trace::TrackKind::Comm, "comm 2");
    std::vector<double> out(5, double(me)), fromPrev(5, -1), fromNext(5, -1);
    const int next = (me + 1) % n, prev = (me + n - 1) % n;
    f.comm->batchSendRecv(*f.stream, {{P2POp::Send, next, out.data(), 5, DType::I64, 0},
                                      {P2POp::Recv, prev, fromPrev.data(), 5, DType::I64, 0},
                                      {P2POp::Send, prev, out.data(), 5, DType::I64, 1},
                                      {P2POp::Recv, next, fromNext.data(), 5, DType::I64, 1}});
    std::vector<float> x(100, 2.0f);
    for (int i = 0; i < 20; ++i) (*self)->allReduce(*other, x.data(), x.data(), x.size(), DType::F32, ReduceOp::Sum);
    ASSERT_TRUE(f.stream->synchronize().isOk());
    ASSERT_TRUE(other->synchronize().isOk());
    for (int i = 0; i < 5; ++i) {
        EXPECT_EQ(fromPrev[size_t(i)], double(prev));
        EXPECT_EQ(fromNext[size_t(i)], double(next));
    }
    EXPECT_EQ(x[0], 2.0f);  // a group of one
}

TEST(MpiComm, TimeoutAndAbort) {
    const int me = g_mpi->worldRank(), n = g_mpi->worldSize();
    if (n < 2) GTEST_SKIP() << "needs 2 ranks";
    auto be = makeCpuBackend(1);
    auto s = be->device(0).createStream(trace::TrackKind::Comm, "comm");
    auto c = g_mpi->createGroup("late", allRanks(), 300ms);
    ASSERT_TRUE(c.isOk());
    // Rank 0 posts an all-reduce that the others join only after rank 0 timed out. The buffer
    // stays alive (static) because MPI completes the orphaned request later.
    static std::vector<float> buf(4, 1.0f);
    if (me == 0) {
        (*c)->allReduce(*s, buf.data(), buf.data(), buf.size(), DType::F32, ReduceOp::Sum);
        Status st = s->synchronize();
        EXPECT_EQ(st.code(), ErrorCode::Timeout) << st.toString();
        EXPECT_NE(st.message().find("'late'"), std::string::npos) << st.message();
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (me != 0) {
        (*c)->allReduce(*s, buf.data(), buf.data(), buf.size(), DType::F32, ReduceOp::Sum);
        // Rank 0's orphaned request matches, so this completes.
        EXPECT_TRUE(s->synchronize().isOk());
    }
    MPI_Barrier(MPI_COMM_WORLD);
    // Abort: future ops on the group fail at once without talking to the peers.
    auto s2 = be->device(0).createStream(trace::TrackKind::Comm, "comm 2");
    (*c)->abort(Status::numerical("rank 0: loss is NaN"));
    (*c)->allReduce(*s2, buf.data(), buf.data(), buf.size(), DType::F32, ReduceOp::Sum);
    Status st = s2->synchronize();
    EXPECT_EQ(st.code(), ErrorCode::CommError);
    EXPECT_NE(st.message().find("loss is NaN"), std::string::npos);
    MPI_Barrier(MPI_COMM_WORLD);
}

// Several ranks per process (thread groups): T = 2 rank threads per process, global rank
// g = process * 2 + thread. Groups: every rank ("world"), the two ranks of a process ("local",
// members in one process) and the ranks with the same thread index ("cross", one per process).
TEST(MpiComm, ThreadGroupsWithTwoRanksPerProcess) {
    constexpr int T = 2;
    const int P = g_mpi->worldSize(), world = P * T;
    ASSERT_TRUE(g_mpi->enableThreadGroups().isOk());
    std::vector<int> processOf;
    for (int g = 0; g < world; ++g) processOf.push_back(g / T);
    auto be = makeCpuBackend(T);
    std::vector<std::string> errors(T);
    auto rankThread = [&](int t) {
        const int g = g_mpi->worldRank() * T + t;
        std::string& err = errors[size_t(t)];
        auto fail = [&](const std::string& what) {
            if (err.empty()) err = "rank " + std::to_string(g) + ": " + what;
        };
        auto s = be->device(t).createStream(trace::TrackKind::Comm, "comm");
        std::vector<int> all(static_cast<size_t>(world)), local, cross;
        std::iota(all.begin(), all.end(), 0);
        for (int u = 0; u < T; ++u) local.push_back(g_mpi->worldRank() * T + u);
        for (int p = 0; p < P; ++p) cross.push_back(p * T + t);
        auto cw = g_mpi->createThreadGroup("world", 0, all, g, processOf, 20s);
        auto cl = g_mpi->createThreadGroup("local", 1, local, g, processOf, 20s);
        auto cc = g_mpi->createThreadGroup("cross", 2, cross, g, processOf, 20s);
        auto cw2 = g_mpi->createThreadGroup("world", 0, all, g, processOf, 20s);  // a second instance
        if (!cw.isOk() || !cl.isOk() || !cc.isOk() || !cw2.isOk()) return fail("group creation failed");
        Communicator& w = **cw;
        if (w.rank() != g || w.size() != world) return fail("world rank/size");
        const size_t c = 13;
        // all-reduce sum / max (f32), bf16 sum, i64 min; on the second instance of "world" too.
        std::vector<float> sum(c), mx(c), sum2(c);
        std::vector<uint16_t> b(c);
        std::vector<int64_t> mn(c);
        for (size_t i = 0; i < c; ++i) {
            sum[i] = float(g + 1) * float(i);
            mx[i] = float((g * 7 + int(i)) % 5);
            sum2[i] = 1.0f;
            b[i] = bf16(float(g + int(i % 3)));
            mn[i] = int64_t(100 - g) * int64_t(i + 1);
        }
        w.allReduce(*s, sum.data(), sum.data(), c, DType::F32, ReduceOp::Sum);
        w.allReduce(*s, mx.data(), mx.data(), c, DType::F32, ReduceOp::Max);
        (*cw2)->allReduce(*s, sum2.data(), sum2.data(), c, DType::F32, ReduceOp::Sum);
        w.allReduce(*s, b.data(), b.data(), c, DType::BF16, ReduceOp::Sum);
        w.allReduce(*s, mn.data(), mn.data(), c, DType::I64, ReduceOp::Min);
        // reduce-scatter over "cross", all-gather over "local", broadcast from the last world rank.
        const int nc = (*cc)->size(), mc = (*cc)->rank();
        std::vector<float> rsIn(c * size_t(nc)), rs(c);
        for (size_t i = 0; i < rsIn.size(); ++i) rsIn[i] = float(g) + float(i);
        (*cc)->reduceScatter(*s, rsIn.data(), rs.data(), c, DType::F32, ReduceOp::Sum);
        std::vector<int32_t> ag(c * T, -1);
        for (size_t i = 0; i < c; ++i) ag[size_t(t) * c + i] = int32_t(g * 100 + int(i));
        (*cl)->allGather(*s, ag.data() + size_t(t) * c, ag.data(), c, DType::I32);
        std::vector<int64_t> bc(5, g);
        w.broadcast(*s, bc.data(), bc.size(), DType::I64, world - 1);
        // all-to-all-v over "world": rank q sends q+p+1 values q*10+p to rank p.
        std::vector<size_t> sc(static_cast<size_t>(world)), rc(static_cast<size_t>(world));
        std::vector<float> a2aSend, a2aRecv;
        for (int p = 0; p < world; ++p) {
            sc[size_t(p)] = size_t(g + p + 1);
            rc[size_t(p)] = size_t(p + g + 1);
            for (size_t i = 0; i < sc[size_t(p)]; ++i) a2aSend.push_back(float(g * 10 + p));
        }
        a2aRecv.assign(std::accumulate(rc.begin(), rc.end(), size_t(0)), -1.0f);
        w.allToAllv(*s, a2aSend.data(), sc, a2aRecv.data(), rc, DType::F32);
        // ring send/recv over "world" (neighbours in this and the other process).
        const int next = (g + 1) % world, prev = (g + world - 1) % world;
        std::vector<int64_t> out(3, g), fromPrev(3, -1);
        w.batchSendRecv(*s, {{P2POp::Send, next, out.data(), 3, DType::I64, 0},
                             {P2POp::Recv, prev, fromPrev.data(), 3, DType::I64, 0}});
        const Status st = s->synchronize();
        if (!st.isOk()) return fail(st.toString());
        for (size_t i = 0; i < c; ++i) {
            if (sum[i] != float(world * (world + 1) / 2) * float(i)) return fail("f32 sum");
            float m = 0;
            for (int q = 0; q < world; ++q) m = std::max(m, float((q * 7 + int(i)) % 5));
            if (mx[i] != m) return fail("f32 max");
            if (sum2[i] != float(world)) return fail("second instance sum");
            float bs = 0;
            for (int q = 0; q < world; ++q) bs += float(q + int(i % 3));
            if (unbf16(b[i]) != bs) return fail("bf16 sum");
            if (mn[i] != int64_t(100 - (world - 1)) * int64_t(i + 1)) return fail("i64 min");
            float r = 0;
            for (int q = 0; q < nc; ++q) r += float(q * T + t) + float(size_t(mc) * c + i);
            if (rs[i] != r) return fail("reduce-scatter");
            for (int u = 0; u < T; ++u)
                if (ag[size_t(u) * c + i] != (g_mpi->worldRank() * T + u) * 100 + int(i)) return fail("all-gather");
        }
        for (auto v : bc)
            if (v != world - 1) return fail("broadcast");
        size_t off = 0;
        for (int q = 0; q < world; ++q)
            for (size_t i = 0; i < rc[size_t(q)]; ++i)
                if (a2aRecv[off++] != float(q * 10 + g)) return fail("all-to-all");
        for (auto v : fromPrev)
            if (v != prev) return fail("send/recv");
    };
    std::vector<std::thread> threads;
    for (int t = 0; t < T; ++t) threads.emplace_back(rankThread, t);
    for (auto& th : threads) th.join();
    for (const auto& e : errors) EXPECT_EQ(e, "");
}

int main(int argc, char** argv) {
    ::testing::InitGoogleTest(&argc, argv);
    auto rt = MpiRuntime::init(&argc, &argv);
    if (!rt.isOk()) {
        std::fprintf(stderr, "%s\n", rt.status().toString().c_str());
        return 1;
    }
    g_mpi = rt.value().get();
    if (g_mpi->worldRank() != 0) {
        auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
        delete listeners.Release(listeners.default_result_printer());
    }
    int failed = RUN_ALL_TESTS();
    // Every rank must agree on the exit code so mpirun reports a failure anywhere.
    int anyFailed = 0;
    MPI_Allreduce(&failed, &anyFailed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    g_mpi = nullptr;
    rt.value().reset();
    return anyFailed ? 1 : 0;
}
