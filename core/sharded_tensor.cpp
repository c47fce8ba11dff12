#include "stagehand/core/sharded_tensor.hpp"

#include <set>

namespace stagehand {

std::string chunk_key(const std::string& name, const Shape& offsets) {
  std::string key = name + "@";
  for (std::size_t i = 0; i < offsets.rank(); ++i) {
    if (i > 0) key += ",";
    key += std::to_string(offsets[i]);
  }
  return key;
}

Status ShardedTensorDesc::validate() const {
  auto fail = [&](const std::string& why) {
    return Status{ErrorCode::invalid_argument, "tensor '" + name + "': " + why};
  };
  if (name.empty()) return fail("empty name");
  if (name.find('@') != std::string::npos) return fail("name must not contain '@'");
  if (global_shape.rank() != local_shape.rank() || global_offset.rank() != local_shape.rank()) {
    return fail("global shape " + global_shape.to_string() + ", offset " +
                global_offset.to_string() + " and local shape " + local_shape.to_string() +
                " differ in rank");
  }
  for (std::size_t i = 0; i < local_shape.rank(); ++i) {
    if (local_shape[i] < 0 || global_offset[i] < 0 ||
        global_offset[i] + local_shape[i] > global_shape[i]) {
      return fail("block at " + global_offset.to_string() + " of shape " +
                  local_shape.to_string() + " lies outside " + global_shape.to_string());
    }
  }
  if (replica_id < 0) return fail("negative replica id");
  return Status::ok();
}

void StateDict::add(std::string name, Tensor tensor, Shape global_shape, Shape global_offset,
                    std::int32_t replica_id) {
  ShardedTensorDesc desc{std::move(name), tensor.dtype(), global_shape, global_offset,
                         tensor.shape(),  replica_id};
  tensors.push_back({std::move(desc), std::move(tensor)});
}

void StateDict::add_full(std::string name, Tensor tensor, std::int32_t replica_id) {
  Shape shape = tensor.shape();
  add(std::move(name), std::move(tensor), shape, Shape::zeros(shape.rank()), replica_id);
}

std::vector<ShardedTensorDesc> StateDict::descriptors() const {
  std::vector<ShardedTensorDesc> out;
  out.reserve(tensors.size());
  for (const auto& t : tensors) out.push_back(t.desc);
  return out;
}

Status StateDict::validate() const {
  std::set<std::string> names;
  for (const auto& t : tensors) {
    SH_RETURN_IF_ERROR(t.desc.validate());
    if (!names.insert(t.desc.name).second) {
      return {ErrorCode::invalid_argument, "tensor '" + t.desc.name + "' appears twice"};
    }
    if (!t.tensor.defined() || t.tensor.dtype() != t.desc.dtype ||
        !(t.tensor.shape() == t.desc.local_shape)) {
      return {ErrorCode::invalid_argument,
              "tensor '" + t.desc.name + "': data does not match its descriptor"};
    }
  }
  return Status::ok();
}

}  // namespace stagehand
