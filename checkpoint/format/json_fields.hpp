#pragma once

// Internal to the checkpoint layer: the typed reads that the safetensors header and
// metadata.json readers share.

#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>

#include "stagehand/core/dtype.hpp"
#include "stagehand/core/shape.hpp"
#include "stagehand/core/status.hpp"

namespace stagehand {

/// Names a JSON value in a message without printing the whole of it (it may be huge): a number
/// as written, a short string quoted, anything else by its kind ("an object", "a list").
std::string describe(const nlohmann::json& v);

/// Reads typed values out of parsed JSON without exceptions. Every error is corruption naming
/// the file and the path of the field ("tensors['w'].chunks[1].shape[0]"); `field` is that path,
/// empty for the top level.
class JsonFields {
 public:
  explicit JsonFields(std::string file) : file_(std::move(file)) {}

  /// A corruption error: "'<file>': <field> <why>".
  Status error(const std::string& field, const std::string& why) const;

  /// Ok when `v` is an object.
  Status expect_object(const nlohmann::json& v, const std::string& field) const;

  /// An error naming the first member of `object` that is none of `known`; ok when there is
  /// none. The checksum covers only the format's fields, so any other is refused.
  /// @pre object.is_object()
  Status only_members(const nlohmann::json& object, const std::string& field,
                      std::initializer_list<std::string_view> known) const;

  /// `object[key]`; an error naming "<field>.<key>" when it is missing.
  /// @pre object.is_object()
  Result<const nlohmann::json*> member(const nlohmann::json& object, const std::string& field,
                                       const char* key) const;

  /// A non-negative integer; floats are refused, not truncated.
  Result<std::uint64_t> as_unsigned(const nlohmann::json& v, const std::string& field) const;

  /// A dimension, offset or step: an unsigned integer that fits an int64.
  Result<std::int64_t> as_size(const nlohmann::json& v, const std::string& field) const;

  Result<std::string> as_string(const nlohmann::json& v, const std::string& field) const;

  /// A string that dtype_from_name knows.
  Result<DType> as_dtype(const nlohmann::json& v, const std::string& field) const;

  /// A string of 16 lowercase hex digits (parse_xxh3_hex).
  Result<std::uint64_t> as_xxh3(const nlohmann::json& v, const std::string& field) const;

  /// A list of at most Shape::kMaxRank sizes (as_size).
  Result<Shape> as_shape(const nlohmann::json& v, const std::string& field) const;

  /// A [begin, end] pair of unsigned integers with begin <= end.
  Result<std::pair<std::uint64_t, std::uint64_t>> as_range(const nlohmann::json& v,
                                                           const std::string& field) const;

 private:
  std::string file_;
};

}  // namespace stagehand
