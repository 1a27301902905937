// Tensor-parallel communication overlap (tp_comm_overlap; Transformer Engine's userbuffers
// "comm+GEMM overlap", REFERENCE.md §2.3-2.4) for the sequence-parallel linears of one rank.
//
// Without it the SP all-gather / reduce-scatter run on the compute stream and the GEMM waits
// for the whole collective. With it every TP collective of a linear runs on the rank's TP
// communication stream ("tp_comm", its own thread on the CPU backend) and the compute stream
// waits, through events, only for the piece it needs next:
//
//   agGemm  (TE ring_exchange; fprop of QKV/fc1, dgrad of proj/fc2; tp_comm_overlap_ag):
//           the input [T/t, in] is all-gathered by t-1 ring steps (send the shard held now to
//           rank r+1, receive the next from r-1) while the GEMM of the shard already held runs:
//           step 0 computes this rank's own rows without waiting for any communication.
//   gemmRs  (TE pipeline; fprop of proj/fc2 with tp_comm_overlap_rs, dgrad of QKV/fc1 with
//           tp_comm_overlap_rs_dgrad): the output rows are produced in `chunks` pieces (rows
//           [k*T/(t*c), (k+1)*T/(t*c)) of every rank's s-shard); chunk k's reduce-scatter runs
//           while chunk k+1 is computed.
//   gatherAsync / reduceScatterAsync (TE bulk overlap; backward of QKV/fc1 with
//           tp_comm_bulk_dgrad / tp_comm_bulk_wgrad): the re-gather of the saved input runs
//           while the dgrad GEMM computes, the reduce-scatter of the dgrad while the wgrad GEMM
//           computes; the caller makes compute wait (wait()) right before the consumer.
//
// Numerics: a row of a GEMM output depends only on the same row of its input, and every
// reduce-scatter element is summed over the same ranks in the same order, so splitting by
// rows is the same math (the wgrad GEMM, which sums over rows, is never split). It is not
// bitwise: OpenBLAS picks its micro-kernels by the row count M, so the last bit of a row can
// depend on the chunk size (about 1 in 5 outputs of a 32-row vs 2x16-row sgemm differ by an
// ulp); trained weights agree to ~1e-6 relative with the unsplit path. FP8 inputs are
// quantized by the caller before they reach these functions (the local shard before agGemm,
// with the whole tensor's scale), so the pieces see the values the unsplit path sees.
//
// Shapes: activations are sequence-first [s, b, h] flattened to [T, h]; the TP region holds
// all T rows in rank order of the s-shards (rank r owns rows [r*TL, (r+1)*TL), TL = T/t).
// The communicator must be used on the comm stream only (a second "tp" communicator, so its
// ops never interleave with the TP collectives that stay on the compute stream).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "engine/comm/communicator.h"
#include "engine/model/layers.h"

namespace ts::engine {

// Which collectives are overlapped (Megatron's tp_comm_* sub-knobs of tp_comm_overlap).
struct TpOverlapOptions {
    bool overlapAg = true;         // tp_comm_overlap_ag
    bool overlapRs = true;         // tp_comm_overlap_rs
    bool overlapRsDgrad = false;   // tp_comm_overlap_rs_dgrad (replaces bulk dgrad/wgrad)
    bool bulkDgrad = true;         // tp_comm_bulk_dgrad
    bool bulkWgrad = true;         // tp_comm_bulk_wgrad
    int rsChunks = 4;              // pipeline splits of gemmRs (TE's num_splits default)
};

class TpOverlap {
public:
    // Computes `rows` consecutive rows: x [rows, in] -> y [rows, out]. Runs on the compute
    // stream's thread; must not depend on anything but those rows (and the weights).
    using RowKernel = std::function<void(const float* x, float* y, int rows)>;

    // A tensor being produced on the comm stream; wait() before the compute stream reads it.
    struct Pending {
        TensorPtr tensor;
        std::shared_ptr<Event> ready;
    };

    TpOverlap(Exec& exec, Stream& commStream, Communicator& tp, TpOverlapOptions opts);
    ~TpOverlap();
    TpOverlap(const TpOverlap&) = delete;
    TpOverlap& operator=(const TpOverlap&) = delete;

    const TpOverlapOptions& options() const { return m_opts; }

    // xLocal: [TL, in] (produced on compute). Gathers it into the returned [T, in] while
    // y[rows] = kernel(full[rows]) runs shard by shard on compute (y: [T, out], allocated by
    // the caller). When this returns the compute stream has waited for every shard, so later
    // compute work may read the gathered tensor (e.g. the wgrad GEMM).
    Result<TensorPtr> agGemm(const char* name, const TensorPtr& xLocal, int TL, int in, const TensorPtr& y,
                             int out, double flopsPerRow, RowKernel kernel);
    // x: [T, in] (TP region, on compute). Returns [TL, out] = reduce-scatter over TP of
    // kernel(x); compute waits for the last chunk before anything enqueued after this call.
    Result<TensorPtr> gemmRs(const char* name, const TensorPtr& x, int TL, int in, int out, double flopsPerRow,
                             RowKernel kernel);
    // Bulk: all-gather local [n] -> [t*n] / reduce-scatter full [t*n] -> [n] on the comm stream,
    // after the compute work enqueued so far.
    Result<Pending> gatherAsync(const TensorPtr& local, int64_t n);
    Result<Pending> reduceScatterAsync(const TensorPtr& full, int64_t n);
    // Compute stream waits for `p` (no-op when already waited); returns its tensor.
    TensorPtr wait(Pending& p);

    // Host waits until the comm stream is idle (buffers of finished ops are released).
    Status synchronize();

private:
    // Comm stream waits for the compute work enqueued so far.
    void commAfterCompute();
    std::shared_ptr<Event> recordOn(Stream& s);
    OpDesc desc(const char* name, trace::Category cat, double flops, uint64_t bytes) const;

    Exec& m_exec;
    Stream& m_comm;
    Communicator& m_tp;
    TpOverlapOptions m_opts;
    int m_rank = 0, m_size = 1;
};

// Largest divisor of `rows` that is <= `want` (>= 1): the chunk count gemmRs really uses.
int tpOverlapChunks(int rows, int want);

}  // namespace ts::engine
