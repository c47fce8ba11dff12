#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/device.hpp"
#include "core/dtype.hpp"
#include "core/shape.hpp"
#include "core/status.hpp"

namespace stagehand {

/// A dense, contiguous, row-major tensor in host or device memory. Copies share the storage.
///
/// Thread-safety: like a shared_ptr; concurrent reads are safe, writes need outside ordering.
class Tensor {
 public:
  Tensor() = default;

  /// Allocates an uninitialized tensor on `device`.
  static Result<Tensor> empty(DType dtype, const Shape& shape, Device device);

  // -- properties --

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  Device device() const { return device_; }
  std::int64_t numel() const { return shape_.numel(); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }
  bool defined() const { return storage_ != nullptr; }

  /// Raw bytes; device memory when device().is_cuda().
  void* data() { return storage_.get(); }
  const void* data() const { return storage_.get(); }

  /// Host view of the bytes. @pre !device().is_cuda()
  template <class T>
  T* host_data() {
    return static_cast<T*>(data());
  }

  // -- transfers --

  /// Copies all bytes to host memory at `dst` (nbytes() of room).
  Status copy_to_host(void* dst) const;
  /// Overwrites all bytes from host memory at `src`.
  Status copy_from_host(const void* src);

 private:
  DType dtype_ = DType::f32;
  Shape shape_;
  Device device_;
  std::shared_ptr<void> storage_;
};

}  // namespace stagehand
