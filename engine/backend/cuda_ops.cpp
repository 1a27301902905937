// The CUDA backend's op list (see cuda_ops.h).
#include "engine/backend/cuda_ops.h"

#include <algorithm>

namespace ts::engine {

const std::vector<std::string>& cudaOpNames() {
    static const std::vector<std::string> kOps = {
        // GEMM, linear
        "gemm", "gemmStridedBatched", "linearForward", "linearBackward", "linearForwardGrouped",
        "linearBackwardGrouped",
        // embeddings
        "embeddingForward", "embeddingLookup", "embeddingLookupBf16", "embeddingBackward", "positionEmbeddingForward",
        "positionEmbeddingForwardBf16", "positionEmbeddingBackward",
        // norms
        "layerNormForward", "layerNormBackward", "layerNormForwardFused", "layerNormBackwardFused",
        "rmsNormForward", "rmsNormBackward",
        // rotary embedding
        "ropeForward", "ropeForwardFused", "ropeBackward", "splitQkvRopeForward", "splitQkv", "mergeQkv", "ropeBackwardMergeQkv",
        // attention
        "attentionForward", "attentionBackward", "attentionFlashForward", "attentionFlashBackward",
        "cpAttentionForward", "cpAttentionBackward",
        "cpRingAttentionForward", "cpRingAttentionDelta", "cpRingAttentionBackward",
        // activations
        "biasGeluForward", "biasGeluForwardUnfused", "biasGeluBackward", "swigluForward", "swigluBackward",
        // dropout, residual
        "dropoutForward", "dropoutBackward", "dropoutMask", "biasDropoutAddFused", "biasDropoutAddUnfused",
        "biasDropoutAddBackward",
        // elementwise helpers
        "add", "addInPlace", "scale", "addBias", "biasGradAccumulate", "sumSquares", "sumSquaresAccumulate",
        "allFinite",
        "countInvalidIds",
        // cross entropy
        "crossEntropyRowMax", "crossEntropyStats", "crossEntropyLoss", "crossEntropyBackward",
        "crossEntropyForwardUnfused", "crossEntropyBackwardUnfused", "crossEntropyFused",
        // optimizer
        "adamwStep",
        // bf16
        "floatToBf16", "fp8CodesToBf16", "bf16ToFloat", "roundToBf16",
        // FP8
        "amaxOf", "fp8QuantizeCurrent", "amaxAccumulate", "fp8QuantizeDelayed", "fp8QuantizeDequantize",
        "fp8BlockQuantizeDequantize",
        "fp8CodesToFp8",
        // MoE
        "gatherRows", "gatherSumRows", "scaleRows", "moeProbGrad", "weightedColumnSum", "sigmoidGateForward",
        "sigmoidGateBackward", "moeRouterProbsBackward", "moeRouterAuxBackward", "moeRouteTopK", "moeRoutePlan",
        "moeRouterAuxCounts", "moeRouterProbsCoefficients", "moeRoutingMap", "moeSinkhorn", "moeQbDualUpdate",
    };
    return kOps;
}

bool isCudaOp(const std::string& op) {
    const auto& ops = cudaOpNames();
    return std::find(ops.begin(), ops.end(), op) != ops.end();
}

}  // namespace ts::engine
