// The kernel categories: hand-picked names for each rule, and every distinct kernel name of the H100
// evidence stores (evidence/h100/{models,ops,attention}.db.xz: fusekit's kernels, the libtorch
// baselines, the PyTorch eager and torch.compile peers, Hugging Face's BERT and timm's Swin steps;
// 1025 names, with those of the stores before them) against the category it was reviewed to have,
// in kernel_names.tsv ("<category>\t<demangled name>").
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <string>

#include "profiler/kernel_category.h"

namespace fusekit::profiler {
namespace {

std::string category_of(std::string_view name) { return std::string(category_name(classify_kernel(name))); }

TEST(KernelCategory, NamesAndKeys) {
  EXPECT_EQ(category_name(KernelCategory::gemm), "GEMM");
  EXPECT_EQ(category_name(KernelCategory::copy), "copy/cast");
  EXPECT_EQ(category_key(KernelCategory::copy), "copy_cast");
  EXPECT_EQ(category_key(KernelCategory::gemm), "gemm");
  EXPECT_EQ(category_key(KernelCategory::other), "other");
  for (size_t i = 0; i < kKernelCategories.size(); ++i) EXPECT_EQ(static_cast<size_t>(kKernelCategories[i]), i);
}

TEST(KernelCategory, GemmLibraries) {
  EXPECT_EQ(category_of("nvjet_sm90_hsh_128x256_64x4_2x1_v_bz_coopA_bias_TNN"), "GEMM");
  EXPECT_EQ(category_of("sm90_xmma_gemm_f16f16_f16f32_f32_nt_n_tilesize128x256x32_warpgroupsize2x1x1_bgradb_execute_"
                        "segment_k_off_kernel__5x_cublas"),
            "GEMM");
  EXPECT_EQ(category_of("void cutlass::Kernel2<cutlass_80_tensorop_f16_s16816gemm_f16_128x256_64x3_nn_align2>("
                        "cutlass_80_tensorop_f16_s16816gemm_f16_128x256_64x3_nn_align2::Params)"),
            "GEMM");
  EXPECT_EQ(category_of("void cublasLt::splitKreduce_kernel<32, 16, int, __half, __half, float, __half, false>("
                        "cublasLt::cublasSplitKParams<float>)"),
            "GEMM");
  // The epilogue's GELU is a GEMM's, not an activation kernel.
  EXPECT_EQ(category_of("nvjet_sm90_hsh_96x128_64x7_2x1_v_bz_geluauxbias_auxh_TNN"), "GEMM");
}

TEST(KernelCategory, FunctorsDecidePyTorchsElementwiseKernels) {
  EXPECT_EQ(category_of("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
                        "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)"),
            "elementwise");
  EXPECT_EQ(category_of("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::"
                        "TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda(float)#1}, std::array<char*, "
                        "2ul>, 4>(int)"),
            "copy/cast");
  EXPECT_EQ(category_of("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
                        "std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)"),
            "copy/cast");
  EXPECT_EQ(category_of("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous "
                        "namespace)::FusedOptimizerTensorListMetadata<4>, at::native::(anonymous namespace)::"
                        "FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>, float const*>()"),
            "optimizer");
  EXPECT_EQ(category_of("void at::native::reduce_kernel<128, 4, at::native::ReduceOp<float, at::native::"
                        "func_wrapper_t<float, at::native::sum_functor<float, float, float>>>>()"),
            "elementwise");
}

TEST(KernelCategory, LogSoftmaxIsTheLossSoftmaxIsAttention) {
  EXPECT_EQ(category_of("void at::native::(anonymous namespace)::cunn_SoftMaxForward<8, c10::Half, float, c10::Half, "
                        "at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(c10::Half*, c10::Half const*, "
                        "int)"),
            "loss");
  EXPECT_EQ(category_of("void (anonymous namespace)::softmax_warp_forward<c10::Half, c10::Half, float, 10, true, "
                        "false>(c10::Half*, c10::Half const*, int, int, int, bool const*, int, bool)"),
            "loss");
  EXPECT_EQ(category_of("void (anonymous namespace)::softmax_warp_forward<c10::Half, c10::Half, float, 7, false, "
                        "false>(c10::Half*, c10::Half const*, int, int, int, bool const*, int, bool)"),
            "attention");
  EXPECT_EQ(category_of("void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, "
                        "float, long>(float*, float*, float const*, long const*, float const*, bool, long, long, long, "
                        "long)"),
            "loss");
}

TEST(KernelCategory, FusekitsKernels) {
  EXPECT_EQ(category_of("void fusekit::kernels::(anonymous namespace)::bert_attention_forward_kernel<__half, 64>("
                        "__half const*, int const*, __half*, float*, int, int, float, fusekit::kernels::(anonymous "
                        "namespace)::KeyedDropout)"),
            "attention");
  EXPECT_EQ(category_of("void fusekit::kernels::(anonymous namespace)::bias_dropout_residual_layernorm_forward_kernel<"
                        "__half, 8, 2, 64>(fusekit::kernels::(anonymous namespace)::ForwardArgs<__half>)"),
            "normalization");
  EXPECT_EQ(category_of("void fusekit::kernels::(anonymous namespace)::bias_gelu_backward_kernel<__half, 8, "
                        "(fusekit::kernels::GeluApproximation)1>(__half const*, __half const*, __half const*, __half*, "
                        "float*, int, int)"),
            "elementwise");
  EXPECT_EQ(category_of("fusekit::kernels::(anonymous namespace)::cross_entropy_mean_kernel(float const*, long const*, "
                        "int, long, float*, int*)"),
            "loss");
  EXPECT_EQ(category_of("void fusekit::kernels::(anonymous namespace)::adamw_trainer_kernel<__half, true>(__half*, "
                        "__half const*, float*, float*, float*, unsigned long)"),
            "optimizer");
  EXPECT_EQ(category_of("void fusekit::kernels::(anonymous namespace)::gather_rows_kernel<__half, 8, true>(__half "
                        "const*, int const*, __half*, int, long long, int)"),
            "copy/cast");
  EXPECT_EQ(category_of("void fusekit::kernels::(anonymous namespace)::skinny_forward_mma_kernel<__half, 32, 64>("
                        "__half const*, __half const*, __half const*, __half*, int, int, int, int, bool, bool)"),
            "GEMM");
  EXPECT_EQ(category_of("void fusekit::dp::(anonymous namespace)::selection_count_kernel<float>(float const*, long)"),
            "communication");
}

TEST(KernelCategory, TritonKernelsByWhatTheyFuse) {
  EXPECT_EQ(category_of("triton_per_fused__to_copy_add_native_dropout_native_layer_norm_native_layer_norm_backward_4"),
            "normalization");
  EXPECT_EQ(category_of("triton_red_fused__log_softmax__to_copy_addmm_nll_loss_forward_sub_view_14"), "loss");
  EXPECT_EQ(category_of("triton_per_fused__softmax_backward_data_mul_native_dropout_backward_view_1"), "attention");
  EXPECT_EQ(category_of("triton_poi_fused_gelu_gelu_backward_view_10"), "elementwise");
  EXPECT_EQ(category_of("triton_poi_fused__to_copy_add_21"), "elementwise");  // computes an add
  EXPECT_EQ(category_of("triton_poi_fused__to_copy_5"), "copy/cast");
  EXPECT_EQ(category_of("triton_poi_fused_clone_permute_select_transpose_1"), "copy/cast");
  EXPECT_EQ(category_of("triton_poi_fused_mm_2"), "copy/cast");  // a GEMM operand's layout copy
  EXPECT_EQ(category_of("triton_per_fused_embedding_dense_backward_nll_loss_forward_sum_21"), "copy/cast");
  EXPECT_EQ(category_of("triton_for_fused_3"), "optimizer");  // a compiled foreach AdamW
  EXPECT_EQ(category_of("triton_tem_fused_addmm_0"), "GEMM");
  EXPECT_EQ(category_of("triton_poi_fused_0"), "elementwise");
}

TEST(KernelCategory, CollectivesAndUnknownNames) {
  EXPECT_EQ(category_of("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"), "communication");
  EXPECT_EQ(category_of("my_kernel"), "other");
  EXPECT_EQ(category_of(""), "other");
}

TEST(KernelCategory, EveryNameOfTheEvidenceStores) {
  std::ifstream in(std::string(FUSEKIT_TEST_DATA_DIR) + "/kernel_names.tsv");
  ASSERT_TRUE(in) << "kernel_names.tsv";
  std::map<std::string, int> count;
  int names = 0;
  for (std::string line; std::getline(in, line);) {
    const size_t tab = line.find('\t');
    ASSERT_NE(tab, std::string::npos) << line;
    const std::string expected = line.substr(0, tab);
    const std::string name = line.substr(tab + 1);
    EXPECT_EQ(category_of(name), expected) << name;
    ++count[expected];
    ++names;
  }
  EXPECT_EQ(names, 1025);
  EXPECT_EQ(count["other"], 0);
  for (KernelCategory c : kKernelCategories) {
    if (c != KernelCategory::other && c != KernelCategory::communication) {
      EXPECT_GT(count[std::string(category_name(c))], 0) << category_name(c);
    }
  }
}

}  // namespace
}  // namespace fusekit::profiler
