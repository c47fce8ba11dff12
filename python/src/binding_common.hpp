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

/// One call's tensors, built in place as the Python layer walks its state: a StateDict of views
/// of the arrays' memory (nothing is copied) and the arrays whose DLPack capsules own that
/// memory (a producer may export a copy of its data, which lives only as long as the capsule).
/// Torch CPU tensors come by pointer (add_host): the Python layer keeps them referenced, and no
/// DLPack capsule, detached tensor or wrapper object is made per tensor. The Python layer keeps
/// this object, and the arrays it came from, alive as long as a save or load may use them.
struct BoundTensors {
  StateDict state;
  std::vector<nb::ndarray<>> owners;
  /// take_state() handed `state` to a call.
  bool taken = false;
};

/// Refuses `bound` once take_state() handed its tensors to a call.
inline void check_untaken(const BoundTensors& bound) {
  if (bound.taken) throw Error("these tensors were already handed to a call");
}

/// Appends the tensor `name` (the memory at `data`) to `bound`. Empty `global_shape` and
/// `offsets`: a whole tensor (its own shape, at offset 0).
inline void add_tensor(BoundTensors& bound, const std::string& name, void* data, DType dtype,
                       std::vector<std::int64_t> dims, Device device, std::vector<std::int64_t> global_shape,
                       std::vector<std::int64_t> offsets, int replica_id) {
  check_untaken(bound);
  if (dims.size() > Shape::kMaxRank || global_shape.size() > Shape::kMaxRank || offsets.size() > Shape::kMaxRank) {
    throw nb::value_error(("tensor '" + name + "' has more than " + std::to_string(Shape::kMaxRank) +
                           " dimensions").c_str());
  }
  const Shape shape{std::span<const std::int64_t>(dims)};
  auto wrapped = Tensor::from_blob(data, dtype, shape, device);
  check(wrapped.status().with_context("tensor '" + name + "'"));
  ShardedTensor& t = bound.state.tensors.emplace_back();
  t.desc.name = name;
  t.desc.dtype = dtype;
  t.desc.local_shape = shape;
  if (global_shape.empty() && offsets.empty()) {
    global_shape = dims;
    offsets.assign(dims.size(), 0);
  }
  t.desc.global_shape = Shape{std::span<const std::int64_t>(global_shape)};
  t.desc.global_offset = Shape{std::span<const std::int64_t>(offsets)};
  t.desc.replica_id = replica_id;
  t.tensor = std::move(*wrapped);
}

/// Appends an array (DLPack or the buffer protocol): its dtype is `dtype_name`'s (an element of
/// the same size, for dtypes DLPack lacks) or, empty, the array's own.
template <class Array>
void add_array(BoundTensors& bound, const std::string& name, Array array, const std::string& dtype_name,
               std::vector<std::int64_t> global_shape, std::vector<std::int64_t> offsets, int replica_id) {
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
  // A save only reads through the pointer (ReadArray); a load writes through a WriteArray's.
  add_tensor(bound, name, const_cast<void*>(static_cast<const void*>(array.data())), dtype, std::move(dims), device,
             std::move(global_shape), std::move(offsets), replica_id);
  bound.owners.push_back(nb::ndarray<>(array));
}

/// Appends `shape` elements of `dtype_name` at host address `data`, which the caller keeps
/// valid (the Python layer holds the torch tensor it took the pointer from).
inline void add_host(BoundTensors& bound, const std::string& name, std::uintptr_t data, std::vector<std::int64_t> dims,
                     const std::string& dtype_name, std::vector<std::int64_t> global_shape,
                     std::vector<std::int64_t> offsets, int replica_id) {
  auto dtype = dtype_from_name(dtype_name);
  if (!dtype) throw nb::type_error(("tensor '" + name + "': unknown dtype '" + dtype_name + "'").c_str());
  add_tensor(bound, name, reinterpret_cast<void*>(data), *dtype, std::move(dims), Device::host(),
             std::move(global_shape), std::move(offsets), replica_id);
}

/// A copy of `bound`'s tensors (views: their memory is shared) with `objects`.
inline StateDict state_of(const BoundTensors& bound, const std::map<std::string, std::string>& objects) {
  check_untaken(bound);
  StateDict state;
  state.tensors = bound.state.tensors;
  state.objects = objects;
  return state;
}

/// `bound`'s tensors with `objects`, moved out (no copy of the descriptors): for a call that
/// keeps the state, such as the Checkpointer's first. `bound` keeps its arrays.
inline StateDict take_state(BoundTensors& bound, const std::map<std::string, std::string>& objects) {
  check_untaken(bound);
  bound.taken = true;
  StateDict state;
  state.tensors = std::move(bound.state.tensors);
  state.objects = objects;
  return state;
}

/// stagehand._WeightPublisher / _WeightReceiver (weight_sync_bindings.cpp).
void bind_weight_sync(nb::module_& m);

}  // namespace stagehand_python
