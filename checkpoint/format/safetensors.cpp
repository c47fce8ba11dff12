#include "stagehand/checkpoint/format/safetensors.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <tuple>

#include "stagehand/checkpoint/format/block_bytes.hpp"
#include "stagehand/checkpoint/format/json_fields.hpp"
#include "stagehand/storage/file_system.hpp"

namespace stagehand {

using nlohmann::json;

namespace {

/// The largest header parse_safetensors_header reads (safetensors' own reader has the same limit).
constexpr std::uint64_t kMaxHeaderBytes = 100u << 20;

json shape_to_json(const Shape& s) {
  json out = json::array();
  for (std::int64_t d : s.dims())
    out.push_back(d);
  return out;
}

Result<SafetensorsEntry> entry_from_json(const JsonFields& f, const std::string& key,
                                         const json& value, std::uint64_t data_size) {
  const std::string entry = "header entry '" + key + "'";
  SH_RETURN_IF_ERROR(f.expect_object(value, entry));
  SafetensorsEntry e;
  e.key = key;
  SH_ASSIGN_OR_RETURN(const json* dtype, f.member(value, entry, "dtype"));
  SH_ASSIGN_OR_RETURN(e.dtype, f.as_dtype(*dtype, entry + ".dtype"));
  SH_ASSIGN_OR_RETURN(const json* shape, f.member(value, entry, "shape"));
  SH_ASSIGN_OR_RETURN(e.shape, f.as_shape(*shape, entry + ".shape"));
  SH_ASSIGN_OR_RETURN(const json* offsets, f.member(value, entry, "data_offsets"));
  SH_ASSIGN_OR_RETURN(auto range, f.as_range(*offsets, entry + ".data_offsets"));
  std::tie(e.begin, e.end) = range;
  if (e.end > data_size) {
    return f.error(entry + ".data_offsets", range_string(e.begin, e.end) +
                                                " run past the data section of " +
                                                std::to_string(data_size) + " bytes");
  }
  auto nbytes = checked_nbytes(e.shape, dtype_size(e.dtype));
  if (!nbytes) {
    return f.error(entry + ".shape", e.shape.to_string() + " of " +
                                         std::string(dtype_name(e.dtype)) +
                                         " holds more bytes than an int64 counts");
  }
  if (e.end - e.begin != *nbytes) {
    return f.error(entry + ".data_offsets",
                   range_string(e.begin, e.end) + " do not hold the bytes of " +
                       std::string(dtype_name(e.dtype)) + " " + e.shape.to_string());
  }
  return e;
}

}  // namespace

std::string make_safetensors_header(const std::vector<SafetensorsEntry>& entries) {
  json header = json::object();
  header["__metadata__"] = {{"format", "pt"}};
  for (const auto& e : entries) {
    header[e.key] = {{"dtype", std::string(dtype_name(e.dtype))},
                     {"shape", shape_to_json(e.shape)},
                     {"data_offsets", {e.begin, e.end}}};
  }
  std::string text = header.dump();
  std::size_t total = 8 + text.size();
  std::size_t padded = (total + kDataAlignment - 1) / kDataAlignment * kDataAlignment;
  text.append(padded - total, ' ');
  std::uint64_t len = text.size();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i)
    out[static_cast<std::size_t>(i)] = static_cast<char>(len >> (8 * i) & 0xff);
  return out + text;
}

Result<ParsedSafetensors> parse_safetensors_header(const std::string& path) {
  SH_ASSIGN_OR_RETURN(auto file, local_file_system()->open_file(path));
  return parse_safetensors_header(
      [&file](std::uint64_t offset, void* dst, std::size_t bytes) { return file->read(offset, dst, bytes); },
      file->size(), path);
}

const SafetensorsEntry* ParsedSafetensors::find(const std::string& key) const {
  auto it =
      std::lower_bound(entries.begin(), entries.end(), key,
                       [](const SafetensorsEntry& e, const std::string& k) { return e.key < k; });
  return it != entries.end() && it->key == key ? &*it : nullptr;
}

Result<ParsedSafetensors> parse_safetensors_header(const ByteReader& read, std::uint64_t size,
                                                   const std::string& path) {
  if (size < 8) return Status{ErrorCode::corruption, "'" + path + "' is too short for safetensors"};
  std::uint8_t len_bytes[8];
  SH_RETURN_IF_ERROR(read(0, len_bytes, 8));
  std::uint64_t len = 0;
  for (int i = 7; i >= 0; --i)
    len = len << 8 | len_bytes[i];
  if (len > size - 8 || len > kMaxHeaderBytes) {
    return Status{ErrorCode::corruption, "'" + path + "' has a header length of " +
                                             std::to_string(len) + " bytes, beyond its size of " +
                                             std::to_string(size) + " or the limit of " +
                                             std::to_string(kMaxHeaderBytes)};
  }
  std::string text(len, '\0');
  SH_RETURN_IF_ERROR(read(8, text.data(), len));
  const json header = json::parse(text, nullptr, false);
  if (header.is_discarded() || !header.is_object()) {
    return Status{ErrorCode::corruption, "'" + path + "' has a header that is not a JSON object"};
  }
  JsonFields f(path);
  ParsedSafetensors out;
  out.data_start = 8 + len;
  // A JSON object iterates in key order, so the entries come out sorted for find().
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") continue;
    SH_ASSIGN_OR_RETURN(SafetensorsEntry e, entry_from_json(f, key, value, size - out.data_start));
    out.entries.push_back(std::move(e));
  }
  std::vector<const SafetensorsEntry*> by_offset;
  for (const auto& e : out.entries) {
    if (e.end > e.begin) by_offset.push_back(&e);
  }
  std::sort(
      by_offset.begin(), by_offset.end(),
      [](const SafetensorsEntry* a, const SafetensorsEntry* b) { return a->begin < b->begin; });
  for (std::size_t i = 1; i < by_offset.size(); ++i) {
    if (by_offset[i]->begin < by_offset[i - 1]->end) {
      return f.error(
          "header entries '" + by_offset[i - 1]->key + "' and '" + by_offset[i]->key + "'",
          "share bytes");
    }
  }
  return out;
}

}  // namespace stagehand
