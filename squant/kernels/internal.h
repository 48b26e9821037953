// What one of squant's kernel files offers another (they are built into one library).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace squant_kernels {

// int8_linear.cpp: an int8 linear with float32 output, checked once; the returned function
// writes output rows [m0, m0 + rows), columns [c0, c1) to out (row stride ld, column c0 at
// out[0]), from any thread; c0 is a multiple of 64, and c1 too or out_features. A thread that
// called it calls linear_rows_release() when its share is done (the GEMM's tile state, as
// at::native::cpublas::brgemm_release).
constexpr int64_t kLinearBlockN = 64;
using LinearRows = std::function<void(int64_t m0, int64_t rows, int64_t c0, int64_t c1,
                                      float* out, int64_t ld)>;
LinearRows int8_linear_rows(const at::Tensor& x, const at::Tensor& packed_weight,
                            const at::Tensor& compensation, double x_scale, int64_t x_zero_point,
                            const at::Tensor& weight_scale, const std::optional<at::Tensor>& bias,
                            int64_t out_features, const std::optional<at::Tensor>& row_scale,
                            const std::optional<at::Tensor>& side_x,
                            const std::optional<at::Tensor>& side_w);
void linear_rows_release();

}  // namespace squant_kernels
