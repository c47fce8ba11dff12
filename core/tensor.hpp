#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "stagehand/core/device.hpp"
#include "stagehand/core/dtype.hpp"
#include "stagehand/core/shape.hpp"
#include "stagehand/core/status.hpp"

namespace stagehand {

/// A dense, contiguous, row-major tensor in host or device memory. Copies share the storage.
///
/// Thread-safety: like a shared_ptr; concurrent reads are safe, writes need outside ordering.
class Tensor {
 public:
  Tensor() = default;

  /// Allocates an uninitialized tensor on `device`.
  static Result<Tensor> empty(DType dtype, const Shape& shape, Device device);

  /// A view of memory the caller owns: `data` holds the dense row-major bytes of `shape` on
  /// `device`. Nothing is copied; saves read and loads write that memory directly. Without a
  /// `deleter` the caller keeps the memory alive while the tensor (and every copy of it, such as
  /// a StateDict handed to a save) is in use; with one, it runs once the last copy is gone.
  /// @pre data != nullptr unless shape has no elements.
  static Result<Tensor> from_blob(void* data, DType dtype, const Shape& shape, Device device,
                                  std::function<void(void*)> deleter = nullptr);

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
  /// A tensor with `dtype`, `shape` and `device` and no storage yet; an error for a negative
  /// dimension.
  static Result<Tensor> describe(DType dtype, const Shape& shape, Device device);

  DType dtype_ = DType::f32;
  Shape shape_;
  Device device_;
  std::shared_ptr<void> storage_;
};

}  // namespace stagehand
