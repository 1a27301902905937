// Kernel-name classification for imported traces (see kernel_names.h for the contract).
#include "profiler/import/kernel_names.h"

#include <algorithm>
#include <cctype>

namespace ts::profiler::import {
namespace {

bool startsWith(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

bool contains(std::string_view s, std::string_view p) { return s.find(p) != std::string_view::npos; }

std::string toLower(std::string_view s) {
    std::string out(s);
    for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return out;
}

// True when `word` occurs in `s` delimited by '_' (or the ends) on both sides.
bool hasToken(std::string_view s, std::string_view word) {
    for (size_t pos = s.find(word); pos != std::string_view::npos; pos = s.find(word, pos + 1)) {
        bool leftOk = pos == 0 || s[pos - 1] == '_';
        size_t end = pos + word.size();
        bool rightOk = end == s.size() || s[end] == '_';
        if (leftOk && rightOk) return true;
    }
    return false;
}

// Canonical dtype from the spellings used in NCCL kernel names (C types in 2.9-2.18, short
// names in <=2.8 and >=2.19). Longest first so uint8_t is not read as int8_t.
std::string findDataType(std::string_view tail) {
    static const std::pair<std::string_view, std::string_view> kTypes[] = {
        {"__nv_fp8_e4m3", "f8e4m3"}, {"__nv_fp8_e5m2", "f8e5m2"}, {"__nv_bfloat16", "bf16"},
        {"f8e4m3", "f8e4m3"}, {"f8e5m2", "f8e5m2"}, {"bfloat16", "bf16"}, {"uint8_t", "u8"},
        {"int8_t", "i8"}, {"uint32_t", "u32"}, {"int32_t", "i32"}, {"uint64_t", "u64"},
        {"int64_t", "i64"}, {"double", "f64"}, {"float", "f32"}, {"half", "f16"}, {"bf16", "bf16"},
        {"u8", "u8"}, {"i8", "i8"}, {"u32", "u32"}, {"i32", "i32"}, {"u64", "u64"}, {"i64", "i64"},
        {"f16", "f16"}, {"f32", "f32"}, {"f64", "f64"},
    };
    for (const auto& [spelling, canonical] : kTypes) {
        // "__nv_bfloat16" starts with '_' itself, so accept it right after a separator.
        for (size_t pos = tail.find(spelling); pos != std::string_view::npos;
             pos = tail.find(spelling, pos + 1)) {
            size_t end = pos + spelling.size();
            bool leftOk = pos == 0 || tail[pos - 1] == '_' || spelling[0] == '_';
            bool rightOk = end == tail.size() || tail[end] == '_';
            if (leftOk && rightOk) return std::string(canonical);
        }
    }
    return {};
}

constexpr std::string_view kOps[] = {
    "ReduceScatter", "AllReduce", "AllGather", "Broadcast", "SendRecv",
    "AllToAll",      "Reduce",    "Generic",   "Send",      "Recv"};

void parseModernTail(std::string_view rest, NcclKernelInfo& info) {
    // rest: "AllReduce_RING_LL_Sum_float" or "AllReduce_Sum_f32_RING_LL" or "SendRecv".
    for (std::string_view op : kOps) {
        if (startsWith(rest, op) && (rest.size() == op.size() || rest[op.size()] == '_')) {
            info.op = std::string(op);
            break;
        }
    }
    static const std::string_view kAlgos[] = {
        "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS_TREE", "COLLNET", "NVLS", "RING", "TREE", "PAT"};
    for (std::string_view a : kAlgos)
        if (hasToken(rest, a)) { info.algorithm = std::string(a); break; }
    static const std::string_view kProtos[] = {"LL128", "SIMPLE", "LL"};
    for (std::string_view p : kProtos)
        if (hasToken(rest, p)) { info.protocol = std::string(p); break; }
    static const std::string_view kRedOps[] = {"PreMulSum", "SumPostDiv", "Sum", "Prod",
                                                           "MinMax", "Min", "Max"};
    for (std::string_view r : kRedOps)
        if (hasToken(rest, r)) { info.redOp = std::string(r); break; }
    info.dataType = findDataType(rest);
}

void parseLegacy(std::string_view rest, NcclKernelInfo& info) {
    // rest: "AllReduceRingLLKernel_sum_f32", "SendRecvKernel_copy_i8", "BroadcastRingLL128Kernel_copy_i8".
    for (std::string_view op : kOps) {
        if (startsWith(rest, op)) {
            info.op = std::string(op);
            rest.remove_prefix(op.size());
            break;
        }
    }
    size_t k = rest.find("Kernel");
    std::string_view shape = k == std::string_view::npos ? rest : rest.substr(0, k);
    if (startsWith(shape, "CollNet")) { info.algorithm = "COLLNET"; shape.remove_prefix(7); }
    else if (startsWith(shape, "Ring")) { info.algorithm = "RING"; shape.remove_prefix(4); }
    else if (startsWith(shape, "Tree")) { info.algorithm = "TREE"; shape.remove_prefix(4); }
    if (shape == "LL128") info.protocol = "LL128";
    else if (shape == "LL") info.protocol = "LL";
    else if (shape == "Simple") info.protocol = "SIMPLE";
    if (k != std::string_view::npos) {
        std::string_view tail = rest.substr(k + 6);
        if (startsWith(tail, "_")) tail.remove_prefix(1);
        static const std::pair<std::string_view, std::string_view> kRed[] = {
            {"sum", "Sum"}, {"prod", "Prod"}, {"min", "Min"}, {"max", "Max"}, {"premulsum", "PreMulSum"}};
        for (const auto& [low, canon] : kRed)
            if (startsWith(tail, low) && (tail.size() == low.size() || tail[low.size()] == '_')) {
                info.redOp = std::string(canon);
                break;
            }
        info.dataType = findDataType(tail);
    }
}

}  // namespace

NcclKernelInfo parseNcclKernel(std::string_view name) {
    NcclKernelInfo info;
    if (!startsWith(name, "nccl")) return info;
    info.isNccl = true;
    std::string_view base = name.substr(0, name.find('('));
    if (startsWith(base, "ncclDevKernel_")) {
        parseModernTail(base.substr(14), info);
    } else if (startsWith(base, "ncclKernel_")) {
        parseModernTail(base.substr(11), info);
    } else {
        parseLegacy(base.substr(4), info);
    }
    return info;
}

trace::Category classifyKernel(std::string_view name) {
    using trace::Category;
    // Communication: NCCL in all its spellings, RCCL (ROCm's NCCL; its kernels are also named
    // nccl*, older builds rccl*).
    if (startsWith(name, "nccl") || contains(name, "ncclKernel") || contains(name, "ncclDevKernel"))
        return parseNcclKernel(name).isP2P() ? Category::P2P : Category::Collective;
    if (startsWith(name, "rccl")) return Category::Collective;
    // Same test as HTA's is_memory_kernel, so our non-compute time equals theirs; MTIA DMA
    // kernels (dma*) are copies too.
    if (contains(name, "Memcpy") || startsWith(name, "dma")) return Category::Memcpy;
    if (contains(name, "Memset")) return Category::Memset;
    const std::string n = toLower(name);
    auto any = [&n](std::initializer_list<std::string_view> words) {
        return std::any_of(words.begin(), words.end(), [&n](std::string_view w) { return contains(n, w); });
    };
    auto starts = [&n](std::initializer_list<std::string_view> words) {
        return std::any_of(words.begin(), words.end(), [&n](std::string_view w) { return startsWith(n, w); });
    };
    // Library GEMM kernels by their own prefixes first: their names carry words (Bias, Cast,
    // ReLU epilogues) that the generic rules below would misread.
    //   AMD Tensile / rocBLAS / hipBLASLt: Cijk_Ailk_Bljk_..., Hopper/Blackwell cuBLASLt: nvjet_*
    if (startsWith(name, "Cijk_") || starts({"nvjet_", "rocblas_gemm", "hipblaslt"})) return Category::Gemm;
    if (any({"cross_entropy", "crossentropy", "nll_loss", "log_softmax", "logsoftmax"})) return Category::Loss;
    // FlashAttention, cuDNN / Transformer Engine fused attention, xFormers / CUTLASS / CK /
    // AITER fmha, PyTorch SDPA.
    if (any({"flash", "fmha", "attention", "attn", "sdpa", "mha_fwd", "mha_bwd", "paged_attention"}))
        return Category::Attention;
    if (any({"adam", "multi_tensor", "sgd", "lamb_", "adagrad", "optimizer"})) return Category::Optimizer;
    // cuBLAS (sm80_xmma_gemm, ampere_sgemm, volta_h884gemm, gemv2T, splitKreduce), CUTLASS,
    // Composable Kernel (ck::kernel_gemm_xdl...), Triton templates (triton_tem_fused_mm /
    // _bmm / _addmm), cuDNN convolutions computed as implicit GEMM.
    if (any({"gemm", "gemv", "xmma", "cutlass", "cublas", "matmul", "splitkreduce", "convolve", "winograd",
             "dgrad", "wgrad"}) ||
        starts({"triton_tem_fused_mm", "triton_tem_fused_bmm", "triton_tem_fused_addmm"}))
        return Category::Gemm;
    if (any({"layer_norm", "layernorm", "rms_norm", "rmsnorm", "batch_norm", "batchnorm", "group_norm",
             "groupnorm", "ln_fwd", "ln_bwd", "bn_fw", "bn_bw"}))
        return Category::Norm;
    if (any({"softmax"})) return Category::Softmax;
    if (any({"embedding", "embed_"})) return Category::Embedding;
    // Collectives that are not NCCL's: PyTorch SymmetricMemory (one_shot_all_reduce,
    // multimem_all_reduce), vLLM's and TensorRT-LLM's custom all-reduce, MSCCL++, Transformer
    // Engine's userbuffers reduce-scatter / all-gather. Before the element-wise words, whose
    // "reduce" would take them.
    if (any({"all_reduce", "allreduce", "reduce_scatter", "reducescatter", "all_gather", "allgather", "all_to_all",
             "alltoall", "cross_device_reduce", "userbuffers"}))
        return Category::Collective;
    // PyTorch ATen element-wise and reduction kernels, Triton pointwise/reduction kernels
    // (triton_poi_*, triton_red_*, triton_per_*), CUB reductions, Transformer Engine
    // cast/transpose, amax and FP8 quantization, MoE permutation; trainscope's own kernels
    // (kernels/cuda) are named to land here or above.
    if (starts({"triton_poi_", "triton_red_", "triton_per_"}) ||
        any({"elementwise", "vectorized", "unrolled", "gelu", "silu", "swiglu", "relu", "dropout",
             "rotary", "_rope", "fill", "copy", "cast", "transpose", "cat_", "index", "scatter",
             "gather", "where", "masked", "nchwtonhwc", "nhwctonchw", "permute", "sigmoid", "bias", "scale",
             "reduce", "amax", "quantize"}))
        return Category::Elementwise;
    // Anything else (kernels named only by their library, say) is Other: better unclassified than
    // put in a class the name merely resembles.
    return Category::Other;
}

std::string kernelShortName(std::string_view name) {
    std::string_view n = name;
    while (!n.empty() && n.back() == ' ') n.remove_suffix(1);
    // Plain names ("Memcpy DtoH", "nvjet_...") are no signatures: nothing to drop.
    const bool signature = (!n.empty() && n.back() == ')') || n.find("::") != std::string_view::npos;
    if (!signature) return std::string(name);
    // The parameter list: the parenthesis that closes the name and its match.
    if (n.back() == ')') {
        int depth = 0;
        for (size_t i = n.size(); i-- > 0;) {
            if (n[i] == ')') ++depth;
            else if (n[i] == '(' && --depth == 0) {
                n = n.substr(0, i);
                break;
            }
        }
    }
    // The last component outside template arguments and parentheses: what follows the last
    // top-level "::" (namespaces, classes, "(anonymous namespace)") or space (the return type).
    int depth = 0;
    size_t start = n.size();
    for (; start > 0; --start) {
        const char c = n[start - 1];
        if (c == '>' || c == ')') ++depth;
        else if (c == '<' || c == '(') --depth;
        else if (depth == 0 && (c == ' ' || (c == ':' && start >= 2 && n[start - 2] == ':'))) break;
    }
    const std::string_view shortName = n.substr(start);
    return shortName.empty() ? std::string(name) : std::string(shortName);
}

int dtypeBytes(std::string_view dtype) {
    std::string t = toLower(dtype);
    if (startsWith(t, "c10::")) t = t.substr(5);
    if (startsWith(t, "torch.")) t = t.substr(6);
    static const std::pair<std::string_view, int> kSizes[] = {
        {"i8", 1}, {"u8", 1}, {"int8", 1}, {"uint8", 1}, {"char", 1}, {"byte", 1}, {"bool", 1},
        {"f8e4m3", 1}, {"f8e5m2", 1}, {"float8_e4m3fn", 1}, {"float8_e5m2", 1},
        {"f16", 2}, {"half", 2}, {"float16", 2}, {"bf16", 2}, {"bfloat16", 2}, {"short", 2},
        {"f32", 4}, {"float", 4}, {"float32", 4}, {"i32", 4}, {"u32", 4}, {"int", 4}, {"int32", 4},
        {"f64", 8}, {"double", 8}, {"float64", 8}, {"i64", 8}, {"long", 8}, {"int64", 8},
        {"u64", 8},
    };
    for (const auto& [n, bytes] : kSizes)
        if (t == n) return bytes;
    return 0;
}

}  // namespace ts::profiler::import
