// Float64 reference of the linear layer, forward and backward (the math is in kernels/linear.h).
// Row-major: x [rows, K], weight [N, K], bias [N], y and pre [rows, N]. No padding: the tests pad
// and unpad around it.
#pragma once

#include <vector>

namespace fusekit::reference {

// GELU, tanh form (what cuBLASLt's epilogues compute), and its derivative.
double gelu_tanh(double z);
double gelu_tanh_grad(double z);

struct LinearForward {
  std::vector<double> y, pre;  // pre = x W^T + b; y = pre (bias) or gelu_tanh(pre) (gelu)
};

LinearForward linear_forward(const std::vector<double>& x, const std::vector<double>& weight,
                             const std::vector<double>& bias, int rows, int out_features, int in_features, bool gelu);

struct LinearBackward {
  std::vector<double> dx, dweight, dbias;
};

// Given dy, the gradient of y = x W^T + b.
LinearBackward linear_backward(const std::vector<double>& dy, const std::vector<double>& x,
                               const std::vector<double>& weight, int rows, int out_features, int in_features);

// linear_weight_gradient's: dweight = dweight_in + dy^T x (dweight_in empty: dy^T x alone, no
// accumulation), dbias = sum_rows(dy); dx is left empty. Computes dy^T x only, not dx, so that
// vocabulary-sized layers stay cheap.
LinearBackward linear_weight_gradient(const std::vector<double>& dy, const std::vector<double>& x,
                                      const std::vector<double>& dweight_in, int rows, int out_features,
                                      int in_features);

struct GeluBackwardInput {
  std::vector<double> dpre, dbias;
};

// dpre = gelu_tanh'(pre) * (dz W_next), dbias = sum_rows(dpre); dz [rows, next_features], weight_next
// [next_features, features], pre [rows, features].
GeluBackwardInput linear_gelu_backward_input(const std::vector<double>& dz, const std::vector<double>& weight_next,
                                             const std::vector<double>& pre, int rows, int next_features, int features);

}  // namespace fusekit::reference
