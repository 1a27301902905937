// Pipeline schedules as pure functions: (pp, vpp, microbatches, rank[, group size]) -> the op
// list one pipeline rank executes, in Megatron-Core's order (schedules.py; REFERENCE.md §1):
//   pp == 1            forward_backward_no_pipelining: F0 B0 F1 B1 ...
//   pp > 1, vpp == 1   1F1B: warmup W = min(p - rank - 1, m) forwards, steady 1F1B, cooldown
//   pp > 1, vpp > 1    interleaved 1F1B over get_schedule_table with
//                      W = (p - rank - 1)*2 + (v - 1)*g (capped at m*v)
// Each list contains the compute ops (Forward/Backward of (microbatch, chunk)) and the p2p
// ops between them, named after the Megatron p2p_communication function that the schedule
// calls at that point. A p2p op is listed only when it moves at least one tensor; its
// TensorRefs say which tensors it sends and receives, so a trainer can execute the list
// directly with one batched send/recv per op.
//
// Directions: activations go to the next stage, (rank + 1) % pp; gradients to the previous,
// (rank - 1 + pp) % pp. Only interleaved schedules wrap around (last rank -> rank 0 feeds the
// next model chunk). Layer placement: chunk c on rank r is virtual stage c*pp + r.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace ts::engine {

enum class PipeOpKind : uint8_t {
    Forward = 0,
    Backward,
    RecvForward,
    SendForward,
    RecvBackward,
    SendBackward,
    SendForwardRecvBackward,
    SendBackwardRecvForward,
    SendForwardRecvForward,
    SendBackwardRecvBackward,
    SendForwardBackwardRecvForwardBackward,
};
// Megatron names: "forward", "backward", "recv_forward", "send_forward_recv_backward", ...
const char* pipeOpKindName(PipeOpKind k);

// A tensor of one (microbatch, model chunk): the activation for Forward direction, the
// gradient of that chunk's output for Backward direction. microbatch < 0 = none.
struct TensorRef {
    int microbatch = -1;
    int chunk = -1;
    bool valid() const { return microbatch >= 0; }
    bool operator==(const TensorRef&) const = default;
};

struct PipeOp {
    PipeOpKind kind = PipeOpKind::Forward;
    // Compute ops.
    int microbatch = -1;
    int chunk = 0;
    int virtualMicrobatch = -1;  // k in Megatron's loops (index into the schedule table)
    // Backward only: the last backward of this chunk in the iteration; Megatron enables the
    // data-parallel grad sync (bucket hooks) for exactly this backward.
    bool gradSync = false;
    // P2P ops: activation sent to the next stage / received from the previous one (the
    // receiver's chunk), gradient sent to the previous stage / received from the next.
    TensorRef sendForward, recvForward, sendBackward, recvBackward;

    bool isCompute() const { return kind == PipeOpKind::Forward || kind == PipeOpKind::Backward; }
    // "F0.c0", "B3.c1"; p2p: "send_forward_recv_backward(send act 3.c0, recv grad 1.c0)".
    std::string text() const;
};

struct ScheduleParams {
    int pp = 1;
    int vpp = 1;
    int microbatches = 1;
    int rank = 0;                 // pipeline rank in [0, pp)
    int microbatchGroupSize = 0;  // microbatch_group_size_per_vp_stage; 0 = pp (Megatron default)
    bool overlapP2PComm = false;  // interleaved: split fwd/bwd p2p as Megatron's overlap path does
};

struct PipelineSchedule {
    std::string name;  // "no_pipelining" | "1f1b" | "interleaved_1f1b"
    ScheduleParams params;
    int warmup = 0;      // forward passes before the first backward (virtual microbatches)
    int remaining = 0;   // steady-state 1F1B iterations
    int total = 0;       // microbatches * vpp
    bool allWarmup = false;
    std::vector<PipeOp> ops;

    std::vector<PipeOp> computeOps() const;
    // Space-separated op texts; compute ops only unless withP2P.
    std::string text(bool withP2P = false) const;
};

// Megatron's get_schedule_table: virtual microbatch k -> (microbatch, chunk).
std::vector<TensorRef> scheduleTable(int microbatches, int vpp, int groupSize);

// Constraint checks with Megatron's messages (InvalidArgument).
// Also bounds the schedule's size: microbatches * vpp <= kMaxScheduleMicrobatches (a schedule
// is an explicit op list, about four ops per virtual microbatch).
Status validateSchedule(const ScheduleParams& p);
inline constexpr int64_t kMaxScheduleMicrobatches = 100000;
Result<PipelineSchedule> buildSchedule(const ScheduleParams& p);

// First layer of (rank, chunk): chunk*(L/v) + rank*(L/(p*v)); L must be divisible by p*v.
Result<int> layerOffset(int numLayers, int pp, int vpp, int rank, int chunk);

}  // namespace ts::engine
