#include "stagehand/checkpoint/format.hpp"

#include <xxhash.h>

#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "stagehand/storage/local_files.hpp"

namespace stagehand {

using nlohmann::json;

std::uint64_t xxh3(const void* data, std::size_t bytes) { return XXH3_64bits(data, bytes); }

std::string xxh3_hex(std::uint64_t hash) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(hash));
  return buf;
}

std::optional<std::uint64_t> parse_xxh3_hex(const std::string& text) {
  if (text.size() != 16) return std::nullopt;
  std::uint64_t value = 0;
  for (char c : text) {
    int digit = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
    if (digit < 0) return std::nullopt;
    value = value << 4 | static_cast<std::uint64_t>(digit);
  }
  return value;
}

Xxh3Stream::Xxh3Stream() : state_(XXH3_createState()) {
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}

Xxh3Stream::~Xxh3Stream() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void Xxh3Stream::update(const void* data, std::size_t bytes) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, bytes);
}

std::uint64_t Xxh3Stream::digest() const {
  return XXH3_64bits_digest(static_cast<XXH3_state_t*>(state_));
}

std::string CheckpointLayout::step_dir(std::int64_t step) const {
  return root + "/global_step_" + std::to_string(step);
}

std::string CheckpointLayout::tmp_dir(std::int64_t step) const { return step_dir(step) + ".tmp"; }

std::string CheckpointLayout::tracker() const { return root + "/" + kTrackerFile; }

std::string CheckpointLayout::policy_dir(const std::string& checkpoint_dir) {
  return checkpoint_dir + "/" + kPolicyDir;
}

std::string CheckpointLayout::bucket_file_name(int rank, int bucket) {
  return "__" + std::to_string(rank) + "_" + std::to_string(bucket) + ".safetensors";
}

namespace {

json shape_to_json(const Shape& s) {
  json out = json::array();
  for (std::int64_t d : s.dims()) out.push_back(d);
  return out;
}

Result<Shape> shape_from_json(const json& j, const std::string& what) {
  if (!j.is_array() || j.size() > Shape::kMaxRank) {
    return Status{ErrorCode::corruption, what + " is not a list of at most 8 integers"};
  }
  std::vector<std::int64_t> dims;
  for (const auto& d : j) {
    if (!d.is_number_integer() || d.get<std::int64_t>() < 0) {
      return Status{ErrorCode::corruption, what + " holds a value that is not a size"};
    }
    dims.push_back(d.get<std::int64_t>());
  }
  return Shape(std::span<const std::int64_t>(dims));
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
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>(len >> (8 * i) & 0xff);
  return out + text;
}

Result<ParsedSafetensors> parse_safetensors_header(const std::string& path) {
  SH_ASSIGN_OR_RETURN(ReadOnlyFile file, ReadOnlyFile::open(path));
  SH_ASSIGN_OR_RETURN(std::uint64_t size, file_size(path));
  return parse_safetensors_header(
      [&](std::uint64_t offset, void* dst, std::size_t bytes) { return pread_exact(file.fd(), offset, dst, bytes, path); },
      size, path);
}

Result<ParsedSafetensors> parse_safetensors_header(const ByteReader& read, std::uint64_t size, const std::string& path) {
  if (size < 8) return Status{ErrorCode::corruption, "'" + path + "' is too short for safetensors"};
  std::uint8_t len_bytes[8];
  SH_RETURN_IF_ERROR(read(0, len_bytes, 8));
  std::uint64_t len = 0;
  for (int i = 7; i >= 0; --i) len = len << 8 | len_bytes[i];
  if (len > size - 8 || len > (100u << 20)) {
    return Status{ErrorCode::corruption,
                  "'" + path + "' has a header length of " + std::to_string(len) +
                      " bytes, beyond its size of " + std::to_string(size)};
  }
  std::string text(len, '\0');
  SH_RETURN_IF_ERROR(read(8, text.data(), len));
  json header = json::parse(text, nullptr, false);
  if (header.is_discarded() || !header.is_object()) {
    return Status{ErrorCode::corruption, "'" + path + "' has a header that is not a JSON object"};
  }
  ParsedSafetensors out;
  out.data_start = 8 + len;
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") continue;
    std::string what = "'" + path + "' entry '" + key + "'";
    if (!value.is_object() || !value.contains("dtype") || !value.contains("data_offsets") ||
        !value["dtype"].is_string() || !value["data_offsets"].is_array() ||
        value["data_offsets"].size() != 2) {
      return Status{ErrorCode::corruption, what + " is malformed"};
    }
    auto dtype = dtype_from_name(value["dtype"].get<std::string>());
    if (!dtype) return Status{ErrorCode::corruption, what + " has an unknown dtype"};
    SH_ASSIGN_OR_RETURN(Shape shape, shape_from_json(value["shape"], what + " shape"));
    out.entries.push_back({key, *dtype, shape, value["data_offsets"][0].get<std::uint64_t>(),
                           value["data_offsets"][1].get<std::uint64_t>()});
  }
  return out;
}

std::string metadata_to_json(const CheckpointMetadata& m) {
  json tensors = json::object();
  for (const auto& [name, t] : m.tensors) {
    json chunks = json::array();
    for (const auto& c : t.chunks) {
      chunks.push_back({{"offsets", shape_to_json(c.offsets)},
                        {"shape", shape_to_json(c.shape)},
                        {"file", c.file},
                        {"byte_range", {c.begin, c.end}},
                        {"xxh3", xxh3_hex(c.xxh3)}});
    }
    tensors[name] = {{"dtype", std::string(dtype_name(t.dtype))},
                     {"shape", shape_to_json(t.global_shape)},
                     {"chunks", chunks}};
  }
  json files = json::object();
  for (const auto& [name, f] : m.files) files[name] = {{"size", f.size}, {"xxh3", xxh3_hex(f.xxh3)}};
  json root = {{"format", kFormatName}, {"version", kFormatVersion}, {"step", m.step},
               {"tensors", tensors},    {"objects", m.objects},      {"files", files}};
  return root.dump(1) + "\n";
}

Result<CheckpointMetadata> metadata_from_json(const std::string& text, const std::string& source) {
  json root = json::parse(text, nullptr, false);
  auto bad = [&](const std::string& why) {
    return Status{ErrorCode::corruption, "'" + source + "': " + why};
  };
  if (root.is_discarded() || !root.is_object()) return bad("not a JSON object");
  if (root.value("format", "") != kFormatName) {
    return bad("format is not '" + std::string(kFormatName) + "'");
  }
  if (!root["version"].is_number_integer() || root["version"].get<int>() != kFormatVersion) {
    return bad("version " + root["version"].dump() + " is not the supported version " +
               std::to_string(kFormatVersion));
  }
  try {
    CheckpointMetadata m;
    m.step = root.at("step").get<std::int64_t>();
    for (const auto& [name, t] : root.at("tensors").items()) {
      TensorMeta tm;
      auto dtype = dtype_from_name(t.at("dtype").get<std::string>());
      if (!dtype) return bad("tensor '" + name + "' has an unknown dtype");
      tm.dtype = *dtype;
      SH_ASSIGN_OR_RETURN(tm.global_shape, shape_from_json(t.at("shape"), "tensor '" + name + "' shape"));
      for (const auto& c : t.at("chunks")) {
        ChunkMeta cm;
        SH_ASSIGN_OR_RETURN(cm.offsets, shape_from_json(c.at("offsets"), "chunk offsets of '" + name + "'"));
        SH_ASSIGN_OR_RETURN(cm.shape, shape_from_json(c.at("shape"), "chunk shape of '" + name + "'"));
        cm.file = c.at("file").get<std::string>();
        cm.begin = c.at("byte_range").at(0).get<std::uint64_t>();
        cm.end = c.at("byte_range").at(1).get<std::uint64_t>();
        auto hash = parse_xxh3_hex(c.at("xxh3").get<std::string>());
        if (!hash) return bad("chunk of '" + name + "' has a malformed xxh3");
        cm.xxh3 = *hash;
        if (cm.end < cm.begin ||
            cm.end - cm.begin != static_cast<std::uint64_t>(cm.shape.numel()) * dtype_size(tm.dtype)) {
          return bad("chunk of '" + name + "' has a byte range that does not match its shape");
        }
        tm.chunks.push_back(std::move(cm));
      }
      m.tensors.emplace(name, std::move(tm));
    }
    m.objects = root.at("objects").get<std::map<std::string, std::string>>();
    for (const auto& [name, f] : root.at("files").items()) {
      auto hash = parse_xxh3_hex(f.at("xxh3").get<std::string>());
      if (!hash) return bad("file '" + name + "' has a malformed xxh3");
      m.files[name] = {f.at("size").get<std::uint64_t>(), *hash};
    }
    return m;
  } catch (const json::exception& e) {
    return bad(std::string("malformed metadata: ") + e.what());
  }
}

}  // namespace stagehand
