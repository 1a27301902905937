// What a GPU kernel is, from its name alone: imported traces (nsys, Kineto) carry no category,
// so the kernel breakdown, the comm/compute overlap and the exposed-communication analyses
// depend on this table. NCCL kernels are recognised in every spelling NCCL has used:
//   NCCL <= 2.8   ncclAllReduceRingLLKernel_sum_f32, ncclSendRecvKernel_copy_i8
//   NCCL 2.9-2.18 ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)
//   NCCL >= 2.19  ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)
// Send/recv kernels (also used for all-to-all and pipeline p2p) are P2P, the rest Collective.
#pragma once

#include <string>
#include <string_view>

#include "common/recorder.h"

namespace ts::profiler::import {

struct NcclKernelInfo {
    bool isNccl = false;    // name starts with "nccl" (HTA's definition of a communication kernel)
    // Canonical op: AllReduce, AllGather, ReduceScatter, Broadcast, Reduce, SendRecv, Send,
    // Recv, AllToAll, Generic (NCCL >= 2.19 generic kernel) or "" when not recognised.
    std::string op;
    std::string algorithm;  // RING, TREE, COLLNET_DIRECT, COLLNET_CHAIN, NVLS, NVLS_TREE, PAT or ""
    std::string protocol;   // LL, LL128, SIMPLE or ""
    std::string redOp;      // Sum, Prod, Min, Max, PreMulSum, SumPostDiv or ""
    std::string dataType;   // canonical: i8 u8 i32 u32 i64 u64 f16 f32 f64 bf16 f8e4m3 f8e5m2 or ""
    bool isP2P() const { return op == "SendRecv" || op == "Send" || op == "Recv"; }
};

// Parses an NCCL kernel name (any of the spellings above). isNccl=false for other kernels.
NcclKernelInfo parseNcclKernel(std::string_view name);

// Category of a GPU kernel from its (demangled or short) name. Order matters and is part of
// the contract (docs/import.md): nccl -> Collective/P2P; Memcpy/Memset; loss
// (cross_entropy, nll_loss, log_softmax) -> Loss; flash/fmha/attention/softmax -> Attention;
// gemm/gemv/xmma/cutlass/cublas -> Gemm; layer_norm/rms_norm -> Norm; embedding -> Embedding;
// optimizer kernels (adam, multi_tensor_apply, ...) -> Optimizer; elementwise/vectorized/
// reduce/activation kernels -> Elementwise; anything else -> Other.
trace::Category classifyKernel(std::string_view name);

// The name a kernel table shows, as Nsight Systems' short names do but keeping template
// arguments (cutlass::Kernel2<cutlass_80_tensorop_...> says which GEMM it is): a demangled
// signature loses its parameter list, return type and enclosing namespaces and classes, so
// "void ts::kernels::cuda::(anonymous namespace)::layerOrRmsNormForwardKernel(float const*, int)"
// reads "layerOrRmsNormForwardKernel". Names that are not signatures come back as they are.
std::string kernelShortName(std::string_view name);

// Size in bytes of one element of a canonical NCCL/PyTorch dtype name ("f32", "float",
// "bf16", "c10::BFloat16", "Half" ...); 0 when unknown.
int dtypeBytes(std::string_view dtype);

}  // namespace ts::profiler::import
