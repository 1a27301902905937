// Ring attention for context parallelism (cp_comm_type=p2p; REFERENCE.md §4.3, Transformer
// Engine's AttnFuncWithCPAndKVP2P) for one CP rank. With a2a+p2p the ring runs over "hcp-p2p"
// on the rows and heads the all-to-all over "hcp-a2a" gave this rank (gpt_cp_attention.cpp):
// "CP rank" below is then the hcp-p2p rank, and a rank's rows are its a2a group's chunks.
//
// Every CP rank holds the query/key/value rows of its two sequence chunks (§4.1). The key/value
// blocks travel around the CP ring: in step i rank r computes its queries against the block of
// rank (r - i) mod c while, on the CP communication stream ("cp_comm", its own thread on the CPU
// backend), it already forwards that block to rank r+1 and receives the next one from rank r-1.
// Two block buffers alternate; the receive into a buffer waits for the compute step that last
// read it. Causality is decided per key/query pair from their global positions, so every section
// kind (diagonal, lower, the load-balanced halves) is the same kernel. Partial results are
// merged with the rows' log-sum-exp; nothing of size s x s is kept, only out and the lse.
// Attention dropout masks each block's unnormalised probabilities (the mask a function of the
// global query/key positions and the head, as the cp=1 run draws it) and leaves the lse
// undropped, so the merge gives dropout(softmax(S)) V; the backward regenerates the same masks.
//
// Backward: the blocks travel the same way again. Each step computes dQ (accumulated) and this
// block's dK/dV contribution into a fresh buffer on compute, adds the partial sum that arrived
// from rank r-1 (the contributions of the ranks the block already visited), and the comm stream
// passes the sum on to rank r+1; after c steps every rank has received its own blocks' full
// dK/dV. The dK/dV transfer of step i overlaps the compute of step i+1.
//
// The communicator must be used on the comm stream only (a second "cp" communicator).
#pragma once

#include <memory>
#include <vector>

#include "engine/comm/communicator.h"
#include "engine/model/layers.h"
#include "kernels/common/dropout_rng.h"

namespace ts::engine {

class CpRing {
public:
    struct Dims {
        int sl = 0, b = 0, nq = 0, ng = 0, d = 0;  // local rows, micro batch, heads, query groups, head dim
        float scale = 0;
        // Attention dropout, keyed by global positions (kernels/cpu/ops.h CpAttnDims): forward and
        // backward draw the same mask of each block from its rows' global positions.
        float dropout = 0;
        kernels::hd::DropoutSeed dropoutSeed;
        int headOffset = 0, nqTotal = 0, sTotal = 0;
    };
    // positions[r]: the global positions of CP rank r's rows (cpLocalPositions).
    CpRing(Exec& exec, Stream& commStream, Communicator& cp, std::vector<std::vector<int>> positions);
    ~CpRing();
    CpRing(const CpRing&) = delete;
    CpRing& operator=(const CpRing&) = delete;

    // q [sl,b,nq,d], k, v [sl,b,ng,d] (on compute) -> out [sl,b,nq,d], lse [b,nq,sl] (allocated
    // by the caller, written on compute).
    Status forward(const Dims& dims, const TensorPtr& q, const TensorPtr& k, const TensorPtr& v, const TensorPtr& out,
                   const TensorPtr& lse);
    // From the forward's out/lse and dout: dq [sl,b,nq,d], dk, dv [sl,b,ng,d] overwritten.
    Status backward(const Dims& dims, const TensorPtr& q, const TensorPtr& k, const TensorPtr& v,
                    const TensorPtr& out, const TensorPtr& lse, const TensorPtr& dout, const TensorPtr& dq,
                    const TensorPtr& dk, const TensorPtr& dv);
    // Host waits until the comm stream is idle (buffers of finished ops are released).
    Status synchronize();

private:
    std::shared_ptr<Event> recordOn(Stream& s);
    // Comm stream: send `send` to rank r+1 and receive `recv` from rank r-1 (n floats each).
    void exchange(const TensorPtr& send, const TensorPtr& recv, int64_t n);
    Result<TensorPtr> packKv(const TensorPtr& k, const TensorPtr& v, int64_t n);

    Exec& m_exec;
    Stream& m_comm;
    Communicator& m_cp;
    std::vector<std::shared_ptr<const std::vector<int>>> m_pos;
    std::vector<KernelIds> m_posK;  // m_pos as kernels read them (uploadPositions)
    Status uploadPositions();
    int m_rank = 0, m_size = 1;
};

}  // namespace ts::engine
