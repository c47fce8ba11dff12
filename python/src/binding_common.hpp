#pragma once

// What the binding's parts share: stagehand.Error, arrays as entries of a state (DLPack, no
// copy), and each part's bind function.

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "stagehand/core/copy_engine.hpp"
#include "stagehand/core/device.hpp"
#include "stagehand/core/dtype.hpp"
#include "stagehand/core/sharded_tensor.hpp"
#include "stagehand/core/status.hpp"

namespace stagehand_python {

namespace nb = nanobind;
using namespace stagehand;

/// What a failed Status becomes: stagehand.Error (a RuntimeError) with the C++ message.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline void check(const Status& st) {
  if (!st.is_ok()) throw Error(st.to_string());
}

/// Saves read an array (read-only ones too: np.load(mmap_mode="r")); loads write into one.
using ReadArray = nb::ndarray<nb::ro, nb::c_contig>;
using WriteArray = nb::ndarray<nb::c_contig>;

/// The dtypes that cross DLPack as they are: its type code and bits for each.
struct DlpackDtype {
  nb::dlpack::dtype_code code;
  int bits;
  DType dtype;
};
inline constexpr DlpackDtype kDlpackDtypes[] = {
    {nb::dlpack::dtype_code::Float, 64, DType::f64}, {nb::dlpack::dtype_code::Float, 32, DType::f32},
    {nb::dlpack::dtype_code::Float, 16, DType::f16}, {nb::dlpack::dtype_code::Bfloat, 16, DType::bf16},
    {nb::dlpack::dtype_code::Int, 64, DType::i64},   {nb::dlpack::dtype_code::Int, 32, DType::i32},
    {nb::dlpack::dtype_code::Int, 16, DType::i16},   {nb::dlpack::dtype_code::Int, 8, DType::i8},
    {nb::dlpack::dtype_code::UInt, 64, DType::u64},  {nb::dlpack::dtype_code::UInt, 32, DType::u32},
    {nb::dlpack::dtype_code::UInt, 16, DType::u16},  {nb::dlpack::dtype_code::UInt, 8, DType::u8},
    {nb::dlpack::dtype_code::Bool, 8, DType::boolean}};

inline std::optional<DType> dtype_of(nb::dlpack::dtype t) {
  if (t.lanes != 1) return std::nullopt;
  for (const DlpackDtype& k : kDlpackDtypes) {
    if (static_cast<nb::dlpack::dtype_code>(t.code) == k.code && t.bits == k.bits) return k.dtype;
  }
  return std::nullopt;
}

/// One tensor of a rank's state: the array's memory (not copied) and where it lies in its global
/// tensor. The entry owns the array's DLPack capsule: a producer may export a copy of its data,
/// which lives only as long as the capsule (the Python layer keeps the entries, and the objects
/// they came from, alive as long as a save or load may use them).
struct Entry {
  ShardedTensor tensor;
  nb::ndarray<> owner;
};

template <class Array>
Entry make_entry(const std::string& name, Array array, const std::string& dtype_name, std::vector<std::int64_t> global_shape,
                 std::vector<std::int64_t> offsets, int replica_id) {
  DType dtype;
  if (dtype_name.empty()) {
    auto found = dtype_of(array.dtype());
    if (!found) {
      throw nb::type_error(("tensor '" + name + "': its dtype (DLPack code " + std::to_string(array.dtype().code) +
                            ", " + std::to_string(array.dtype().bits) + " bits) is not one Stagehand saves")
                               .c_str());
    }
    dtype = *found;
  } else {
    auto found = dtype_from_name(dtype_name);
    if (!found) throw nb::type_error(("tensor '" + name + "': unknown dtype '" + dtype_name + "'").c_str());
    dtype = *found;
    if (array.itemsize() != dtype_size(dtype)) {
      throw nb::type_error(("tensor '" + name + "': elements of " + std::to_string(array.itemsize()) +
                            " bytes cannot hold " + dtype_name)
                               .c_str());
    }
  }
  std::vector<std::int64_t> dims(array.ndim());
  for (std::size_t d = 0; d < array.ndim(); ++d) dims[d] = static_cast<std::int64_t>(array.shape(d));
  Device device = Device::host();
  if (array.device_type() == nb::device::cuda::value) {
    // Without a GPU this process copies with the host engine, which would read the device
    // pointer as host memory: refused here, naming the tensor and why no GPU is used.
    const DeviceInfo& info = device_info();
    if (array.device_id() < 0 || array.device_id() >= info.gpu_count) {
      throw Error("tensor '" + name + "' is on CUDA device " + std::to_string(array.device_id()) + ", but this process uses " +
                  std::to_string(info.gpu_count) + " GPU(s)" + (info.reason.empty() ? "" : " (" + info.reason + ")") +
                  ": move it to host memory (.cpu()) or run where the GPU is visible");
    }
    device = Device::cuda(array.device_id());
  } else if (array.device_type() != nb::device::cpu::value) {
    throw nb::type_error(("tensor '" + name + "': only host and CUDA memory can be saved").c_str());
  }
  const Shape shape{std::span<const std::int64_t>(dims)};
  // A save only reads through the pointer (ReadArray); a load writes through a WriteArray's.
  auto wrapped = Tensor::from_blob(const_cast<void*>(static_cast<const void*>(array.data())), dtype, shape, device);
  check(wrapped.status().with_context("tensor '" + name + "'"));
  Entry entry;
  entry.tensor.desc.name = name;
  entry.tensor.desc.dtype = dtype;
  entry.tensor.desc.local_shape = shape;
  // A whole tensor: its own shape, at offset 0.
  if (global_shape.empty() && offsets.empty()) {
    global_shape = dims;
    offsets.assign(dims.size(), 0);
  }
  entry.tensor.desc.global_shape = Shape{std::span<const std::int64_t>(global_shape)};
  entry.tensor.desc.global_offset = Shape{std::span<const std::int64_t>(offsets)};
  entry.tensor.desc.replica_id = replica_id;
  entry.tensor.tensor = std::move(*wrapped);
  entry.owner = nb::ndarray<>(array);
  return entry;
}

inline StateDict state_of(const std::vector<const Entry*>& entries, const std::map<std::string, std::string>& objects) {
  StateDict state;
  state.tensors.reserve(entries.size());
  for (const Entry* e : entries) state.tensors.push_back(e->tensor);
  state.objects = objects;
  return state;
}

/// stagehand._WeightPublisher / _WeightReceiver (weight_sync_bindings.cpp).
void bind_weight_sync(nb::module_& m);

}  // namespace stagehand_python
