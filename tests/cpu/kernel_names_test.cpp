// Short kernel names that stay distinct (reports/kernel_names.h): colliding templates get their
// distinguishing template arguments, functors name elementwise kernels, lambdas that differ only in their
// ordinal are told apart by it, and no label carries a counter.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "reports/kernel_names.h"

namespace fusekit::reports {
namespace {

TEST(KernelNames, CollidingTemplatesGetTheirDistinguishingArguments) {
  const std::vector<std::string> names = {
      "void fusekit::kernels::(anonymous namespace)::layernorm_forward_kernel<__half, 8, 3, 32, false>(__half "
      "const*, int)",
      "void fusekit::kernels::(anonymous namespace)::layernorm_forward_kernel<__half, 8, 4, 32, false>(__half "
      "const*, int)",
      "void fusekit::kernels::(anonymous namespace)::layernorm_forward_kernel<__half, 8, 3, 4, true>(__half "
      "const*, int)",
      "void other_kernel<float>(float*)",
  };
  EXPECT_EQ(distinct_short_names(names),
            (std::vector<std::string>{"layernorm_forward_kernel<3, 32>", "layernorm_forward_kernel<4>",
                                      "layernorm_forward_kernel<3, 4>", "other_kernel"}));
}

TEST(KernelNames, FunctorsNameElementwiseKernels) {
  const std::vector<std::string> names = {
      "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul> "
      ">(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)",
      "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> "
      ">(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)",
      "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<int>, std::array<char*, 1ul> "
      ">(int, at::native::FillFunctor<int>, std::array<char*, 1ul>)",
      "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::(anonymous "
      "namespace)::CompareFunctor<int> >(at::TensorIteratorBase&, at::native::(anonymous "
      "namespace)::CompareFunctor<int> const&)::{lambda(int)#1}>(int, at::native::gpu_kernel_impl_nocast<...>)",
      "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::CUDAFunctor_add<"
      "c10::Half> >(at::TensorIteratorBase&, at::native::CUDAFunctor_add<c10::Half> const&)::{lambda(int)#1}>(int, "
      "at::native::gpu_kernel_impl_nocast<...>)",
  };
  EXPECT_EQ(distinct_short_names(names),
            (std::vector<std::string>{"vectorized_elementwise_kernel<CUDAFunctor_add>",
                                      "vectorized_elementwise_kernel<FillFunctor, float>",
                                      "vectorized_elementwise_kernel<FillFunctor, int>",
                                      "elementwise_kernel<CompareFunctor>", "elementwise_kernel<CUDAFunctor_add>"}));
}

TEST(KernelNames, WordsDropScopesAndSuffixesAndKeepCasts) {
  EXPECT_EQ(template_argument_words("void ns::softmax_forward_kernel<__half, 8, (fusekit::kernels::SoftmaxMask)1, "
                                    "32u, -2>(__half const*, ns::Masking<__half>)",
                                    false),
            (std::vector<std::string>{"__half", "8", "(SoftmaxMask)1", "32", "-2"}));
  EXPECT_TRUE(template_argument_words("plain_kernel(float*)", false).empty());
  EXPECT_TRUE(template_argument_words("nvjet_sm90_hsh_128x256_64x4_2x1_v_bz_coopA_bias_TNN", false).empty());
}

TEST(KernelNames, LambdasThatDifferOnlyInTheirOrdinalAreToldApartByIt) {
  const auto gelu = [](int ordinal) {
    return "void at::native::vectorized_elementwise_kernel<8, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
           "at::native::GeluType)::{lambda()#" +
           std::to_string(ordinal) +
           "}::operator()() const::{lambda(c10::Half)#1}, std::array<char*, 2ul> >(int, at::native::GeluCUDAKernelImpl("
           "at::TensorIteratorBase&, at::native::GeluType)::{lambda()#1}, std::array<char*, 2ul>)";
  };
  const std::vector<std::string> labels = distinct_short_names({gelu(1), gelu(2)});
  EXPECT_EQ(labels, (std::vector<std::string>{"vectorized_elementwise_kernel<lambda#1>",
                                              "vectorized_elementwise_kernel<lambda#2>"}));
}

TEST(KernelNames, NamesThatOnlyNamespacesTellApartKeepThem) {
  EXPECT_EQ(distinct_short_names({"a::k(int)", "b::k(int)", "k(float)"}),
            (std::vector<std::string>{"a::k(int)", "b::k(int)", "k(float)"}));
  EXPECT_EQ(distinct_short_names({"k(int)", "k(float)"}), (std::vector<std::string>{"k(int)", "k(float)"}));
  // Equal names, equal labels; a unique name keeps its short name.
  EXPECT_EQ(distinct_short_names({"void f<int>(int)", "void f<int>(int)", "g"}),
            (std::vector<std::string>{"f", "f", "g"}));
}

TEST(KernelNames, EveryLabelOfManyCollidingNamesIsDistinctAndHasNoCounter) {
  std::vector<std::string> names;
  for (int width : {2, 4, 8})
    for (const char* functor : {"AddFunctor<float>", "AddFunctor<c10::Half>", "MulFunctor<float>", "FillFunctor<int>"})
      for (int arity : {1, 2, 3})
        names.push_back("void at::native::vectorized_elementwise_kernel<" + std::to_string(width) +
                        ", at::native::" + functor + ", std::array<char*, " + std::to_string(arity) + "ul> >(int)");
  names.push_back("void at::native::vectorized_elementwise_kernel<8>(int)");
  const std::vector<std::string> labels = distinct_short_names(names);
  EXPECT_EQ(std::set<std::string>(labels.begin(), labels.end()).size(), names.size());
  for (const std::string& label : labels) {
    EXPECT_EQ(label.find('#'), std::string::npos) << label;
    EXPECT_EQ(label.rfind("vectorized_elementwise_kernel<", 0), 0u) << label;
  }
  EXPECT_EQ(labels[0], "vectorized_elementwise_kernel<2, AddFunctor, float, 1>");
}

}  // namespace
}  // namespace fusekit::reports
