#include "stagehand/core/tensor.hpp"

namespace stagehand {

Result<Tensor> Tensor::describe(DType dtype, const Shape& shape, Device device) {
  for (std::int64_t d : shape.dims()) {
    if (d < 0) return Status{ErrorCode::invalid_argument, "negative dimension in " + shape.to_string()};
  }
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.device_ = device;
  return t;
}

Result<Tensor> Tensor::empty(DType dtype, const Shape& shape, Device device) {
  SH_ASSIGN_OR_RETURN(Tensor t, describe(dtype, shape, device));
  void* ptr = device_alloc(device, t.nbytes());
  if (ptr == nullptr) {
    return Status{ErrorCode::no_space, "cannot allocate " + std::to_string(t.nbytes()) +
                                           " bytes on " + device.to_string()};
  }
  t.storage_ = std::shared_ptr<void>(ptr, [device](void* p) { device_free(device, p); });
  return t;
}

Result<Tensor> Tensor::from_blob(void* data, DType dtype, const Shape& shape, Device device,
                                 std::function<void(void*)> deleter) {
  SH_ASSIGN_OR_RETURN(Tensor t, describe(dtype, shape, device));
  if (data == nullptr && t.nbytes() > 0) {
    return Status{ErrorCode::invalid_argument,
                  "Tensor::from_blob: null data for " + std::to_string(t.nbytes()) + " bytes of " + shape.to_string()};
  }
  if (deleter) {
    t.storage_ = std::shared_ptr<void>(data, std::move(deleter));
  } else {
    // Not owned: nothing to free when the last copy goes, so no control block either (an
    // aliasing pointer with no owner): a state of 100,000 views allocates none.
    t.storage_ = std::shared_ptr<void>(std::shared_ptr<void>(), data);
  }
  return t;
}

Status Tensor::copy_to_host(void* dst) const {
  if (!stagehand::copy_to_host(device_, data(), dst, nbytes())) {
    return {ErrorCode::io_error, "device-to-host copy of " + std::to_string(nbytes()) +
                                     " bytes from " + device_.to_string() + " failed"};
  }
  return Status::ok();
}

Status Tensor::copy_from_host(const void* src) {
  if (!stagehand::copy_from_host(device_, src, data(), nbytes())) {
    return {ErrorCode::io_error, "host-to-device copy of " + std::to_string(nbytes()) +
                                     " bytes to " + device_.to_string() + " failed"};
  }
  return Status::ok();
}

}  // namespace stagehand
