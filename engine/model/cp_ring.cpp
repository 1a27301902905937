// Ring attention over the CP group on the CP comm stream (see cp_ring.h).
#include "engine/model/cp_ring.h"

#include <cstring>
#include <utility>

#include "engine/backend/kernels.h"

namespace ts::engine {

namespace k = ts::engine::kern;

namespace {
// One block of sl keys against the sl local queries.
k::CpAttnDims kernelDims(const CpRing::Dims& D) {
    k::CpAttnDims ad{D.sl, D.sl, D.b, D.nq, D.ng, D.d, D.scale};
    ad.dropout = D.dropout;
    ad.dropoutSeed = D.dropoutSeed;
    ad.headOffset = D.headOffset;
    ad.nqTotal = D.nqTotal;
    ad.sTotal = D.sTotal;
    return ad;
}
}  // namespace

CpRing::CpRing(Exec& exec, Stream& commStream, Communicator& cp, std::vector<std::vector<int>> positions)
    : m_exec(exec), m_comm(commStream), m_cp(cp), m_rank(cp.rank()), m_size(cp.size()) {
    for (auto& p : positions) m_pos.push_back(std::make_shared<const std::vector<int>>(std::move(p)));
}

CpRing::~CpRing() { (void)synchronize(); }

Status CpRing::synchronize() {
    return m_comm.synchronize();
}

std::shared_ptr<Event> CpRing::recordOn(Stream& s) {
    std::shared_ptr<Event> e(m_exec.device().createEvent());
    s.record(*e);
    return e;
}

void CpRing::exchange(const TensorPtr& send, const TensorPtr& recv, int64_t n) {
    std::vector<P2POp> ops(2);
    ops[0].kind = P2POp::Send;
    ops[0].peer = (m_rank + 1) % m_size;
    ops[0].buffer = fp(send);
    ops[0].count = size_t(n);
    ops[1].kind = P2POp::Recv;
    ops[1].peer = (m_rank + m_size - 1) % m_size;
    ops[1].buffer = fp(recv);
    ops[1].count = size_t(n);
    m_cp.batchSendRecv(m_comm, ops);
    keepUntilPassed(m_comm, {send, recv});
}

Status CpRing::uploadPositions() {
    // Every ring rank's positions, uploaded once where kernels see device memory.
    if (!m_posK.empty()) return Status::ok();
    for (const auto& p : m_pos) {
        TS_ASSIGN_OR_RETURN(KernelIds ids, kernelInts(m_exec, p->data(), p->size(), p, MemCategory::Workspace));
        m_posK.push_back(std::move(ids));
    }
    return Status::ok();
}

Result<TensorPtr> CpRing::packKv(const TensorPtr& kk, const TensorPtr& v, int64_t n) {
    TS_ASSIGN_OR_RETURN(TensorPtr kv, m_exec.alloc(2 * n, MemCategory::CommBuffers));
    m_exec.op("cp_kv_pack", trace::Category::Memcpy, 0, uint64_t(n) * 16, [=] {
        k::copyBytes(fp(kv), fp(kk), size_t(n) * sizeof(float));
        k::copyBytes(fp(kv) + n, fp(v), size_t(n) * sizeof(float));
    });
    return kv;
}

Status CpRing::forward(const Dims& D, const TensorPtr& q, const TensorPtr& kk, const TensorPtr& v,
                       const TensorPtr& out, const TensorPtr& lse) {
    TS_RETURN_IF_ERROR(uploadPositions());
    const int c = m_size, r = m_rank;
    const int64_t n = int64_t(D.sl) * D.b * D.ng * D.d;  // elements of K (and of V) of one block
    const k::CpAttnDims ad = kernelDims(D);
    TensorPtr buf[2];
    TS_ASSIGN_OR_RETURN(buf[0], packKv(kk, v, n));
    TS_ASSIGN_OR_RETURN(buf[1], m_exec.alloc(2 * n, MemCategory::CommBuffers));
    std::shared_ptr<Event> lastCompute = recordOn(m_exec.stream()), arrived;
    // About half of the key/query pairs of the whole sequence are visible; every block is
    // charged its 1/c share of that.
    const double flops = 2.0 * D.b * D.nq * double(D.sl) * D.sl * D.d;
    const uint64_t bytes = uint64_t(4) * uint64_t(D.sl) * D.b * (uint64_t(D.nq) * D.d * 2 + uint64_t(D.ng) * D.d * 2);
    for (int i = 0; i < c; ++i) {
        const TensorPtr cur = buf[i % 2];
        std::shared_ptr<Event> next;
        if (i + 1 < c) {
            // The receive overwrites the buffer compute step i-1 read (step 0: the packing).
            m_comm.wait(*lastCompute);
            exchange(cur, buf[(i + 1) % 2], 2 * n);
            next = recordOn(m_comm);
        }
        if (i > 0) m_exec.stream().wait(*arrived);
        const int src = (r - i + c) % c;
        const KernelIds qPos = m_posK[size_t(r)], kPos = m_posK[size_t(src)];
        const bool first = i == 0;
        m_exec.op("core_attention.fwd", trace::Category::Attention, flops, bytes, [=] {
            k::cpRingAttentionForward(ad, qPos.ptr, kPos.ptr, fp(q), fp(cur), fp(cur) + n, fp(out), fp(lse),
                                      first);
        });
        lastCompute = recordOn(m_exec.stream());
        arrived = next;
    }
    return Status::ok();
}

Status CpRing::backward(const Dims& D, const TensorPtr& q, const TensorPtr& kk, const TensorPtr& v,
                        const TensorPtr& out, const TensorPtr& lse, const TensorPtr& dout, const TensorPtr& dq,
                        const TensorPtr& dk, const TensorPtr& dv) {
    TS_RETURN_IF_ERROR(uploadPositions());
    const int c = m_size, r = m_rank;
    const int64_t n = int64_t(D.sl) * D.b * D.ng * D.d;
    const int64_t nqElems = int64_t(D.sl) * D.b * D.nq * D.d;
    const k::CpAttnDims ad = kernelDims(D);
    TS_ASSIGN_OR_RETURN(TensorPtr delta, m_exec.alloc(int64_t(D.b) * D.nq * D.sl, MemCategory::Workspace));
    m_exec.op("core_attention.bwd_delta", trace::Category::Attention, 2.0 * double(nqElems),
              uint64_t(8) * uint64_t(nqElems), [=] {
                  k::cpRingAttentionDelta(ad, fp(out), fp(dout), fp(delta));
                  k::setBytes(fp(dq), 0, size_t(nqElems) * sizeof(float));
              });
    TensorPtr kvBuf[2];
    TS_ASSIGN_OR_RETURN(kvBuf[0], packKv(kk, v, n));
    TS_ASSIGN_OR_RETURN(kvBuf[1], m_exec.alloc(2 * n, MemCategory::CommBuffers));
    std::shared_ptr<Event> lastCompute = recordOn(m_exec.stream()), kvArrived, dkvArrived;
    TensorPtr dkvIn;  // partial dK/dV of the block held now, from the ranks it visited before
    const double flops = 4.0 * D.b * D.nq * double(D.sl) * D.sl * D.d;
    const uint64_t bytes = uint64_t(4) * uint64_t(D.sl) * D.b * (uint64_t(D.nq) * D.d * 4 + uint64_t(D.ng) * D.d * 4);
    for (int i = 0; i < c; ++i) {
        const TensorPtr cur = kvBuf[i % 2];
        std::shared_ptr<Event> nextKv;
        if (i + 1 < c) {
            m_comm.wait(*lastCompute);
            exchange(cur, kvBuf[(i + 1) % 2], 2 * n);
            nextKv = recordOn(m_comm);
        }
        if (i > 0) m_exec.stream().wait(*kvArrived);
        const int src = (r - i + c) % c;
        const KernelIds qPos = m_posK[size_t(r)], kPos = m_posK[size_t(src)];
        TS_ASSIGN_OR_RETURN(TensorPtr part, m_exec.alloc(2 * n, MemCategory::CommBuffers));
        m_exec.op("core_attention.bwd", trace::Category::Attention, flops, bytes, [=] {
            k::cpRingAttentionBackward(ad, qPos.ptr, kPos.ptr, fp(q), fp(cur), fp(cur) + n, fp(lse),
                                       fp(delta), fp(dout), fp(dq), fp(part), fp(part) + n);
        });
        if (i > 0) {
            m_exec.stream().wait(*dkvArrived);
            TensorPtr in = dkvIn;
            m_exec.op("cp_dkv_accumulate", trace::Category::Elementwise, double(2 * n), uint64_t(n) * 24, [=] {
                k::addInPlace(fp(part), fp(in), 2 * n);
            });
        }
        lastCompute = recordOn(m_exec.stream());
        TS_ASSIGN_OR_RETURN(TensorPtr recv, m_exec.alloc(2 * n, MemCategory::CommBuffers));
        m_comm.wait(*lastCompute);
        exchange(part, recv, 2 * n);
        dkvArrived = recordOn(m_comm);
        dkvIn = recv;
        kvArrived = nextKv;
    }
    // After c steps the partial sum that arrives is this rank's own block, complete.
    m_exec.stream().wait(*dkvArrived);
    TensorPtr in = dkvIn;
    m_exec.op("cp_dkv_copy", trace::Category::Memcpy, 0, uint64_t(n) * 16, [=] {
        k::copyBytes(fp(dk), fp(in), size_t(n) * sizeof(float));
        k::copyBytes(fp(dv), fp(in) + n, size_t(n) * sizeof(float));
    });
    return Status::ok();
}

}  // namespace ts::engine
