// Kernel-name recognition: NCCL spellings across versions and the category table.
// Expected values are written from NCCL's naming schemes (src/device/generate.py and the
// older NCCL_KERN_NAME macros), not from the parser's output.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>

#include "profiler/import/kernel_names.h"
#include "profiler/import/kineto_import.h"
#include "profiler/import/nsys_import.h"
#include "profiler/import/staging.h"

namespace ts::profiler::import {
namespace {

using trace::Category;

struct NcclCase {
    const char* name;
    const char* op;
    const char* algorithm;
    const char* protocol;
    const char* redOp;
    const char* dataType;
    Category category;
};

TEST(ImportNames, NcclSpellingsAcrossVersions) {
    const NcclCase cases[] = {
        // NCCL 2.9 - 2.18: ncclKernel_<coll>_<algo>_<proto>_<redop>_<C type>(args)
        {"ncclKernel_AllReduce_RING_LL_Sum_float", "AllReduce", "RING", "LL", "Sum", "f32", Category::Collective},
        {"ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "AllReduce", "RING", "LL", "Sum", "f32", Category::Collective},
        {"ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "SendRecv", "RING",
         "SIMPLE", "Sum", "i8", Category::P2P},
        {"ncclKernel_ReduceScatter_RING_LL128_Sum_half", "ReduceScatter", "RING", "LL128", "Sum", "f16",
         Category::Collective},
        {"ncclKernel_AllGather_RING_LL_Sum_int8_t", "AllGather", "RING", "LL", "Sum", "i8", Category::Collective},
        {"ncclKernel_AllReduce_TREE_LL128_Sum___nv_bfloat16", "AllReduce", "TREE", "LL128", "Sum", "bf16",
         Category::Collective},
        {"ncclKernel_AllReduce_COLLNET_DIRECT_SIMPLE_Sum_uint8_t", "AllReduce", "COLLNET_DIRECT", "SIMPLE", "Sum", "u8",
         Category::Collective},
        {"ncclKernel_Broadcast_RING_LL_Sum_int8_t", "Broadcast", "RING", "LL", "Sum", "i8", Category::Collective},
        {"ncclKernel_Reduce_RING_LL_Max_double", "Reduce", "RING", "LL", "Max", "f64", Category::Collective},
        // NCCL >= 2.19: ncclDevKernel_<coll>_<redop>_<type>_<algo>_<proto>
        {"ncclDevKernel_AllReduce_Sum_f32_RING_LL", "AllReduce", "RING", "LL", "Sum", "f32", Category::Collective},
        {"ncclDevKernel_AllReduce_Sum_bf16_NVLS_TREE_SIMPLE(ncclDevKernelArgsStorage<4096ul>)", "AllReduce",
         "NVLS_TREE", "SIMPLE", "Sum", "bf16", Category::Collective},
        {"ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "ReduceScatter", "RING",
         "LL", "Sum", "bf16", Category::Collective},
        {"ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "AllGather", "RING", "LL", "", "",
         Category::Collective},
        {"ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "SendRecv", "", "", "", "", Category::P2P},
        {"ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", "Generic", "", "", "", "", Category::Collective},
        {"ncclDevKernel_AllReduce_PreMulSum_f16_RING_LL128", "AllReduce", "RING", "LL128", "PreMulSum", "f16",
         Category::Collective},
        // NCCL <= 2.8: nccl<Coll><Algo><Proto>Kernel_<redop>_<short type>
        {"ncclAllReduceRingLLKernel_sum_f32", "AllReduce", "RING", "LL", "Sum", "f32", Category::Collective},
        {"ncclAllReduceTreeLL128Kernel_sum_f16", "AllReduce", "TREE", "LL128", "Sum", "f16", Category::Collective},
        {"ncclReduceScatterRingLLKernel_sum_bf16", "ReduceScatter", "RING", "LL", "Sum", "bf16", Category::Collective},
        {"ncclBroadcastRingLLKernel_copy_i8", "Broadcast", "RING", "LL", "", "i8", Category::Collective},
        {"ncclSendRecvKernel_copy_i8", "SendRecv", "", "", "", "i8", Category::P2P},
        {"ncclAllGatherRingLLKernel_copy_u8", "AllGather", "RING", "LL", "", "u8", Category::Collective},
        {"ncclAllReduceCollNetKernel_max_f64", "AllReduce", "COLLNET", "", "Max", "f64", Category::Collective},
    };
    for (const auto& c : cases) {
        SCOPED_TRACE(c.name);
        NcclKernelInfo info = parseNcclKernel(c.name);
        EXPECT_TRUE(info.isNccl);
        EXPECT_EQ(info.op, c.op);
        EXPECT_EQ(info.algorithm, c.algorithm);
        EXPECT_EQ(info.protocol, c.protocol);
        EXPECT_EQ(info.redOp, c.redOp);
        EXPECT_EQ(info.dataType, c.dataType);
        EXPECT_EQ(classifyKernel(c.name), c.category);
    }
}

TEST(ImportNames, NonNcclKernelsAreNotCommunication) {
    for (const char* name : {"void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4>(Params)",
                             "Memcpy DtoD (Device -> Device)", "saxpy", "my_nccl_like_kernel"}) {
        SCOPED_TRACE(name);
        EXPECT_FALSE(parseNcclKernel(name).isNccl);
        Category c = classifyKernel(name);
        EXPECT_NE(c, Category::Collective);
        EXPECT_NE(c, Category::P2P);
    }
}

TEST(ImportNames, CategoryTable) {
    const std::pair<const char*, Category> cases[] = {
        {"void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4>(cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4::Params)",
         Category::Gemm},
        {"sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1", Category::Gemm},
        {"ampere_sgemm_128x64_tn", Category::Gemm},
        {"volta_fp16_s884gemm_fp16_128x128_ldg8_f2f_nn", Category::Gemm},
        {"void gemv2T_kernel_val<int, int, float, float, float, 128, 16, 4, 4, false, false>(...)", Category::Gemm},
        {"void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4> >(Flash_fwd_params)", Category::Attention},
        // Collectives outside NCCL are communication, not the element-wise "reduce" kernels.
        {"void c10d::symmetric_memory::one_shot_all_reduce_kernel<float, 8>(float*, unsigned long, ...)",
         Category::Collective},
        {"void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(...)", Category::Collective},
        {"void userbuffers_fp16_sum_inplace_gpu_rr_rs(int, int, int, int, int, int, void**, int, unsigned long)",
         Category::Collective},
        // ... while reductions and FP8 casts are element-wise.
        {"void cub::DeviceReduceKernel<cub::DeviceReducePolicy<float, int, cuda::std::plus<float> >::Policy600, "
         "float*, float*, int, cuda::std::plus<float> >(float*, float*, int, cuda::std::plus<float>)",
         Category::Elementwise},
        {"void transformer_engine::amax_kernel<4, __nv_bfloat16>(__nv_bfloat16 const*, float*, unsigned long)",
         Category::Elementwise},
        {"cutlass::device_kernel<flash::FlashAttnFwdSm90<...> >", Category::Attention},
        {"fmha_cutlassF_f16_aligned_64x64_rf_sm80", Category::Attention},
        // A softmax alone is not attention (it is also MoE routing, sampling, ...).
        {"void (anonymous namespace)::softmax_warp_forward<float, float, float, 10, false, false>(...)",
         Category::Softmax},
        {"void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(...)",
         Category::Loss},
        {"void at::native::nll_loss_forward_reduce_cuda_kernel_2d<float, float, long>(...)", Category::Loss},
        {"void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>(...)", Category::Norm},
        {"void rms_norm_kernel<c10::BFloat16>(...)", Category::Norm},
        {"void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, at::detail::Array<char*, 1> >(...)",
         Category::Elementwise},
        {"void at::native::unrolled_elementwise_kernel<at::native::CUDAFunctor_add<double>, ...>(...)",
         Category::Elementwise},
        {"void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, ...> >(...)", Category::Elementwise},
        {"void at::native::(anonymous namespace)::embedding_backward_feature_kernel<float, float, long>(...)",
         Category::Embedding},
        {"void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>, ...>(...)", Category::Optimizer},
        {"Memcpy HtoD (Pinned -> Device)", Category::Memcpy},
        {"Memset (Device)", Category::Memset},
        {"par_ranged2d_kernel", Category::Other},
        // Kernel names of today's libraries (issue 15): AMD Tensile/hipBLASLt GEMMs carry
        // "Bias" in the name and were classed elementwise; Hopper cuBLASLt is nvjet_*.
        {"Cijk_Alik_Bljk_SB_Bias_AS_SAV_UserArgs_MT64x16x32_MI16x16x1_SN_LDSB0_AFC1", Category::Gemm},
        {"Cijk_Ailk_Bjlk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT128x128x64_MI16x16x1", Category::Gemm},
        {"nvjet_tst_128x256_64x4_2x1_v_bz_coopB_TNT", Category::Gemm},
        {"sm90_xmma_gemm_bf16bf16_bf16f32_f32_nt_n_tilesize128x256x64_cgasize1x2x1_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas",
         Category::Gemm},
        {"void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x1_tn_align8>(...)", Category::Gemm},
        {"void ck::kernel_gemm_xdl_cshuffle_v3<ck::GridwiseGemm_xdl_cshuffle_v3<...> >(...)", Category::Gemm},
        {"triton_tem_fused_mm_0", Category::Gemm},
        {"void cudnn::cnn::implicit_convolve_sgemm<float, float, 128, 5, 5, 3, 3, 3, 1, false, false, true>(...)",
         Category::Gemm},
        {"cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x128x128_4x1x1_kernel0_0", Category::Attention},
        {"void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4, false, false, cutlass::bfloat16_t> >(...)",
         Category::Attention},
        {"void ck_tile::kentry<64, 2, ck_tile::FmhaFwdKernel<...> >(...)", Category::Attention},
        {"_ZN5aiter33fmha_fwd_hd128_bf16_causal_a16_psskE", Category::Attention},
        {"void transformer_engine::fused_attn::cudnn_fused_attn_fwd(...)", Category::Attention},
        {"void transformer_engine::rmsnorm::rmsnorm_fwd_tuned_kernel<...>(...)", Category::Norm},
        {"void transformer_engine::transpose::cast_transpose_kernel<...>(...)", Category::Elementwise},
        {"triton_poi_fused_add_cos_sin_0", Category::Elementwise},
        {"triton_red_fused_native_layer_norm_0", Category::Norm},
        {"triton_per_fused_sum_1", Category::Elementwise},
        {"ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)", Category::Collective},
        {"dma_in_copy", Category::Memcpy},
        {"Stream Sync", Category::Other},
        {"some_library_kernel_v2", Category::Other},
        {"saxpy", Category::Other},
    };
    for (const auto& [name, category] : cases) {
        SCOPED_TRACE(name);
        EXPECT_EQ(classifyKernel(name), category);
    }
}

// Our own CUDA kernels land in the kernel mix by name, as any tool's would: every __global__
// function in kernels/cuda/ must carry a word classifyKernel knows, and the category its file's
// work belongs to. Read from the sources, so a new kernel with a bare name fails here.
TEST(ImportNames, OurCudaKernelsAreClassifiedByTheirFilesWork) {
    const std::map<std::string, std::set<Category>> expected = {
        {"activation.cu", {Category::Elementwise}},
        {"adamw.cu", {Category::Optimizer}},
        // The softmax and dropout rows between the attention's batched GEMMs read as Megatron's
        // own kernels do in Nsight (scaled_masked_softmax_*, dropout): softmax and elementwise.
        {"attention.cu", {Category::Attention, Category::Softmax, Category::Elementwise}},
        {"attention_cp.cu", {Category::Attention}},
        {"flash_attention.cu", {Category::Attention}},
        {"bf16.cu", {Category::Elementwise}},
        {"cross_entropy.cu", {Category::Loss}},
        {"dropout.cu", {Category::Elementwise}},
        // Reductions of the gradient norm and the finite check belong to the optimizer step.
        {"elementwise.cu", {Category::Elementwise, Category::Optimizer}},
        {"embedding.cu", {Category::Embedding}},
        {"fp8.cu", {Category::Elementwise}},
        {"gemm.cu", {Category::Elementwise}},
        {"moe.cu", {Category::Elementwise}},
        {"moe_route.cu", {Category::Elementwise}},
        {"norm.cu", {Category::Norm}},
        {"rope.cu", {Category::Elementwise}},
    };
    const std::filesystem::path dir = std::filesystem::path(TS_SOURCE_DIR) / "kernels" / "cuda";
    // __global__ void [__launch_bounds__(...)] name(
    const std::regex global(R"(__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s+)?(\w+))");
    int kernels = 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
        const std::string file = entry.path().filename().string();
        if (entry.path().extension() != ".cu") continue;
        std::ifstream in(entry.path());
        const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        auto it = expected.find(file);
        const bool hasKernels = std::regex_search(text, global);
        if (it == expected.end()) {
            EXPECT_FALSE(hasKernels) << file << " has kernels: add it to this table";
            continue;
        }
        for (std::sregex_iterator m(text.begin(), text.end(), global), end; m != end; ++m) {
            ++kernels;
            // What CUPTI reports, demangled: namespaces, then the parameters.
            const std::string name = "ts::kernels::cuda::(anonymous namespace)::" + (*m)[1].str() + "(float const*, long)";
            const Category c = classifyKernel(name);
            EXPECT_TRUE(it->second.count(c)) << file << ": " << (*m)[1].str() << " is classified "
                                             << trace::categoryName(c);
        }
    }
    EXPECT_GT(kernels, 50);
}

TEST(ImportNames, ShortNamesDropSignaturesNotTemplates) {
    EXPECT_EQ(kernelShortName("void ts::kernels::cuda::(anonymous namespace)::layerOrRmsNormForwardKernel(float const*, "
                              "float const*, float*, int)"),
              "layerOrRmsNormForwardKernel");
    EXPECT_EQ(kernelShortName("ts::kernels::cuda::(anonymous namespace)::addKernel(float const*, long)"), "addKernel");
    EXPECT_EQ(kernelShortName("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
                              "at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)"),
              "vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, at::detail::Array<char*, 1> >");
    EXPECT_EQ(kernelShortName("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_bf16_128x64_64x4_tn_align8>("
                              "cutlass_80_tensorop_bf16_s16816gemm_bf16_128x64_64x4_tn_align8::Params)"),
              "Kernel2<cutlass_80_tensorop_bf16_s16816gemm_bf16_128x64_64x4_tn_align8>");
    EXPECT_EQ(kernelShortName("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"),
              "ncclDevKernel_AllReduce_Sum_f32_RING_LL");
    EXPECT_EQ(kernelShortName("nvjet_sm90_tss_128x64_64x8_1x2_h_bz_NNT"), "nvjet_sm90_tss_128x64_64x8_1x2_h_bz_NNT");
    EXPECT_EQ(kernelShortName("Memcpy HtoD (Pageable -> Device)"), "Memcpy HtoD (Pageable -> Device)");
    EXPECT_EQ(kernelShortName("Memcpy DtoH"), "Memcpy DtoH");
    EXPECT_EQ(kernelShortName(""), "");
}

TEST(ImportNames, DtypeSizes) {
    EXPECT_EQ(dtypeBytes("Float"), 4);
    EXPECT_EQ(dtypeBytes("c10::BFloat16"), 2);
    EXPECT_EQ(dtypeBytes("bf16"), 2);
    EXPECT_EQ(dtypeBytes("Half"), 2);
    EXPECT_EQ(dtypeBytes("Long"), 8);
    EXPECT_EQ(dtypeBytes("Byte"), 1);
    EXPECT_EQ(dtypeBytes("complex"), 0);
}

TEST(ImportNames, StepNames) {
    EXPECT_EQ(parseStepName("ProfilerStep#1009"), 1009);
    EXPECT_EQ(parseStepName("step 7"), 7);
    EXPECT_EQ(parseStepName("iteration 12"), 12);
    EXPECT_EQ(parseStepName("ProfilerStep#"), std::nullopt);
    EXPECT_EQ(parseStepName("ProfilerStep#12a"), std::nullopt);
    EXPECT_EQ(parseStepName("forward"), std::nullopt);
    EXPECT_EQ(parseStepName("stepper 3"), std::nullopt);
}

TEST(ImportNames, ApiVersionSuffix) {
    EXPECT_EQ(stripApiVersion("cudaLaunchKernel_v7000"), "cudaLaunchKernel");
    EXPECT_EQ(stripApiVersion("cudaMemcpy_v3020"), "cudaMemcpy");
    EXPECT_EQ(stripApiVersion("cudaLaunchKernel"), "cudaLaunchKernel");
    EXPECT_EQ(stripApiVersion("cuda_vX"), "cuda_vX");
}

TEST(ImportNames, MicrosecondTextToNanoseconds) {
    int64_t ns = 0;
    ASSERT_TRUE(microsTextToNs("1.5", ns));
    EXPECT_EQ(ns, 1500);
    // An epoch-sized value keeps every digit (a double would lose ~128 ns here).
    ASSERT_TRUE(microsTextToNs("1661203462598738.123", ns));
    EXPECT_EQ(ns, 1661203462598738123LL);
    ASSERT_TRUE(microsTextToNs("1661203462598738", ns));
    EXPECT_EQ(ns, 1661203462598738000LL);
    ASSERT_TRUE(microsTextToNs("1.2e3", ns));
    EXPECT_EQ(ns, 1200000);
    ASSERT_TRUE(microsTextToNs("1.6612034625987381E+15", ns));
    EXPECT_EQ(ns, 1661203462598738100LL);
    ASSERT_TRUE(microsTextToNs("-2.5", ns));
    EXPECT_EQ(ns, -2500);
    ASSERT_TRUE(microsTextToNs("0.0005", ns));  // 0.5 ns rounds half away from zero
    EXPECT_EQ(ns, 1);
    ASSERT_TRUE(microsTextToNs("0.00049", ns));
    EXPECT_EQ(ns, 0);
    EXPECT_FALSE(microsTextToNs("abc", ns));
    EXPECT_FALSE(microsTextToNs("1e30", ns));
    EXPECT_FALSE(microsTextToNs("12x", ns));
}

}  // namespace
}  // namespace ts::profiler::import
