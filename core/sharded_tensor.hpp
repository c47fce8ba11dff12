#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "stagehand/core/dtype.hpp"
#include "stagehand/core/shape.hpp"
#include "stagehand/core/status.hpp"
#include "stagehand/core/tensor.hpp"

namespace stagehand {

/// The safetensors key of the block of `name` at `offsets`: "<name>@<offset0>,<offset1>,...".
std::string chunk_key(const std::string& name, const Shape& offsets);

/// Where one rank's piece of a global tensor sits: the global shape, the offset of the local
/// block in it, the local block's shape, and which replica of that block this rank holds
/// (0 is the one that is saved; data-parallel copies have replica_id > 0).
struct ShardedTensorDesc {
  std::string name;
  DType dtype = DType::f32;
  Shape global_shape;
  Shape global_offset;
  Shape local_shape;
  std::int32_t replica_id = 0;

  std::size_t nbytes() const {
    return static_cast<std::size_t>(local_shape.numel()) * dtype_size(dtype);
  }

  /// The safetensors key of this block (see stagehand::chunk_key).
  std::string chunk_key() const { return stagehand::chunk_key(name, global_offset); }

  /// Checks ranks agree and the local block lies inside the global shape.
  Status validate() const;

  friend bool operator==(const ShardedTensorDesc&, const ShardedTensorDesc&) = default;
};

/// For CAF's serialization (descriptors travel in save plans and reports).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ShardedTensorDesc& x) {
  return f(x.name, x.dtype, x.global_shape, x.global_offset, x.local_shape, x.replica_id);
}

/// A descriptor and the local data it describes.
struct ShardedTensor {
  ShardedTensorDesc desc;
  Tensor tensor;
};

/// One rank's checkpointable state: sharded tensors and small objects (JSON text by name).
struct StateDict {
  std::vector<ShardedTensor> tensors;
  std::map<std::string, std::string> objects;

  /// Adds a block of a global tensor; the dtype and local shape come from `tensor`.
  void add(std::string name, Tensor tensor, Shape global_shape, Shape global_offset,
           std::int32_t replica_id = 0);
  /// Adds a whole, unsharded tensor.
  void add_full(std::string name, Tensor tensor, std::int32_t replica_id = 0);

  /// Descriptors of every tensor, in order.
  std::vector<ShardedTensorDesc> descriptors() const;

  /// Checks each descriptor, that names are unique and that data matches its descriptor.
  Status validate() const;
};

}  // namespace stagehand
