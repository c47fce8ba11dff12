#include "stagehand/models/gemm.hpp"

#include <cblas.h>

#include <string>

#ifdef STAGEHAND_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#endif

namespace stagehand {

namespace {

class HostGemm final : public Gemm {
 public:
  HostGemm() { openblas_set_num_threads(1); }

  Status multiply(bool trans_a, bool trans_b, int m, int n, int k, const float* a, int lda, const float* b, int ldb,
                  float* c, int ldc) override {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n, k,
                1.0f, a, lda, b, ldb, 0.0f, c, ldc);
    return Status::ok();
  }

  Device device() const override { return Device::host(); }
};

#ifdef STAGEHAND_HAVE_CUDA
Status cuda_failed(const char* what, int code) {
  return {ErrorCode::io_error, std::string(what) + " failed with error " + std::to_string(code)};
}

/// A device buffer that grows as needed and is kept.
class DeviceBuffer {
 public:
  ~DeviceBuffer() { cudaFree(ptr_); }
  Result<float*> reserve(std::size_t count) {
    if (count > capacity_) {
      cudaFree(ptr_);
      ptr_ = nullptr;
      capacity_ = 0;
      void* raw = nullptr;
      if (cudaError_t err = cudaMalloc(&raw, count * sizeof(float)); err != cudaSuccess) {
        return cuda_failed("cudaMalloc for a matrix product", err);
      }
      ptr_ = static_cast<float*>(raw);
      capacity_ = count;
    }
    return ptr_;
  }

 private:
  float* ptr_ = nullptr;
  std::size_t capacity_ = 0;
};

/// cuBLAS is column-major: a row-major C = op(A) op(B) is the column-major C^T = op(B)^T op(A)^T,
/// so the operands go in swapped.
class CudaGemm final : public Gemm {
 public:
  CudaGemm(Device device, cublasHandle_t handle) : device_(device), handle_(handle) {}
  ~CudaGemm() override { cublasDestroy(handle_); }

  Status multiply(bool trans_a, bool trans_b, int m, int n, int k, const float* a, int lda, const float* b, int ldb,
                  float* c, int ldc) override {
    if (cudaError_t err = cudaSetDevice(device_.index); err != cudaSuccess) return cuda_failed("cudaSetDevice", err);
    const std::size_t a_count = static_cast<std::size_t>(trans_a ? k : m) * static_cast<std::size_t>(lda);
    const std::size_t b_count = static_cast<std::size_t>(trans_b ? n : k) * static_cast<std::size_t>(ldb);
    const std::size_t c_count = static_cast<std::size_t>(m) * static_cast<std::size_t>(ldc);
    SH_ASSIGN_OR_RETURN(float* da, a_.reserve(a_count));
    SH_ASSIGN_OR_RETURN(float* db, b_.reserve(b_count));
    SH_ASSIGN_OR_RETURN(float* dc, c_.reserve(c_count));
    if (cudaError_t err = cudaMemcpy(da, a, a_count * sizeof(float), cudaMemcpyHostToDevice); err != cudaSuccess) {
      return cuda_failed("cudaMemcpy to the device", err);
    }
    if (cudaError_t err = cudaMemcpy(db, b, b_count * sizeof(float), cudaMemcpyHostToDevice); err != cudaSuccess) {
      return cuda_failed("cudaMemcpy to the device", err);
    }
    const float one = 1.0f;
    const float zero = 0.0f;
    cublasStatus_t st = cublasSgemm(handle_, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                    n, m, k, &one, db, ldb, da, lda, &zero, dc, ldc);
    if (st != CUBLAS_STATUS_SUCCESS) return cuda_failed("cublasSgemm", st);
    if (cudaError_t err = cudaMemcpy(c, dc, c_count * sizeof(float), cudaMemcpyDeviceToHost); err != cudaSuccess) {
      return cuda_failed("cudaMemcpy from the device", err);
    }
    return Status::ok();
  }

  Device device() const override { return device_; }

 private:
  Device device_;
  cublasHandle_t handle_;
  DeviceBuffer a_;
  DeviceBuffer b_;
  DeviceBuffer c_;
};
#endif

}  // namespace

Result<std::unique_ptr<Gemm>> Gemm::create(Device device) {
#ifdef STAGEHAND_HAVE_CUDA
  // A simulated GPU's memory is host memory: its products run on the host.
  if (device.is_cuda() && !device_info().simulated) {
    if (cudaError_t err = cudaSetDevice(device.index); err != cudaSuccess) return cuda_failed("cudaSetDevice", err);
    cublasHandle_t handle = nullptr;
    if (cublasStatus_t st = cublasCreate(&handle); st != CUBLAS_STATUS_SUCCESS) return cuda_failed("cublasCreate", st);
    return std::unique_ptr<Gemm>(std::make_unique<CudaGemm>(device, handle));
  }
#endif
  return std::unique_ptr<Gemm>(std::make_unique<HostGemm>());
}

}  // namespace stagehand
