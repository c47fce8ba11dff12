#pragma once

#include <memory>

#include "stagehand/core/device.hpp"
#include "stagehand/core/status.hpp"

namespace stagehand {

/// Row-major matrix products for the reference workload: C[m, n] = op(A) op(B), where op
/// transposes when asked. Operands and result are host arrays; on a CUDA device the product runs
/// on the GPU with cuBLAS (operands copied in, result copied out), otherwise with OpenBLAS.
///
/// Thread-safety: one instance per thread (a Worker's model owns one).
class Gemm {
 public:
  virtual ~Gemm() = default;

  /// A Gemm for `device`: cuBLAS for a CUDA device, OpenBLAS for host memory.
  static Result<std::unique_ptr<Gemm>> create(Device device);

  /// @return an error when the CUDA runtime or cuBLAS failed.
  virtual Status multiply(bool trans_a, bool trans_b, int m, int n, int k, const float* a, int lda, const float* b,
                          int ldb, float* c, int ldc) = 0;

  virtual Device device() const = 0;
};

}  // namespace stagehand
