// Chunked TP collectives on the comm stream pipelined with chunk GEMMs (see tp_overlap.h).
#include "engine/model/tp_overlap.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "engine/backend/kernels.h"
#include "kernels/common/fp8_codes.h"

namespace ts::engine {

int tpOverlapChunks(int rows, int want) {
    for (int c = std::min(std::max(want, 1), std::max(rows, 1)); c > 1; --c)
        if (rows % c == 0) return c;
    return 1;
}

TpOverlap::TpOverlap(Exec& exec, Stream& commStream, Communicator& tp, TpOverlapOptions opts)
    : m_exec(exec), m_comm(commStream), m_tp(tp), m_opts(opts), m_rank(tp.rank()), m_size(tp.size()) {}

TpOverlap::~TpOverlap() { (void)synchronize(); }

Status TpOverlap::synchronize() {
    return m_comm.synchronize();
}

OpDesc TpOverlap::desc(const char* name, trace::Category cat, double flops, uint64_t bytes) const {
    OpDesc d;
    d.name = name;
    d.category = cat;
    d.flops = flops;
    d.bytes = bytes;
    d.step = m_exec.step();
    d.microbatch = m_exec.microbatch();
    return d;
}

std::shared_ptr<Event> TpOverlap::recordOn(Stream& s) {
    std::shared_ptr<Event> e(m_exec.device().createEvent());
    s.record(*e);
    return e;
}

void TpOverlap::commAfterCompute() {
    auto e = recordOn(m_exec.stream());
    m_comm.wait(*e);
}

TensorPtr TpOverlap::wait(Pending& p) {
    if (p.ready) {
        m_exec.stream().wait(*p.ready);
        p.ready.reset();
    }
    return p.tensor;
}

Result<TensorPtr> TpOverlap::agGemm(const char* name, const TensorPtr& xLocal, int TL, int in, const TensorPtr& y,
                                    int out, double flopsPerRow, RowKernel kernel) {
    const int t = m_size, r = m_rank;
    const int64_t shard = int64_t(TL) * in;  // elements of one s-shard of the input
    TS_ASSIGN_OR_RETURN(TensorPtr full, m_exec.alloc(shard * t));
    auto shardRows = [&](int j) { return int64_t(j) * TL; };
    const double flops = flopsPerRow * TL;
    const uint64_t bytes = uint64_t(4) * uint64_t(TL) * uint64_t(in + out);
    auto gemmShard = [&](int j, const TensorPtr& src, int64_t srcRow) {
        // src rows [srcRow, srcRow + TL) -> y rows of shard j
        const int64_t yRow = shardRows(j);
        RowKernel kern = kernel;
        TensorPtr s = src, yy = y;
        m_exec.op(name, trace::Category::Gemm, flops, bytes, [=] {
            kern(fp(s) + srcRow * in, fp(yy) + yRow * out, TL);
        });
    };

    // Comm stream: own shard into place, then t-1 ring steps. Step i forwards shard (r-i) to
    // r+1 and receives shard (r-i-1) from r-1, straight into its rows of `full`.
    commAfterCompute();
    {
        TensorPtr src = xLocal, dst = full;
        const int64_t off = shardRows(r) * in;
        m_comm.submit(desc("tp_ag.copy_local", trace::Category::Memcpy, 0, uint64_t(shard) * 8), [=]() -> Status {
            kern::copyBytes(fp(dst) + off, fp(src), size_t(shard) * sizeof(float));
            return Status::ok();
        });
    }
    std::vector<std::shared_ptr<Event>> arrived(static_cast<size_t>(t));
    const int next = (r + 1) % t, prev = (r + t - 1) % t;
    for (int i = 0; i + 1 < t; ++i) {
        const int sendShard = ((r - i) % t + t) % t, recvShard = ((r - i - 1) % t + t) % t;
        std::vector<P2POp> ops(2);
        ops[0].kind = P2POp::Send;
        ops[0].peer = next;
        ops[0].buffer = fp(full) + shardRows(sendShard) * in;
        ops[0].count = size_t(shard);
        ops[1].kind = P2POp::Recv;
        ops[1].peer = prev;
        ops[1].buffer = fp(full) + shardRows(recvShard) * in;
        ops[1].count = size_t(shard);
        m_tp.batchSendRecv(m_comm, ops);
        arrived[size_t(recvShard)] = recordOn(m_comm);
    }
    keepUntilPassed(m_comm, {xLocal, full});
    kernels::fp8codes::map().bindLike(fp(full), shard * t, fp(xLocal), shard);  // FP8 codes stay codes

    // Compute stream: own rows first (no wait), then each shard as soon as it arrived.
    gemmShard(r, xLocal, 0);
    for (int i = 1; i < t; ++i) {
        const int j = ((r - i) % t + t) % t;
        m_exec.stream().wait(*arrived[size_t(j)]);
        gemmShard(j, full, shardRows(j));
    }
    return full;
}

Result<TensorPtr> TpOverlap::gemmRs(const char* name, const TensorPtr& x, int TL, int in, int out,
                                   double flopsPerRow, RowKernel kernel) {
    const int t = m_size;
    const int c = tpOverlapChunks(TL, m_opts.rsChunks);
    const int rc = TL / c;                                 // rows per rank per chunk
    const int64_t chunkElems = int64_t(t) * rc * out;      // one chunk's RS input [t, rc, out]
    TS_ASSIGN_OR_RETURN(TensorPtr local, m_exec.alloc(int64_t(TL) * out));
    // staging[k]: chunk k's rows of every rank's shard, rank-major, as the RS expects them.
    TS_ASSIGN_OR_RETURN(TensorPtr staging, m_exec.alloc(chunkElems * c, MemCategory::CommBuffers));
    const double flops = flopsPerRow * double(t) * rc;
    const uint64_t bytes = uint64_t(4) * uint64_t(t) * rc * uint64_t(in + out);
    for (int k = 0; k < c; ++k) {
        {
            RowKernel kern = kernel;
            TensorPtr xx = x, st = staging;
            m_exec.op(name, trace::Category::Gemm, flops, bytes, [=] {
                for (int j = 0; j < t; ++j) {
                    const int64_t row = int64_t(j) * TL + int64_t(k) * rc;
                    kern(fp(xx) + row * in, fp(st) + int64_t(k) * chunkElems + int64_t(j) * rc * out, rc);
                }
            });
        }
        commAfterCompute();
        m_tp.reduceScatter(m_comm, fp(staging) + int64_t(k) * chunkElems, fp(local) + int64_t(k) * rc * out,
                           size_t(int64_t(rc) * out), DType::F32, ReduceOp::Sum);
    }
    auto done = recordOn(m_comm);
    keepUntilPassed(m_comm, {staging, local});
    m_exec.stream().wait(*done);
    return local;
}

Result<TpOverlap::Pending> TpOverlap::gatherAsync(const TensorPtr& local, int64_t n) {
    TS_ASSIGN_OR_RETURN(TensorPtr full, m_exec.alloc(n * m_size));
    commAfterCompute();
    m_tp.allGather(m_comm, local->data(), full->data(), size_t(n), DType::F32);
    kernels::fp8codes::map().bindLike(fp(full), n * m_size, fp(local), n);  // FP8 codes stay codes
    Pending p{full, recordOn(m_comm)};
    keepUntilPassed(m_comm, {local, full});
    return p;
}

Result<TpOverlap::Pending> TpOverlap::reduceScatterAsync(const TensorPtr& full, int64_t n) {
    TS_ASSIGN_OR_RETURN(TensorPtr local, m_exec.alloc(n));
    commAfterCompute();
    m_tp.reduceScatter(m_comm, full->data(), local->data(), size_t(n), DType::F32, ReduceOp::Sum);
    Pending p{local, recordOn(m_comm)};
    keepUntilPassed(m_comm, {full, local});
    return p;
}

}  // namespace ts::engine
