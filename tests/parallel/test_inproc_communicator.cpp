// In-process communicator: every collective against a serial reference for group sizes 1..8,
// several dtypes and reduce ops, in-place variants, p2p, all-to-all(v), the nccl-tests byte
// accounting, a bounded concurrency stress test, and the timeout / abort / mismatch guards.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/comm/inproc_communicator.h"

using namespace ts;
using namespace ts::engine;
using namespace std::chrono_literals;

namespace {

// One virtual device + one comm stream per rank; communicators of one group over all ranks.
struct Rig {
    explicit Rig(int n, std::chrono::milliseconds timeout = 10'000ms)
        : world(n, CommOptions{timeout}), backend(makeCpuBackend(n)) {
        for (int r = 0; r < n; ++r)
            streams.push_back(backend->device(r).createStream(trace::TrackKind::Comm, "comm"));
    }
    std::vector<std::unique_ptr<Communicator>> group(const std::string& name, const std::vector<int>& ranks) {
        std::vector<std::unique_ptr<Communicator>> out;
        for (int r : ranks) {
            auto c = world.join(name, ranks, r);
            EXPECT_TRUE(c.isOk()) << c.status().toString();
            out.push_back(std::move(c).value());
        }
        return out;
    }
    std::vector<std::unique_ptr<Communicator>> all(int n) {
        std::vector<int> ranks(static_cast<size_t>(n));
        for (int i = 0; i < n; ++i) ranks[size_t(i)] = i;
        return group("world", ranks);
    }
    Status sync(int r) { return streams[size_t(r)]->synchronize(); }
    void syncAll() {
        for (size_t r = 0; r < streams.size(); ++r) ASSERT_TRUE(streams[r]->synchronize().isOk()) << "rank " << r;
    }
    Stream& s(int r) { return *streams[size_t(r)]; }

    CommWorld world;
    std::unique_ptr<Backend> backend;
    std::vector<std::unique_ptr<Stream>> streams;  // destroyed before the backend
};

// Values that are exact in every dtype under test (small integers) so that the reference is
// plain integer arithmetic and does not share any rounding code with the implementation.
int64_t valueAt(int rank, size_t i, int salt) {
    return int64_t((rank * 7 + int(i % 13) * 3 + salt) % 17) - 8;  // in [-8, 8]
}

uint16_t bf16Of(float f) {  // exact for the small integers used here
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return uint16_t(u >> 16);
}
float floatOfBf16(uint16_t b) {
    uint32_t u = uint32_t(b) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// Typed buffer filled from valueAt, read back as double.
struct TypedBuf {
    DType t;
    std::vector<uint8_t> bytes;
    TypedBuf(DType type, size_t count) : t(type), bytes(count * dtypeSize(type)) {}
    void* data() { return bytes.data(); }
    size_t count() const { return bytes.size() / dtypeSize(t); }
    void set(size_t i, double v) {
        switch (t) {
            case DType::F32: { float f = float(v); std::memcpy(&bytes[i * 4], &f, 4); break; }
            case DType::BF16: { uint16_t b = bf16Of(float(v)); std::memcpy(&bytes[i * 2], &b, 2); break; }
            case DType::I32: { int32_t x = int32_t(v); std::memcpy(&bytes[i * 4], &x, 4); break; }
            case DType::I64: { int64_t x = int64_t(v); std::memcpy(&bytes[i * 8], &x, 8); break; }
            default: FAIL();
        }
    }
    double get(size_t i) const {
        switch (t) {
            case DType::F32: { float f; std::memcpy(&f, &bytes[i * 4], 4); return f; }
            case DType::BF16: { uint16_t b; std::memcpy(&b, &bytes[i * 2], 2); return floatOfBf16(b); }
            case DType::I32: { int32_t x; std::memcpy(&x, &bytes[i * 4], 4); return x; }
            case DType::I64: { int64_t x; std::memcpy(&x, &bytes[i * 8], 8); return double(x); }
            default: return NAN;
        }
    }
};

// Serial reference of a reduction over ranks of valueAt(rank, i).
double reference(ReduceOp op, int n, size_t i, int salt, DType t) {
    double acc = double(valueAt(0, i, salt));
    for (int r = 1; r < n; ++r) {
        const double v = double(valueAt(r, i, salt));
        if (op == ReduceOp::Max) acc = std::max(acc, v);
        else if (op == ReduceOp::Min) acc = std::min(acc, v);
        else acc += v;
    }
    if (op == ReduceOp::Avg) {
        if (t == DType::I32 || t == DType::I64) return double(int64_t(acc) / n);  // C++ truncation
        acc /= n;
        if (t == DType::BF16) return floatOfBf16(bf16Of(float(acc)));  // checked with a tolerance
    }
    return acc;
}

double tolerance(DType t, double ref) {
    if (t == DType::F32) return 1e-6 * std::max(1.0, std::fabs(ref));
    if (t == DType::BF16) return std::ldexp(std::max(1.0, std::fabs(ref)), -7);  // 1 bf16 ulp
    return 0;
}

const DType kDtypes[] = {DType::F32, DType::BF16, DType::I32, DType::I64};
const ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg};

}  // namespace

TEST(InprocComm, AllReduceMatchesSerialReference) {
    for (int n : {1, 2, 3, 4, 5, 8}) {
        Rig rig(n);
        auto comms = rig.all(n);
        for (DType t : kDtypes)
            for (ReduceOp op : kOps)
                for (size_t count : {size_t(1), size_t(3), size_t(1003)})
                    for (bool inPlace : {false, true}) {
                        const int salt = int(count) + int(op) * 5;
                        std::vector<TypedBuf> send, recv;
                        for (int r = 0; r < n; ++r) {
                            send.emplace_back(t, count);
                            recv.emplace_back(t, count);
                            for (size_t i = 0; i < count; ++i) send.back().set(i, double(valueAt(r, i, salt)));
                        }
                        for (int r = 0; r < n; ++r) {
                            auto& out = inPlace ? send[size_t(r)] : recv[size_t(r)];
                            comms[size_t(r)]->allReduce(rig.s(r), send[size_t(r)].data(), out.data(), count, t, op);
                        }
                        rig.syncAll();
                        for (int r = 0; r < n; ++r) {
                            auto& out = inPlace ? send[size_t(r)] : recv[size_t(r)];
                            for (size_t i = 0; i < count; ++i) {
                                const double ref = reference(op, n, i, salt, t);
                                ASSERT_NEAR(out.get(i), ref, tolerance(t, ref))
                                    << "n=" << n << " " << dtypeName(t) << " op=" << int(op) << " count=" << count
                                    << " inPlace=" << inPlace << " rank=" << r << " i=" << i;
                            }
                        }
                    }
    }
}

TEST(InprocComm, Bf16SumsInFp32AndRoundsOnceToNearestEven) {
    // bf16 ulp at 1.0 is 2^-7. Values chosen by hand:
    //  {1, 2^-8, 2^-8}: fp32 sum 1 + 2^-7 (exact). Accumulating in bf16 would give 1 (each
    //                   1 + 2^-8 is a tie that rounds to the even 1).
    //  {1, 2^-8}:       1 + 2^-8 is a tie between 1 and 1 + 2^-7 -> even mantissa: 1.
    //  {1 + 2^-7, 2^-8}: tie between 1 + 2^-7 and 1 + 2^-6 -> even mantissa: 1 + 2^-6.
    struct Case {
        std::vector<float> values;
        float expected;
    };
    const float u8 = std::ldexp(1.0f, -8), u7 = std::ldexp(1.0f, -7), u6 = std::ldexp(1.0f, -6);
    const Case cases[] = {{{1.0f, u8, u8}, 1.0f + u7}, {{1.0f, u8}, 1.0f}, {{1.0f + u7, u8}, 1.0f + u6}};
    for (const Case& c : cases) {
        const int n = int(c.values.size());
        Rig rig(n);
        auto comms = rig.all(n);
        std::vector<uint16_t> buf(static_cast<size_t>(n));
        for (int r = 0; r < n; ++r) buf[size_t(r)] = bf16Of(c.values[size_t(r)]);
        for (int r = 0; r < n; ++r)
            comms[size_t(r)]->allReduce(rig.s(r), &buf[size_t(r)], &buf[size_t(r)], 1, DType::BF16, ReduceOp::Sum);
        rig.syncAll();
        for (int r = 0; r < n; ++r) EXPECT_EQ(floatOfBf16(buf[size_t(r)]), c.expected) << "n=" << n << " r=" << r;
    }
}

TEST(InprocComm, ReduceScatterMatchesSerialReference) {
    for (int n : {1, 2, 3, 4, 6, 8}) {
        Rig rig(n);
        auto comms = rig.all(n);
        for (DType t : kDtypes)
            for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg})
                for (size_t rc : {size_t(1), size_t(37)})
                    for (bool inPlace : {false, true}) {
                        const int salt = int(rc) + 11 * int(op);
                        std::vector<TypedBuf> send, recv;
                        for (int r = 0; r < n; ++r) {
                            send.emplace_back(t, rc * size_t(n));
                            recv.emplace_back(t, rc);
                            for (size_t i = 0; i < rc * size_t(n); ++i) send.back().set(i, double(valueAt(r, i, salt)));
                        }
                        for (int r = 0; r < n; ++r) {
                            void* out = inPlace ? send[size_t(r)].bytes.data() + size_t(r) * rc * dtypeSize(t)
                                                : recv[size_t(r)].data();
                            comms[size_t(r)]->reduceScatter(rig.s(r), send[size_t(r)].data(), out, rc, t, op);
                        }
                        rig.syncAll();
                        for (int r = 0; r < n; ++r)
                            for (size_t i = 0; i < rc; ++i) {
                                const size_t gi = size_t(r) * rc + i;
                                const double got = inPlace ? send[size_t(r)].get(gi) : recv[size_t(r)].get(i);
                                const double ref = reference(op, n, gi, salt, t);
                                ASSERT_NEAR(got, ref, tolerance(t, ref))
                                    << "n=" << n << " " << dtypeName(t) << " inPlace=" << inPlace << " r=" << r;
                            }
                    }
    }
}

TEST(InprocComm, AllGatherAndBroadcastMatchReference) {
    for (int n : {1, 2, 3, 5, 8}) {
        Rig rig(n);
        auto comms = rig.all(n);
        for (bool inPlace : {false, true}) {
            const size_t c = 29;
            std::vector<std::vector<int32_t>> send(static_cast<size_t>(n), std::vector<int32_t>(c)),
                recv(static_cast<size_t>(n), std::vector<int32_t>(c * size_t(n), -1));
            for (int r = 0; r < n; ++r)
                for (size_t i = 0; i < c; ++i) {
                    send[size_t(r)][i] = int32_t(r * 1000 + int(i));
                    if (inPlace) recv[size_t(r)][size_t(r) * c + i] = send[size_t(r)][i];
                }
            for (int r = 0; r < n; ++r) {
                const void* src = inPlace ? recv[size_t(r)].data() + size_t(r) * c : send[size_t(r)].data();
                comms[size_t(r)]->allGather(rig.s(r), src, recv[size_t(r)].data(), c, DType::I32);
            }
            rig.syncAll();
            for (int r = 0; r < n; ++r)
                for (int q = 0; q < n; ++q)
                    for (size_t i = 0; i < c; ++i)
                        ASSERT_EQ(recv[size_t(r)][size_t(q) * c + i], q * 1000 + int(i)) << n << " " << r;
        }
        for (int root = 0; root < n; ++root) {
            std::vector<std::vector<uint16_t>> buf(static_cast<size_t>(n), std::vector<uint16_t>(100));
            for (int r = 0; r < n; ++r)
                for (size_t i = 0; i < 100; ++i) buf[size_t(r)][i] = uint16_t(r * 100 + int(i));
            for (int r = 0; r < n; ++r) comms[size_t(r)]->broadcast(rig.s(r), buf[size_t(r)].data(), 100, DType::BF16, root);
            rig.syncAll();
            for (int r = 0; r < n; ++r)
                for (size_t i = 0; i < 100; ++i) ASSERT_EQ(buf[size_t(r)][i], uint16_t(root * 100 + int(i)));
        }
    }
}

TEST(InprocComm, AllToAllvMovesEveryBlockToItsPeer) {
    std::mt19937 rng(7);
    for (int n : {1, 2, 3, 4, 8}) {
        Rig rig(n);
        auto comms = rig.all(n);
        // counts[q][p]: elements rank q sends to rank p (some zero).
        std::vector<std::vector<size_t>> counts(static_cast<size_t>(n), std::vector<size_t>(static_cast<size_t>(n)));
        for (auto& row : counts)
            for (auto& c : row) c = rng() % 4 == 0 ? 0 : rng() % 50;
        std::vector<std::vector<float>> send(static_cast<size_t>(n)), recv(static_cast<size_t>(n));
        std::vector<std::vector<size_t>> recvCounts(static_cast<size_t>(n), std::vector<size_t>(static_cast<size_t>(n)));
        for (int q = 0; q < n; ++q) {
            for (int p = 0; p < n; ++p) {
                for (size_t i = 0; i < counts[size_t(q)][size_t(p)]; ++i)
                    send[size_t(q)].push_back(float(q * 10000 + p * 100 + int(i)));
                recvCounts[size_t(p)][size_t(q)] = counts[size_t(q)][size_t(p)];
            }
        }
        for (int p = 0; p < n; ++p) {
            size_t total = 0;
            for (size_t c : recvCounts[size_t(p)]) total += c;
            recv[size_t(p)].assign(total, -1.0f);
        }
        for (int r = 0; r < n; ++r)
            comms[size_t(r)]->allToAllv(rig.s(r), send[size_t(r)].data(), counts[size_t(r)], recv[size_t(r)].data(),
                                        recvCounts[size_t(r)], DType::F32);
        rig.syncAll();
        for (int p = 0; p < n; ++p) {
            size_t off = 0;
            for (int q = 0; q < n; ++q)
                for (size_t i = 0; i < recvCounts[size_t(p)][size_t(q)]; ++i, ++off)
                    ASSERT_EQ(recv[size_t(p)][off], float(q * 10000 + p * 100 + int(i))) << n << " " << p << " " << q;
        }
    }
}

TEST(InprocComm, BatchSendRecvRingBothDirectionsAndSelf) {
    for (int n : {1, 2, 3, 4}) {
        Rig rig(n);
        auto comms = rig.all(n);
        const size_t c = 64;
        std::vector<std::vector<float>> out(static_cast<size_t>(n), std::vector<float>(c)), fromPrev(static_cast<size_t>(n), std::vector<float>(c)),
            fromNext(static_cast<size_t>(n), std::vector<float>(c)), self(static_cast<size_t>(n), std::vector<float>(c));
        for (int r = 0; r < n; ++r)
            for (size_t i = 0; i < c; ++i) out[size_t(r)][i] = float(r * 1000 + int(i));
        for (int r = 0; r < n; ++r) {
            const int next = (r + 1) % n, prev = (r + n - 1) % n;
            // Posting order differs by parity (as Megatron does) yet nothing can deadlock.
            std::vector<P2POp> ops = {
                {P2POp::Send, next, out[size_t(r)].data(), c, DType::F32, 0},
                {P2POp::Recv, prev, fromPrev[size_t(r)].data(), c, DType::F32, 0},
                {P2POp::Send, prev, out[size_t(r)].data(), c, DType::F32, 1},
                {P2POp::Recv, next, fromNext[size_t(r)].data(), c, DType::F32, 1},
                {P2POp::Send, r, out[size_t(r)].data(), c, DType::F32, 9},
                {P2POp::Recv, r, self[size_t(r)].data(), c, DType::F32, 9},
            };
            if (r % 2) std::reverse(ops.begin(), ops.end());
            comms[size_t(r)]->batchSendRecv(rig.s(r), ops);
        }
        rig.syncAll();
        for (int r = 0; r < n; ++r) {
            const int next = (r + 1) % n, prev = (r + n - 1) % n;
            for (size_t i = 0; i < c; ++i) {
                ASSERT_EQ(fromPrev[size_t(r)][i], float(prev * 1000 + int(i)));
                ASSERT_EQ(fromNext[size_t(r)][i], float(next * 1000 + int(i)));
                ASSERT_EQ(self[size_t(r)][i], float(r * 1000 + int(i)));
            }
            EXPECT_EQ(comms[size_t(r)]->stats().bytesSent, 3 * c * 4);
            EXPECT_EQ(comms[size_t(r)]->stats().bytesReceived, 3 * c * 4);
        }
    }
}

TEST(InprocComm, BytesMovedFollowNcclTestsAccounting) {
    const int n = 4;
    Rig rig(n);
    auto comms = rig.all(n);
    const size_t count = 1000;
    std::vector<std::vector<float>> a(n, std::vector<float>(count * n, 1.0f)), b(n, std::vector<float>(count * n));
    for (int r = 0; r < n; ++r) comms[size_t(r)]->allReduce(rig.s(r), a[size_t(r)].data(), b[size_t(r)].data(), count, DType::F32, ReduceOp::Sum);
    rig.syncAll();
    // nccl-tests: allReduce busBw factor 2(n-1)/n of S = count*4 bytes.
    const uint64_t arBytes = uint64_t(count * 4 * 2 * (n - 1) / n);
    for (int r = 0; r < n; ++r) {
        EXPECT_EQ(comms[size_t(r)]->stats().ops, 1u);
        EXPECT_EQ(comms[size_t(r)]->stats().bytesSent, arBytes);
        EXPECT_EQ(comms[size_t(r)]->stats().bytesReceived, arBytes);
    }
    for (int r = 0; r < n; ++r) comms[size_t(r)]->allGather(rig.s(r), a[size_t(r)].data(), b[size_t(r)].data(), count, DType::F32);
    rig.syncAll();
    // allGather: S = sendCount*n*4, factor (n-1)/n.
    const uint64_t agBytes = uint64_t(count * n * 4 * (n - 1) / n);
    EXPECT_EQ(comms[1]->stats().bytesSent, arBytes + agBytes);
    EXPECT_DOUBLE_EQ(busBwFactor(CollectiveKind::AllReduce, 8), 1.75);
    EXPECT_DOUBLE_EQ(busBwFactor(CollectiveKind::AllGather, 8), 0.875);
    EXPECT_DOUBLE_EQ(busBwFactor(CollectiveKind::Broadcast, 8), 1.0);
}

// Many groups, many ops in flight, ops of different groups interleaving on different streams,
// each rank driven by its own thread (as the trainer does).
TEST(InprocComm, ConcurrentGroupsOnSeveralStreamsStayCorrect) {
    const int n = 8, iters = 40;
    CommWorld world(n, CommOptions{20'000ms});
    auto be = makeCpuBackend(n);
    std::vector<std::thread> threads;
    std::vector<int> failures(n, 0);
    for (int r = 0; r < n; ++r) {
        threads.emplace_back([&, r] {
            Device& dev = be->device(r);
            auto tpStream = dev.createStream(trace::TrackKind::Comm, "comm tp");
            auto dpStream = dev.createStream(trace::TrackKind::Comm, "comm dp");
            auto wStream = dev.createStream(trace::TrackKind::Comm, "comm world");
            const std::vector<int> tp = {r & ~1, (r & ~1) + 1};
            const std::vector<int> dp = (r % 2 == 0) ? std::vector<int>{0, 2, 4, 6} : std::vector<int>{1, 3, 5, 7};
            std::vector<int> all(n);
            for (int i = 0; i < n; ++i) all[size_t(i)] = i;
            auto tpc = world.join("tp", tp, r);
            auto dpc = world.join("dp", dp, r);
            auto wc = world.join("world", all, r);
            if (!tpc.isOk() || !dpc.isOk() || !wc.isOk()) {
                failures[size_t(r)] = 1000;
                return;
            }
            const size_t c = 257;
            std::vector<std::vector<float>> tpBuf(iters, std::vector<float>(c)), dpBuf(iters, std::vector<float>(c));
            std::vector<std::vector<int32_t>> wBuf(iters, std::vector<int32_t>(c * n));
            for (int it = 0; it < iters; ++it) {
                for (size_t i = 0; i < c; ++i) {
                    tpBuf[size_t(it)][i] = float(r + it);
                    dpBuf[size_t(it)][i] = float(r * it + int(i % 5));
                }
                (*tpc)->allReduce(*tpStream, tpBuf[size_t(it)].data(), tpBuf[size_t(it)].data(), c, DType::F32, ReduceOp::Sum);
                (*dpc)->allReduce(*dpStream, dpBuf[size_t(it)].data(), dpBuf[size_t(it)].data(), c, DType::F32, ReduceOp::Max);
                std::vector<int32_t> mine(c, int32_t(r * 100 + it));
                // allGather reads `mine` on the stream thread: keep it alive by gathering in place.
                std::copy(mine.begin(), mine.end(), wBuf[size_t(it)].begin() + long(size_t(r) * c));
                (*wc)->allGather(*wStream, wBuf[size_t(it)].data() + size_t(r) * c, wBuf[size_t(it)].data(), c, DType::I32);
            }
            if (!tpStream->synchronize().isOk() || !dpStream->synchronize().isOk() || !wStream->synchronize().isOk()) {
                failures[size_t(r)] = 999;
                return;
            }
            const int partner = r ^ 1;
            for (int it = 0; it < iters; ++it)
                for (size_t i = 0; i < c; ++i) {
                    failures[size_t(r)] += tpBuf[size_t(it)][i] != float(r + it + partner + it);
                    float mx = -1;
                    for (int q : dp) mx = std::max(mx, float(q * it + int(i % 5)));
                    failures[size_t(r)] += dpBuf[size_t(it)][i] != mx;
                    for (int q = 0; q < n; ++q) failures[size_t(r)] += wBuf[size_t(it)][size_t(q) * c + i] != q * 100 + it;
                }
        });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < n; ++r) EXPECT_EQ(failures[size_t(r)], 0) << "rank " << r;
}

TEST(InprocComm, TimeoutNamesGroupOpRankAndMissingRanks) {
    Rig rig(3, 300ms);
    auto comms = rig.group("dp", {0, 1, 2});
    std::vector<float> buf(3, 1.0f);
    const auto t0 = std::chrono::steady_clock::now();
    comms[0]->allReduce(rig.s(0), buf.data(), buf.data(), 1, DType::F32, ReduceOp::Sum);
    comms[1]->allReduce(rig.s(1), buf.data() + 1, buf.data() + 1, 1, DType::F32, ReduceOp::Sum);
    // rank 2 never calls.
    Status s0 = rig.sync(0), s1 = rig.sync(1);
    const auto elapsed = std::chrono::steady_clock::now() - t0;
    EXPECT_LT(elapsed, 5s);
    for (const Status* s : {&s0, &s1}) {
        EXPECT_EQ(s->code(), ErrorCode::Timeout) << s->toString();
        EXPECT_NE(s->message().find("all_reduce"), std::string::npos) << s->message();
        EXPECT_NE(s->message().find("'dp'"), std::string::npos) << s->message();
        EXPECT_NE(s->message().find("never arrived: 2 (global 2)"), std::string::npos) << s->message();
    }
    // The rank that timed out first names itself; the other one says it was aborted.
    EXPECT_TRUE(s0.message().find("on rank 0 (global 0)") != std::string::npos ||
                s1.message().find("on rank 1 (global 1)") != std::string::npos);
}

TEST(InprocComm, P2PTimeoutNamesThePeer) {
    Rig rig(2, 200ms);
    auto comms = rig.group("pp", {0, 1});
    std::vector<float> buf(4);
    comms[1]->batchSendRecv(rig.s(1), {{P2POp::Recv, 0, buf.data(), 4, DType::F32, 0}});
    Status s = rig.sync(1);
    EXPECT_EQ(s.code(), ErrorCode::Timeout);
    EXPECT_NE(s.message().find("rank 0 (global 0) never sent"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("'pp'"), std::string::npos) << s.message();
}

TEST(InprocComm, AbortMakesPendingAndFutureOpsFailFast) {
    Rig rig(3, 60'000ms);
    auto comms = rig.all(3);
    std::vector<float> buf(3, 1.0f);
    const auto t0 = std::chrono::steady_clock::now();
    comms[0]->allReduce(rig.s(0), buf.data(), buf.data(), 1, DType::F32, ReduceOp::Sum);
    comms[1]->allReduce(rig.s(1), buf.data() + 1, buf.data() + 1, 1, DType::F32, ReduceOp::Sum);
    std::this_thread::sleep_for(50ms);
    rig.world.abort(Status::numerical("rank 2: loss is NaN at step 3"));
    Status s0 = rig.sync(0), s1 = rig.sync(1);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
    for (const Status* s : {&s0, &s1}) {
        EXPECT_EQ(s->code(), ErrorCode::CommError) << s->toString();
        EXPECT_NE(s->message().find("rank 2: loss is NaN at step 3"), std::string::npos) << s->message();
    }
    EXPECT_EQ(rig.world.abortStatus().code(), ErrorCode::NumericalError);
    // A fresh stream: a future op fails at once instead of waiting for peers.
    auto fresh = rig.backend->device(2).createStream(trace::TrackKind::Comm, "late");
    comms[2]->allReduce(*fresh, buf.data() + 2, buf.data() + 2, 1, DType::F32, ReduceOp::Sum);
    EXPECT_EQ(fresh->synchronize().code(), ErrorCode::CommError);
    // Groups joined after the abort are born aborted.
    auto late = rig.world.join("late", {0}, 0);
    ASSERT_TRUE(late.isOk());
    (*late)->allReduce(*fresh, buf.data(), buf.data(), 1, DType::F32, ReduceOp::Sum);
    EXPECT_FALSE(fresh->synchronize().isOk());
}

TEST(InprocComm, MismatchedCallsFailOnEveryMember) {
    Rig rig(2);
    auto comms = rig.all(2);
    std::vector<float> a(16), b(16);
    comms[0]->allReduce(rig.s(0), a.data(), a.data(), 10, DType::F32, ReduceOp::Sum);
    comms[1]->allReduce(rig.s(1), b.data(), b.data(), 12, DType::F32, ReduceOp::Sum);
    Status s0 = rig.sync(0), s1 = rig.sync(1);
    EXPECT_EQ(s0.code(), ErrorCode::InvalidArgument) << s0.toString();
    EXPECT_EQ(s1.code(), ErrorCode::InvalidArgument) << s1.toString();
    EXPECT_NE(s0.message().find("count=12"), std::string::npos) << s0.message();
}

TEST(InprocComm, UnsupportedReductionDtypeIsReported) {
    Rig rig(2);
    auto comms = rig.all(2);
    std::vector<uint8_t> a(8);
    for (int r = 0; r < 2; ++r) comms[size_t(r)]->allReduce(rig.s(r), a.data(), a.data(), 4, DType::F16, ReduceOp::Sum);
    Status s = rig.sync(0);
    EXPECT_EQ(s.code(), ErrorCode::Unsupported) << s.toString();
    EXPECT_NE(s.message().find("f16"), std::string::npos);
}

TEST(InprocComm, JoinValidatesMembership) {
    CommWorld w(4);
    EXPECT_EQ(w.join("tp", {0, 1}, 2).status().code(), ErrorCode::InvalidArgument);
    EXPECT_EQ(w.join("tp", {0, 0}, 0).status().code(), ErrorCode::InvalidArgument);
    EXPECT_EQ(w.join("tp", {0, 4}, 0).status().code(), ErrorCode::InvalidArgument);
    EXPECT_EQ(w.join("tp", {}, 0).status().code(), ErrorCode::InvalidArgument);
    auto c = w.join("tp", {3, 1}, 1);
    ASSERT_TRUE(c.isOk());
    EXPECT_EQ((*c)->rank(), 1);
    EXPECT_EQ((*c)->size(), 2);
    EXPECT_EQ((*c)->name(), "tp");
    EXPECT_EQ((*c)->globalRanks(), (std::vector<int>{3, 1}));
}

TEST(InprocComm, SecondJoinOfTheSameGroupIsAnIndependentCommunicator) {
    Rig rig(2);
    auto first = rig.all(2);
    auto second = rig.all(2);
    auto be2 = rig.backend.get();
    auto other0 = be2->device(0).createStream(trace::TrackKind::Comm, "comm 2");
    auto other1 = be2->device(1).createStream(trace::TrackKind::Comm, "comm 2");
    std::vector<float> a = {1, 2}, b = {10, 20};
    // Ops of the two communicators interleave on different streams without cross-matching.
    first[0]->allReduce(rig.s(0), &a[0], &a[0], 1, DType::F32, ReduceOp::Sum);
    second[0]->allReduce(*other0, &b[0], &b[0], 1, DType::F32, ReduceOp::Sum);
    second[1]->allReduce(*other1, &b[1], &b[1], 1, DType::F32, ReduceOp::Sum);
    first[1]->allReduce(rig.s(1), &a[1], &a[1], 1, DType::F32, ReduceOp::Sum);
    rig.syncAll();
    ASSERT_TRUE(other0->synchronize().isOk());
    ASSERT_TRUE(other1->synchronize().isOk());
    EXPECT_EQ(a, (std::vector<float>{3, 3}));
    EXPECT_EQ(b, (std::vector<float>{30, 30}));
}

// Blocking joins (CommOptions::blockingJoins, ncclCommInitRank's rule): a join returns once every
// member joined; one member alone fails at the timeout saying how many came; an abort wakes a
// waiting join at once; non-blocking worlds return at once.
namespace ts::engine {
namespace {

TEST(InprocComm, BlockingJoinsWaitForEveryMember) {
    CommOptions o;
    o.blockingJoins = true;
    o.timeout = std::chrono::milliseconds(10'000);
    CommWorld w(3, o);
    Result<std::unique_ptr<Communicator>> a = Status::internal("not joined");
    Result<std::unique_ptr<Communicator>> b = Status::internal("not joined");
    std::atomic<int> returned{0};
    std::thread t0([&] {
        a = w.join("g", {0, 1, 2}, 0);
        ++returned;
    });
    std::thread t1([&] {
        b = w.join("g", {0, 1, 2}, 1);
        ++returned;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_EQ(returned.load(), 0) << "a blocking join returned before every member joined";
    auto c = w.join("g", {0, 1, 2}, 2);
    t0.join();
    t1.join();
    ASSERT_TRUE(a.isOk()) << a.status().toString();
    ASSERT_TRUE(b.isOk()) << b.status().toString();
    ASSERT_TRUE(c.isOk()) << c.status().toString();
    EXPECT_EQ((*b)->rank(), 1);
}

TEST(InprocComm, ALoneBlockingJoinTimesOutAndAnAbortWakesOne) {
    CommOptions o;
    o.blockingJoins = true;
    o.timeout = std::chrono::milliseconds(100);
    CommWorld w(2, o);
    auto alone = w.join("tp", {0, 1}, 0);
    ASSERT_FALSE(alone.isOk());
    EXPECT_NE(alone.status().message().find("1 of 2 members joined"), std::string::npos) << alone.status().toString();
    EXPECT_NE(alone.status().message().find("'tp'"), std::string::npos) << alone.status().toString();

    o.timeout = std::chrono::milliseconds(60'000);
    CommWorld w2(2, o);
    Result<std::unique_ptr<Communicator>> waiting = Status::internal("not joined");
    const auto t0 = std::chrono::steady_clock::now();
    std::thread t([&] { waiting = w2.join("dp", {0, 1}, 0); });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    w2.abort(Status::internal("rank 1 failed while built"));
    t.join();
    ASSERT_FALSE(waiting.isOk());
    EXPECT_NE(waiting.status().message().find("rank 1 failed while built"), std::string::npos)
        << waiting.status().toString();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));

    CommWorld open(2);  // non-blocking (the default): returns at once
    EXPECT_TRUE(open.join("tp", {0, 1}, 0).isOk());
}

}  // namespace
}  // namespace ts::engine

// A stream with CUDA's execution model for communication: their fn runs at submit, on the calling
// thread (CudaStream::submit), while other ops queue on a CPU stream. What the in-process
// communicator meets on ranks that share a GPU.
class RunAtSubmitStream final : public Stream {
public:
    explicit RunAtSubmitStream(std::unique_ptr<Stream> queue) : m_q(std::move(queue)) {}
    void submit(const OpDesc& d, std::function<Status()> fn) override {
        if (d.category != trace::Category::Collective && d.category != trace::Category::P2P) {
            m_q->submit(d, std::move(fn));
            return;
        }
        CurrentStreamScope scope(this);
        if (Status st = fn(); !st.isOk() && m_error.isOk()) m_error = st;
    }
    void record(Event& e) override { m_q->record(e); }
    void wait(Event& e) override { m_q->wait(e); }
    Status synchronize() override {
        Status s = m_q->synchronize();
        return s.isOk() ? m_error : s;
    }
    void* native() override { return nullptr; }
    trace::TrackKind kind() const override { return m_q->kind(); }
    const std::string& name() const override { return m_q->name(); }

private:
    std::unique_ptr<Stream> m_q;
    Status m_error;
};

// An op that fills b [n] with `value` after 150 ms: earlier work a collective must wait for.
void submitSlowFill(Stream& s, float* b, size_t n, float value) {
    OpDesc fill;
    fill.name = "slow fill";
    s.submit(fill, [b, n, value] {
        std::this_thread::sleep_for(150ms);
        std::fill(b, b + n, value);
        return Status::ok();
    });
}

// hostSynchronized (ranks sharing a GPU run the in-process op on the host, between kernels): the
// op starts only after the work queued before it on its stream, and is done when the call returns,
// without the caller synchronizing. Without the wrapper the read below would see the zeros the
// slow fill has not yet overwritten.
TEST(HostSynchronized, AnOpWaitsForItsStreamAndIsDoneOnReturn) {
    Rig rig(2);
    std::vector<std::unique_ptr<Communicator>> comms;
    for (auto& c : rig.all(2)) comms.push_back(hostSynchronized(std::move(c)));
    ASSERT_EQ(comms[1]->rank(), 1);
    ASSERT_EQ(comms[0]->size(), 2);
    EXPECT_EQ(comms[0]->name(), "world");
    constexpr size_t n = 1000;
    std::vector<std::vector<float>> bufs(2, std::vector<float>(n, 0.f));
    std::vector<float> lo(2, -1.f), hi(2, -1.f);
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r)
        threads.emplace_back([&, r] {
            float* b = bufs[size_t(r)].data();
            submitSlowFill(rig.s(r), b, n, float(r + 1));
            comms[size_t(r)]->allReduce(rig.s(r), b, b, n, DType::F32, ReduceOp::Sum);
            lo[size_t(r)] = *std::min_element(b, b + n);
            hi[size_t(r)] = *std::max_element(b, b + n);
        });
    for (auto& t : threads) t.join();
    rig.syncAll();
    for (int r = 0; r < 2; ++r) {
        EXPECT_EQ(lo[size_t(r)], 3.f) << "rank " << r;
        EXPECT_EQ(hi[size_t(r)], 3.f) << "rank " << r;
    }
    EXPECT_EQ(comms[0]->stats().ops, 1u);
}

// A member whose stream failed before the collective does not leave the others to the deadlock
// guard: it aborts the group with its error, which the others' ops then name.
TEST(HostSynchronized, AFailedStreamAbortsTheGroupWithItsError) {
    Rig rig(2);
    std::vector<std::unique_ptr<Communicator>> comms;
    for (auto& c : rig.all(2)) comms.push_back(hostSynchronized(std::move(c)));
    std::vector<float> a(8, 1.f), b(8, 1.f);
    std::thread peer([&] { comms[1]->allReduce(rig.s(1), b.data(), b.data(), b.size(), DType::F32, ReduceOp::Sum); });
    OpDesc bad;
    bad.name = "bad kernel";
    rig.s(0).submit(bad, [] { return Status::internal("illegal address"); });
    comms[0]->allReduce(rig.s(0), a.data(), a.data(), a.size(), DType::F32, ReduceOp::Sum);
    peer.join();
    const Status mine = rig.sync(0), theirs = rig.sync(1);
    EXPECT_NE(mine.message().find("illegal address"), std::string::npos) << mine.toString();
    ASSERT_FALSE(theirs.isOk());
    EXPECT_NE(theirs.message().find("rank 0 failed before a collective of group 'world'"), std::string::npos)
        << theirs.toString();
    EXPECT_NE(theirs.message().find("illegal address"), std::string::npos) << theirs.toString();
}

// Where the op runs at submit (CUDA), the wait before it is what keeps it from reading buffers the
// stream's earlier work has not written yet: unwrapped, the same all-reduce sums the zeros.
TEST(HostSynchronized, AnOpRunAtSubmitStartsAfterItsStreamsEarlierWork) {
    for (const bool wrapped : {true, false}) {
        Rig rig(2);
        for (auto& s : rig.streams) s = std::make_unique<RunAtSubmitStream>(std::move(s));
        std::vector<std::unique_ptr<Communicator>> comms;
        for (auto& c : rig.all(2)) comms.push_back(wrapped ? hostSynchronized(std::move(c)) : std::move(c));
        constexpr size_t n = 1000;
        std::vector<std::vector<float>> send(2, std::vector<float>(n, 0.f)), recv(2, std::vector<float>(n, -1.f));
        std::vector<std::thread> threads;
        for (int r = 0; r < 2; ++r)
            threads.emplace_back([&, r] {
                float* b = send[size_t(r)].data();
                submitSlowFill(rig.s(r), b, n, float(r + 1));
                comms[size_t(r)]->allReduce(rig.s(r), b, recv[size_t(r)].data(), n, DType::F32, ReduceOp::Sum);
            });
        for (auto& t : threads) t.join();
        rig.syncAll();
        for (int r = 0; r < 2; ++r) {
            const auto [lo, hi] = std::minmax_element(recv[size_t(r)].begin(), recv[size_t(r)].end());
            if (wrapped) {
                EXPECT_EQ(*lo, 3.f) << "rank " << r;
                EXPECT_EQ(*hi, 3.f) << "rank " << r;
            } else {
                EXPECT_EQ(*hi, 0.f) << "rank " << r << ": the stream model no longer shows the hazard";
            }
        }
    }
}
