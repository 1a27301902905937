// In-process communicator (see inproc_communicator.h for the semantics).
//
// A collective runs in phases over a per-op Slot shared by the group's members:
//   1 arrive: post buffers and arguments; wait for everyone (the deadlock guard lives here);
//     validate that all members called the same op with the same arguments;
//   2 compute: each member produces its own part reading the others' buffers;
//   3 (allReduce only) gather the other members' reduced chunks;
//   last barrier: nobody returns while another member may still read its buffers.
// In-place calls (recv == send, or NCCL's recv + rank*count convention for reduceScatter and
// allGather) are safe because a member only ever writes the part of its own buffers that no
// other member reads in the same phase.
#include "engine/comm/inproc_communicator.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <tuple>

namespace ts::engine {

namespace {

using Clock = std::chrono::steady_clock;

enum class OpKind : uint8_t { AllReduce, ReduceScatter, AllGather, Broadcast, AllToAllv };

const char* opKindName(OpKind k) {
    switch (k) {
        case OpKind::AllReduce: return "all_reduce";
        case OpKind::ReduceScatter: return "reduce_scatter";
        case OpKind::AllGather: return "all_gather";
        case OpKind::Broadcast: return "broadcast";
        case OpKind::AllToAllv: return "all_to_all";
    }
    return "unknown";
}

const char* reduceOpName(ReduceOp op) {
    switch (op) {
        case ReduceOp::Sum: return "sum";
        case ReduceOp::Max: return "max";
        case ReduceOp::Min: return "min";
        case ReduceOp::Avg: return "avg";
    }
    return "unknown";
}

bool isReduction(OpKind k) { return k == OpKind::AllReduce || k == OpKind::ReduceScatter; }

// What one member passed to a collective.
struct Post {
    OpKind kind = OpKind::AllReduce;
    const void* send = nullptr;
    void* recv = nullptr;
    size_t count = 0;  // allReduce/broadcast: count; reduceScatter: recvCount; allGather: sendCount
    DType dtype = DType::F32;
    ReduceOp op = ReduceOp::Sum;
    int root = 0;
    std::vector<size_t> sendCounts, recvCounts;  // allToAllv
};

struct Slot {
    explicit Slot(int n) : posts(size_t(n)), phase(size_t(n), 0) {}
    std::vector<Post> posts;
    std::vector<int> phase;  // last phase each member reached
    int finished = 0;
};

struct SendPost {
    const void* data = nullptr;
    size_t bytes = 0;
    bool consumed = false;
    Status error;
};

// Lock order: World::State::mutex before GroupState::mutex.
struct GroupState {
    CommWorld::State* world = nullptr;
    std::string name;
    std::vector<int> ranks;  // group rank -> global rank
    int n = 0;
    int joined = 0;  // members that joined (blocking joins wait for n); guarded by mutex
    std::mutex mutex;
    std::condition_variable cv;
    std::map<uint64_t, std::shared_ptr<Slot>> slots;
    // (source group rank, destination group rank, tag) -> sends not yet received, FIFO.
    std::map<std::tuple<int, int, int>, std::deque<std::shared_ptr<SendPost>>> channels;
    Status aborted;  // guarded by mutex
};

// ----- element-wise reduction -----------------------------------------------------------------

inline float bf16ToFloat(uint16_t b) {
    const uint32_t u = uint32_t(b) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

inline uint16_t floatToBf16(float f) {  // round to nearest even; NaN stays NaN
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return uint16_t(u >> 16);
}

template <typename Acc>
inline Acc combine(Acc a, Acc b, ReduceOp op) {
    switch (op) {
        case ReduceOp::Max: return b > a ? b : a;
        case ReduceOp::Min: return b < a ? b : a;
        default: return a + b;  // Sum, Avg
    }
}

// out[i] = reduce_q load(src[q], i), accumulated in Acc in member order, blocked for cache.
template <typename T, typename Acc, typename Load, typename Store>
void reduceBlocked(const std::vector<const void*>& src, void* out, size_t count, ReduceOp op, Load load,
                   Store store) {
    constexpr size_t kBlock = 2048;
    Acc acc[kBlock];
    const auto* first = static_cast<const T*>(src[0]);
    T* dst = static_cast<T*>(out);
    for (size_t b = 0; b < count; b += kBlock) {
        const size_t len = std::min(kBlock, count - b);
        for (size_t j = 0; j < len; ++j) acc[j] = load(first[b + j]);
        for (size_t q = 1; q < src.size(); ++q) {
            const auto* s = static_cast<const T*>(src[q]) + b;
            switch (op) {  // hoisted so the inner loops vectorize
                case ReduceOp::Max:
                    for (size_t j = 0; j < len; ++j) acc[j] = combine(acc[j], load(s[j]), ReduceOp::Max);
                    break;
                case ReduceOp::Min:
                    for (size_t j = 0; j < len; ++j) acc[j] = combine(acc[j], load(s[j]), ReduceOp::Min);
                    break;
                default:
                    for (size_t j = 0; j < len; ++j) acc[j] = acc[j] + load(s[j]);
                    break;
            }
        }
        for (size_t j = 0; j < len; ++j) dst[b + j] = store(acc[j]);
    }
}

void reduce(const std::vector<const void*>& src, void* out, size_t count, DType t, ReduceOp op) {
    const auto n = int64_t(src.size());
    const bool avg = op == ReduceOp::Avg;
    switch (t) {
        case DType::F32:
            reduceBlocked<float, float>(
                src, out, count, op, [](float v) { return v; },
                [&](float a) { return avg ? a / float(n) : a; });
            return;
        case DType::BF16:
            reduceBlocked<uint16_t, float>(
                src, out, count, op, [](uint16_t v) { return bf16ToFloat(v); },
                [&](float a) { return floatToBf16(avg ? a / float(n) : a); });
            return;
        case DType::I32:  // int64 accumulator; sums wrap like NCCL's int32
            reduceBlocked<int32_t, int64_t>(
                src, out, count, op, [](int32_t v) { return int64_t(v); },
                [&](int64_t a) { return int32_t(uint32_t(uint64_t(avg ? a / n : a))); });
            return;
        case DType::I64:
            reduceBlocked<int64_t, int64_t>(
                src, out, count, op, [](int64_t v) { return v; },
                [&](int64_t a) { return avg ? a / n : a; });
            return;
        default: return;  // rejected in validation
    }
}

bool reductionSupported(DType t) {
    return t == DType::F32 || t == DType::BF16 || t == DType::I32 || t == DType::I64;
}

// Balanced split of `count` elements into n chunks: chunk k = [lo, hi).
inline size_t chunkStart(size_t count, int n, int k) {
    return count / size_t(n) * size_t(k) + std::min(size_t(k), count % size_t(n));
}

}  // namespace

// ----- world ----------------------------------------------------------------------------------

struct CommWorld::State {
    int worldSize = 0;
    std::atomic<int64_t> timeoutMs{60'000};
    bool blockingJoins = false;
    mutable std::mutex mutex;
    std::map<std::string, std::shared_ptr<GroupState>> groups;  // key: name|ranks|instance
    std::map<std::string, int> joins;                           // "rank|name|ranks" -> count
    Status aborted;

    void abortAll(const Status& why) {
        std::lock_guard<std::mutex> lock(mutex);
        if (aborted.isOk()) aborted = why;
        for (auto& [key, g] : groups) {
            {
                std::lock_guard<std::mutex> glock(g->mutex);
                if (g->aborted.isOk()) g->aborted = why;
            }
            g->cv.notify_all();
        }
    }
};

namespace {

class InprocCommunicator;

// Everything an executing op needs; shared with the closures on the stream.
struct OpCtx {
    std::shared_ptr<CommWorld::State> world;
    std::shared_ptr<GroupState> group;
    std::shared_ptr<CommCounters> counters;
    int me = 0;

    std::string where(const char* op, int64_t seq) const {
        std::string s = std::string(op);
        if (seq >= 0) s += " #" + std::to_string(seq);
        s += " in group '" + group->name + "' (global ranks " + rankList(group->ranks) + ") on rank " +
             std::to_string(me) + " (global " + std::to_string(group->ranks[size_t(me)]) + ")";
        return s;
    }
    Clock::time_point deadline() const {
        return Clock::now() + std::chrono::milliseconds(world->timeoutMs.load(std::memory_order_relaxed));
    }
    double timeoutSeconds() const { return double(world->timeoutMs.load()) / 1000.0; }
    std::string member(int q) const {
        return std::to_string(q) + " (global " + std::to_string(group->ranks[size_t(q)]) + ")";
    }
    Status abortedStatus(const char* op, int64_t seq) const {
        return Status(group->aborted.code() == ErrorCode::Timeout ? ErrorCode::Timeout : ErrorCode::CommError,
                      where(op, seq) + " failed because the group was aborted: " + group->aborted.message());
    }
    // Caller holds group->mutex (via lock). Marks this member at `phase` and waits for all.
    Status arriveAndWait(std::unique_lock<std::mutex>& lock, Slot& slot, int phase, Clock::time_point deadline,
                         const char* op, int64_t seq) const {
        GroupState& g = *group;
        slot.phase[size_t(me)] = phase;
        g.cv.notify_all();
        for (;;) {
            if (!g.aborted.isOk()) return abortedStatus(op, seq);
            bool all = true;
            for (int q = 0; q < g.n; ++q) all = all && slot.phase[size_t(q)] >= phase;
            if (all) return Status::ok();
            if (g.cv.wait_until(lock, deadline) == std::cv_status::timeout) {
                all = true;
                std::string missing;
                for (int q = 0; q < g.n; ++q) {
                    if (slot.phase[size_t(q)] >= phase) continue;
                    all = false;
                    missing += (missing.empty() ? "" : ", ") + member(q);
                }
                if (all) continue;
                if (!g.aborted.isOk()) return abortedStatus(op, seq);
                char secs[32];
                std::snprintf(secs, sizeof secs, "%.1f", timeoutSeconds());
                Status st = Status::timeout(where(op, seq) + ": timed out after " + secs + " s; " +
                                            (phase == 1 ? "ranks that never arrived: " : "ranks that did not finish: ") +
                                            missing);
                g.aborted = st;
                g.cv.notify_all();
                return st;
            }
        }
    }
    void leave(uint64_t seq, Slot& slot) const {
        // Caller holds the group mutex.
        if (++slot.finished == group->n) group->slots.erase(seq);
    }
};

std::string describe(const Post& p) {
    std::string s = std::string(opKindName(p.kind)) + "(count=" + std::to_string(p.count) + ", " +
                    dtypeName(p.dtype);
    if (isReduction(p.kind)) s += std::string(", ") + reduceOpName(p.op);
    if (p.kind == OpKind::Broadcast) s += ", root=" + std::to_string(p.root);
    return s + ")";
}

// Same op, same arguments on every member (NCCL would hang or corrupt; we say what differs).
Status validate(const Slot& slot, int n) {
    const Post& a = slot.posts[0];
    for (int q = 1; q < n; ++q) {
        const Post& b = slot.posts[size_t(q)];
        const bool same = a.kind == b.kind && a.dtype == b.dtype &&
                          (a.kind == OpKind::AllToAllv || a.count == b.count) &&
                          (!isReduction(a.kind) || a.op == b.op) && (a.kind != OpKind::Broadcast || a.root == b.root);
        if (!same)
            return Status::invalid("members called different collectives at the same position: rank 0 called " +
                                   describe(a) + ", rank " + std::to_string(q) + " called " + describe(b) +
                                   " (every member must issue the same collectives in the same order)");
    }
    if (isReduction(a.kind) && !reductionSupported(a.dtype))
        return Status::unsupported(std::string("reduction of ") + dtypeName(a.dtype) +
                                   " is not supported by the in-process communicator (f32, bf16, i32, i64)");
    if (a.kind == OpKind::Broadcast && (a.root < 0 || a.root >= n))
        return Status::invalid("broadcast root " + std::to_string(a.root) + " is not a member of a group of " +
                               std::to_string(n));
    if (a.kind == OpKind::AllToAllv) {
        for (int q = 0; q < n; ++q) {
            const Post& pq = slot.posts[size_t(q)];
            if (pq.sendCounts.size() != size_t(n) || pq.recvCounts.size() != size_t(n))
                return Status::invalid("all_to_all: rank " + std::to_string(q) + " passed " +
                                       std::to_string(pq.sendCounts.size()) + " send counts and " +
                                       std::to_string(pq.recvCounts.size()) + " receive counts for a group of " +
                                       std::to_string(n));
        }
        for (int q = 0; q < n; ++q)
            for (int p = 0; p < n; ++p) {
                const size_t sent = slot.posts[size_t(q)].sendCounts[size_t(p)];
                const size_t expected = slot.posts[size_t(p)].recvCounts[size_t(q)];
                if (sent != expected)
                    return Status::invalid("all_to_all: rank " + std::to_string(q) + " sends " + std::to_string(sent) +
                                           " elements to rank " + std::to_string(p) + ", which expects " +
                                           std::to_string(expected));
            }
    }
    return Status::ok();
}

size_t prefix(const std::vector<size_t>& v, size_t k) {
    size_t s = 0;
    for (size_t i = 0; i < k; ++i) s += v[i];
    return s;
}

// Executes one collective for member ctx.me (on its stream thread).
Status runCollective(const OpCtx& ctx, uint64_t seq, Post post) {
    GroupState& g = *ctx.group;
    const int n = g.n, me = ctx.me;
    const char* op = opKindName(post.kind);
    const auto iseq = int64_t(seq);
    const auto deadline = ctx.deadline();
    // Emulated device memory is read and written through its host view (identity otherwise).
    post.send = hostAlias(post.send);
    post.recv = hostAlias(post.recv);
    std::unique_lock<std::mutex> lock(g.mutex);
    if (!g.aborted.isOk()) return ctx.abortedStatus(op, iseq);
    auto& slotRef = g.slots[seq];
    if (!slotRef) slotRef = std::make_shared<Slot>(n);
    std::shared_ptr<Slot> slot = slotRef;
    slot->posts[size_t(me)] = std::move(post);
    const Post& mine = slot->posts[size_t(me)];

    Status st = ctx.arriveAndWait(lock, *slot, 1, deadline, op, iseq);
    if (st.isOk()) {
        // Every member checks all posts, so all of them fail alike on a mismatch.
        st = validate(*slot, n);
        if (!st.isOk()) st = st.withContext(ctx.where(op, iseq));
    }
    if (!st.isOk()) {
        ctx.leave(seq, *slot);
        return st;
    }
    lock.unlock();

    // Phase 2: this member's part. Posts are immutable now (everyone arrived).
    const std::vector<Post>& posts = slot->posts;
    const size_t es = dtypeSize(mine.dtype);
    std::vector<const void*> src(static_cast<size_t>(n));
    int lastPhase = 2;
    switch (mine.kind) {
        case OpKind::AllReduce: {
            const size_t lo = chunkStart(mine.count, n, me), hi = chunkStart(mine.count, n, me + 1);
            for (int q = 0; q < n; ++q) src[size_t(q)] = static_cast<const char*>(posts[size_t(q)].send) + lo * es;
            if (hi > lo) reduce(src, static_cast<char*>(mine.recv) + lo * es, hi - lo, mine.dtype, mine.op);
            lock.lock();
            st = ctx.arriveAndWait(lock, *slot, 2, deadline, op, iseq);
            lock.unlock();
            if (st.isOk()) {
                for (int q = 0; q < n; ++q) {
                    if (q == me) continue;
                    const size_t qlo = chunkStart(mine.count, n, q), qhi = chunkStart(mine.count, n, q + 1);
                    if (qhi > qlo)
                        std::memcpy(static_cast<char*>(mine.recv) + qlo * es,
                                    static_cast<const char*>(posts[size_t(q)].recv) + qlo * es, (qhi - qlo) * es);
                }
            }
            lastPhase = 3;
            break;
        }
        case OpKind::ReduceScatter: {
            for (int q = 0; q < n; ++q)
                src[size_t(q)] = static_cast<const char*>(posts[size_t(q)].send) + size_t(me) * mine.count * es;
            if (mine.count) reduce(src, mine.recv, mine.count, mine.dtype, mine.op);
            break;
        }
        case OpKind::AllGather: {
            for (int q = 0; q < n; ++q) {
                char* dst = static_cast<char*>(mine.recv) + size_t(q) * mine.count * es;
                const void* from = posts[size_t(q)].send;
                if (dst != from && mine.count) std::memmove(dst, from, mine.count * es);
            }
            break;
        }
        case OpKind::Broadcast: {
            const void* from = posts[size_t(mine.root)].recv;
            if (me != mine.root && mine.count && from != mine.recv) std::memcpy(mine.recv, from, mine.count * es);
            break;
        }
        case OpKind::AllToAllv: {
            for (int q = 0; q < n; ++q) {
                const Post& pq = posts[size_t(q)];
                const size_t cnt = mine.recvCounts[size_t(q)];
                if (!cnt) continue;
                std::memcpy(static_cast<char*>(mine.recv) + prefix(mine.recvCounts, size_t(q)) * es,
                            static_cast<const char*>(pq.send) + prefix(pq.sendCounts, size_t(me)) * es, cnt * es);
            }
            break;
        }
    }
    lock.lock();
    if (st.isOk()) st = ctx.arriveAndWait(lock, *slot, lastPhase, deadline, op, iseq);
    ctx.leave(seq, *slot);
    return st;
}

// Executes one batch of sends/receives for member ctx.me.
Status runBatch(const OpCtx& ctx, std::vector<P2POp> ops, uint64_t* sentOut, uint64_t* recvOut) {
    GroupState& g = *ctx.group;
    for (P2POp& p : ops) p.buffer = hostAlias(p.buffer);  // host view of emulated device memory
    const char* op = "send_recv";
    for (const P2POp& p : ops) {
        if (p.peer < 0 || p.peer >= g.n)
            return Status::invalid(ctx.where(op, -1) + ": peer " + std::to_string(p.peer) + " is not a member (size " +
                                   std::to_string(g.n) + ")");
        if (p.count && !p.buffer) return Status::invalid(ctx.where(op, -1) + ": null buffer");
    }
    const auto deadline = ctx.deadline();
    std::vector<std::pair<std::shared_ptr<SendPost>, const P2POp*>> sends;
    std::unique_lock<std::mutex> lock(g.mutex);
    if (!g.aborted.isOk()) return ctx.abortedStatus(op, -1);
    for (const P2POp& p : ops) {
        if (p.kind != P2POp::Send) continue;
        auto sp = std::make_shared<SendPost>();
        sp->data = p.buffer;
        sp->bytes = p.count * dtypeSize(p.dtype);
        g.channels[{ctx.me, p.peer, p.tag}].push_back(sp);
        sends.emplace_back(sp, &p);
    }
    g.cv.notify_all();

    // On failure, withdraw our unreceived sends so nobody reads our buffers later.
    auto withdraw = [&] {
        for (auto& [sp, p] : sends) {
            auto it = g.channels.find({ctx.me, p->peer, p->tag});
            if (it == g.channels.end()) continue;
            auto& q = it->second;
            q.erase(std::remove(q.begin(), q.end(), sp), q.end());
        }
    };
    auto timeoutStatus = [&](const std::string& what) {
        char secs[32];
        std::snprintf(secs, sizeof secs, "%.1f", ctx.timeoutSeconds());
        Status st = Status::timeout(ctx.where(op, -1) + ": timed out after " + secs + " s; " + what);
        g.aborted = st;
        g.cv.notify_all();
        return st;
    };
    uint64_t received = 0, sent = 0;
    for (const P2POp& p : ops) {
        if (p.kind != P2POp::Recv) continue;
        const std::tuple<int, int, int> key{p.peer, ctx.me, p.tag};
        std::shared_ptr<SendPost> sp;
        for (;;) {
            if (!g.aborted.isOk()) {
                withdraw();
                return ctx.abortedStatus(op, -1);
            }
            auto it = g.channels.find(key);
            if (it != g.channels.end() && !it->second.empty()) {
                sp = it->second.front();
                it->second.pop_front();
                break;
            }
            if (g.cv.wait_until(lock, deadline) == std::cv_status::timeout) {
                auto it2 = g.channels.find(key);
                if (it2 != g.channels.end() && !it2->second.empty()) continue;
                withdraw();
                return timeoutStatus("rank " + ctx.member(p.peer) + " never sent the message (tag " +
                                     std::to_string(p.tag) + ", " + std::to_string(p.count) + " elements) this rank receives");
            }
        }
        const size_t bytes = p.count * dtypeSize(p.dtype);
        if (sp->bytes != bytes) {
            sp->error = Status::invalid(ctx.where(op, -1) + ": rank " + ctx.member(p.peer) + " sent " +
                                        std::to_string(sp->bytes) + " bytes (tag " + std::to_string(p.tag) +
                                        ") but this rank receives " + std::to_string(bytes));
            sp->consumed = true;
            g.cv.notify_all();
            withdraw();
            return sp->error;
        }
        lock.unlock();
        if (bytes && p.buffer != sp->data) std::memcpy(p.buffer, sp->data, bytes);
        lock.lock();
        sp->consumed = true;
        received += bytes;
        g.cv.notify_all();
    }
    for (auto& [sp, p] : sends) {
        for (;;) {
            if (sp->consumed) break;
            if (!g.aborted.isOk()) {
                withdraw();
                return ctx.abortedStatus(op, -1);
            }
            if (g.cv.wait_until(lock, deadline) == std::cv_status::timeout && !sp->consumed) {
                withdraw();
                return timeoutStatus("rank " + ctx.member(p->peer) + " never received the message (tag " +
                                     std::to_string(p->tag) + ", " + std::to_string(p->count) +
                                     " elements) this rank sends");
            }
        }
        if (!sp->error.isOk()) return sp->error;
        sent += sp->bytes;
    }
    *sentOut = sent;
    *recvOut = received;
    return Status::ok();
}

class InprocCommunicator final : public Communicator {
public:
    explicit InprocCommunicator(OpCtx ctx) : m_ctx(std::move(ctx)) {}

    int rank() const override { return m_ctx.me; }
    int size() const override { return m_ctx.group->n; }
    const std::string& name() const override { return m_ctx.group->name; }
    std::vector<int> globalRanks() const override { return m_ctx.group->ranks; }

    void allReduce(Stream& s, const void* send, void* recv, size_t count, DType t, ReduceOp op) override {
        Post p{OpKind::AllReduce, send, recv, count, t, op, 0, {}, {}};
        const double bytes = double(count * dtypeSize(t)) * busBwFactor(CollectiveKind::AllReduce, size());
        enqueueCollective(s, CollectiveKind::AllReduce, std::move(p), uint64_t(bytes), uint64_t(bytes));
    }
    void reduceScatter(Stream& s, const void* send, void* recv, size_t recvCount, DType t, ReduceOp op) override {
        Post p{OpKind::ReduceScatter, send, recv, recvCount, t, op, 0, {}, {}};
        const uint64_t bytes = recvCount * dtypeSize(t) * uint64_t(size() - 1);
        enqueueCollective(s, CollectiveKind::ReduceScatter, std::move(p), bytes, bytes);
    }
    void allGather(Stream& s, const void* send, void* recv, size_t sendCount, DType t) override {
        Post p{OpKind::AllGather, send, recv, sendCount, t, ReduceOp::Sum, 0, {}, {}};
        const uint64_t bytes = sendCount * dtypeSize(t) * uint64_t(size() - 1);
        enqueueCollective(s, CollectiveKind::AllGather, std::move(p), bytes, bytes);
    }
    void broadcast(Stream& s, void* buffer, size_t count, DType t, int root) override {
        Post p{OpKind::Broadcast, buffer, buffer, count, t, ReduceOp::Sum, root, {}, {}};
        const uint64_t bytes = size() > 1 ? count * dtypeSize(t) : 0;
        // Root sends the buffer once, every other member receives it once.
        enqueueCollective(s, CollectiveKind::Broadcast, std::move(p), rank() == root ? bytes : 0,
                          rank() == root ? 0 : bytes);
    }
    void allToAllv(Stream& s, const void* send, const std::vector<size_t>& sendCounts, void* recv,
                   const std::vector<size_t>& recvCounts, DType t) override {
        Post p{OpKind::AllToAllv, send, recv, 0, t, ReduceOp::Sum, 0, sendCounts, recvCounts};
        uint64_t sent = 0, received = 0;
        for (size_t q = 0; q < sendCounts.size(); ++q)
            if (int(q) != rank()) sent += sendCounts[q] * dtypeSize(t);
        for (size_t q = 0; q < recvCounts.size(); ++q)
            if (int(q) != rank()) received += recvCounts[q] * dtypeSize(t);
        enqueueCollective(s, CollectiveKind::AllToAll, std::move(p), sent, received);
    }
    void batchSendRecv(Stream& s, const std::vector<P2POp>& ops) override {
        OpDesc d;
        d.name = "send_recv";
        d.category = trace::Category::P2P;
        d.group = m_ctx.group->name.c_str();
        for (const P2POp& p : ops) d.bytes += p.count * dtypeSize(p.dtype);
        s.submit(d, [ctx = m_ctx, ops] {
            uint64_t sent = 0, received = 0;
            Status st = runBatch(ctx, ops, &sent, &received);
            if (st.isOk()) ctx.counters->add(sent, received);
            return st;
        });
    }
    CommStats stats() const override { return m_ctx.counters->stats(); }
    void abort(const Status& why) override {
        m_ctx.world->abortAll(why.isOk() ? Status::comm("aborted") : why);
    }

private:
    void enqueueCollective(Stream& s, CollectiveKind kind, Post p, uint64_t sent, uint64_t received) {
        const uint64_t seq = m_seq.fetch_add(1, std::memory_order_relaxed);
        OpDesc d;
        d.name = collectiveName(kind);
        d.category = trace::Category::Collective;
        d.group = m_ctx.group->name.c_str();
        d.bytes = sent;
        s.submit(d, [ctx = m_ctx, seq, p = std::move(p), sent, received]() mutable {
            Status st = runCollective(ctx, seq, std::move(p));
            if (st.isOk()) ctx.counters->add(sent, received);
            return st;
        });
    }

    OpCtx m_ctx;
    std::atomic<uint64_t> m_seq{0};
};

}  // namespace

CommWorld::CommWorld(int worldSize, CommOptions options) : m_state(std::make_shared<State>()) {
    m_state->worldSize = worldSize;
    m_state->timeoutMs = options.timeout.count();
    m_state->blockingJoins = options.blockingJoins;
}

CommWorld::~CommWorld() = default;

int CommWorld::worldSize() const { return m_state->worldSize; }

void CommWorld::setTimeout(std::chrono::milliseconds timeout) { m_state->timeoutMs = timeout.count(); }

void CommWorld::abort(const Status& why) { m_state->abortAll(why.isOk() ? Status::comm("aborted") : why); }

Status CommWorld::abortStatus() const {
    std::lock_guard<std::mutex> lock(m_state->mutex);
    return m_state->aborted;
}

Result<std::unique_ptr<Communicator>> CommWorld::join(const std::string& name, const std::vector<int>& ranks,
                                                      int globalRank) {
    int me = 0;
    TS_RETURN_IF_ERROR(checkGroupRanks(name, ranks, m_state->worldSize, globalRank, &me));
    const std::string members = name + "|" + rankList(ranks);
    std::shared_ptr<GroupState> g;
    {
        std::lock_guard<std::mutex> lock(m_state->mutex);
        const int instance = m_state->joins[std::to_string(globalRank) + "|" + members]++;
        auto& slot = m_state->groups[members + "|" + std::to_string(instance)];
        if (!slot) {
            slot = std::make_shared<GroupState>();
            slot->world = m_state.get();
            slot->name = name;
            slot->ranks = ranks;
            slot->n = int(ranks.size());
            slot->aborted = m_state->aborted;
        }
        g = slot;
    }
    {
        std::unique_lock<std::mutex> glock(g->mutex);
        ++g->joined;
        g->cv.notify_all();
        if (m_state->blockingJoins) {
            const auto timeout = std::chrono::milliseconds(m_state->timeoutMs.load());
            const bool done = g->cv.wait_for(glock, timeout, [&] { return g->joined >= g->n || !g->aborted.isOk(); });
            if (!g->aborted.isOk())
                return Status::comm("joining group '" + name + "' (global ranks " + rankList(ranks) + "): " +
                                    g->aborted.message());
            if (!done)
                return Status::comm("joining group '" + name + "' (global ranks " + rankList(ranks) + ") on global rank " +
                                    std::to_string(globalRank) + ": " + std::to_string(g->joined) + " of " +
                                    std::to_string(g->n) + " members joined within " +
                                    std::to_string(timeout.count()) + " ms; the others never did (a member that "
                                    "failed, or that joins its groups in another order)");
        }
    }
    OpCtx ctx;
    ctx.world = m_state;
    ctx.group = g;
    ctx.counters = std::make_shared<CommCounters>();
    ctx.me = me;
    return std::unique_ptr<Communicator>(std::make_unique<InprocCommunicator>(std::move(ctx)));
}

}  // namespace ts::engine
