#include "stagehand/checkpoint/format/json_fields.hpp"

#include <algorithm>
#include <limits>

#include "stagehand/checkpoint/format/block_bytes.hpp"
#include "stagehand/core/xxh3.hpp"

namespace stagehand {

using nlohmann::json;

std::string describe(const json& v) {
  switch (v.type()) {
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float:
      return v.dump();
    case json::value_t::string: {
      const auto& text = v.get_ref<const std::string&>();
      return text.size() <= 64 ? "'" + text + "'"
                               : "a string of " + std::to_string(text.size()) + " characters";
    }
    case json::value_t::object:
      return "an object";
    case json::value_t::array:
      return "a list";
    case json::value_t::boolean:
      return v.get<bool>() ? "true" : "false";
    default:
      return "null";
  }
}

Status JsonFields::error(const std::string& field, const std::string& why) const {
  return {ErrorCode::corruption, "'" + file_ + "': " + (field.empty() ? "" : field + " ") + why};
}

Status JsonFields::expect_object(const json& v, const std::string& field) const {
  if (v.is_object()) return Status::ok();
  return error(field, "is " + describe(v) + ", not an object");
}

Status JsonFields::only_members(const json& object, const std::string& field,
                                std::initializer_list<std::string_view> known) const {
  if (object.size() <= known.size()) {
    // Every known member is required, except those the caller checked the absence of.
    bool all_known = true;
    for (const auto& [key, value] : object.items()) {
      all_known &= std::find(known.begin(), known.end(), key) != known.end();
    }
    if (all_known) return Status::ok();
  }
  for (const auto& [key, value] : object.items()) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      return error(field.empty() ? key : field + "." + key, "is not a field of the format");
    }
  }
  return Status::ok();
}

Result<const json*> JsonFields::member(const json& object, const std::string& field,
                                       const char* key) const {
  auto it = object.find(key);
  std::string path = field.empty() ? key : field + "." + key;
  if (it == object.end()) return error(path, "is missing");
  return &*it;
}

Result<std::uint64_t> JsonFields::as_unsigned(const json& v, const std::string& field) const {
  // Never converted when out of range.
  if (v.is_number_unsigned()) return v.get<std::uint64_t>();
  if (v.is_number_integer() && v.get<std::int64_t>() >= 0)
    return static_cast<std::uint64_t>(v.get<std::int64_t>());
  return error(field, "is " + describe(v) + ", not an unsigned integer");
}

Result<std::int64_t> JsonFields::as_size(const json& v, const std::string& field) const {
  SH_ASSIGN_OR_RETURN(std::uint64_t value, as_unsigned(v, field));
  if (value > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    return error(field, "is " + describe(v) + ", beyond the largest size " +
                            std::to_string(std::numeric_limits<std::int64_t>::max()));
  }
  return static_cast<std::int64_t>(value);
}

Result<std::string> JsonFields::as_string(const json& v, const std::string& field) const {
  if (!v.is_string()) return error(field, "is " + describe(v) + ", not a string");
  return v.get<std::string>();
}

Result<DType> JsonFields::as_dtype(const json& v, const std::string& field) const {
  SH_ASSIGN_OR_RETURN(std::string name, as_string(v, field));
  auto dtype = dtype_from_name(name);
  if (!dtype) return error(field, "is " + describe(v) + ", not a known dtype");
  return *dtype;
}

Result<std::uint64_t> JsonFields::as_xxh3(const json& v, const std::string& field) const {
  SH_ASSIGN_OR_RETURN(std::string text, as_string(v, field));
  auto hash = parse_xxh3_hex(text);
  if (!hash) return error(field, "is " + describe(v) + ", not 16 lowercase hex digits");
  return *hash;
}

Result<Shape> JsonFields::as_shape(const json& v, const std::string& field) const {
  if (!v.is_array() || v.size() > Shape::kMaxRank) {
    return error(field, "is " + describe(v) + ", not a list of at most " +
                            std::to_string(Shape::kMaxRank) + " sizes");
  }
  Shape shape = Shape::zeros(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    SH_ASSIGN_OR_RETURN(shape[i], as_size(v[i], field + "[" + std::to_string(i) + "]"));
  }
  return shape;
}

Result<std::pair<std::uint64_t, std::uint64_t>> JsonFields::as_range(
    const json& v, const std::string& field) const {
  if (!v.is_array() || v.size() != 2)
    return error(field, "is " + describe(v) + ", not a list of two offsets");
  SH_ASSIGN_OR_RETURN(std::uint64_t begin, as_unsigned(v[0], field + "[0]"));
  SH_ASSIGN_OR_RETURN(std::uint64_t end, as_unsigned(v[1], field + "[1]"));
  if (end < begin) return error(field, range_string(begin, end) + " ends before it begins");
  return std::pair{begin, end};
}

}  // namespace stagehand
