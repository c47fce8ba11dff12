#include "stagehand/checkpoint/metadata/metadata_json.hpp"

#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <tuple>
#include <vector>

#include "stagehand/checkpoint/format/json_fields.hpp"
#include "stagehand/checkpoint/metadata/metadata_validation.hpp"
#include "stagehand/core/xxh3.hpp"

namespace stagehand {

using nlohmann::json;

namespace {

std::string quoted_key(const std::string& parent, const std::string& key) {
  return parent + "['" + key + "']";
}

Result<ChunkMeta> chunk_from_json(const JsonFields& f, const json& c, const std::string& field) {
  SH_RETURN_IF_ERROR(f.expect_object(c, field));
  ChunkMeta cm;
  SH_ASSIGN_OR_RETURN(const json* offsets, f.member(c, field, "offsets"));
  SH_ASSIGN_OR_RETURN(cm.offsets, f.as_shape(*offsets, field + ".offsets"));
  SH_ASSIGN_OR_RETURN(const json* shape, f.member(c, field, "shape"));
  SH_ASSIGN_OR_RETURN(cm.shape, f.as_shape(*shape, field + ".shape"));
  SH_ASSIGN_OR_RETURN(const json* file, f.member(c, field, "file"));
  SH_ASSIGN_OR_RETURN(cm.file, f.as_string(*file, field + ".file"));
  SH_ASSIGN_OR_RETURN(const json* byte_range, f.member(c, field, "byte_range"));
  SH_ASSIGN_OR_RETURN(auto range, f.as_range(*byte_range, field + ".byte_range"));
  std::tie(cm.begin, cm.end) = range;
  SH_ASSIGN_OR_RETURN(const json* hash, f.member(c, field, "xxh3"));
  SH_ASSIGN_OR_RETURN(cm.xxh3, f.as_xxh3(*hash, field + ".xxh3"));
  SH_RETURN_IF_ERROR(f.only_members(c, field, {"offsets", "shape", "file", "byte_range", "xxh3"}));
  return cm;
}

Result<FileMeta> file_meta_from_json(const JsonFields& f, const json& value,
                                     const std::string& field) {
  SH_RETURN_IF_ERROR(f.expect_object(value, field));
  FileMeta fm;
  SH_ASSIGN_OR_RETURN(const json* size, f.member(value, field, "size"));
  SH_ASSIGN_OR_RETURN(fm.size, f.as_unsigned(*size, field + ".size"));
  SH_ASSIGN_OR_RETURN(const json* hash, f.member(value, field, "xxh3"));
  SH_ASSIGN_OR_RETURN(fm.xxh3, f.as_xxh3(*hash, field + ".xxh3"));
  SH_RETURN_IF_ERROR(f.only_members(value, field, {"size", "xxh3"}));
  return fm;
}

/// A chunk whose members are all present, of the right types and in range, and no others:
/// what every writer writes. Anything else goes through chunk_from_json, which names the field.
bool fast_chunk(const json& c, ChunkMeta& out) {
  if (!c.is_object() || c.size() != 5) return false;
  auto shape = [](const json* v, Shape& s) {
    if (v == nullptr || !v->is_array() || v->size() > Shape::kMaxRank) return false;
    s = Shape::zeros(v->size());
    for (std::size_t i = 0; i < v->size(); ++i) {
      const json& d = (*v)[i];
      if (!d.is_number_unsigned()) return false;
      const auto value = d.get<std::uint64_t>();
      if (value > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        return false;
      s[i] = static_cast<std::int64_t>(value);
    }
    return true;
  };
  auto find = [&](const char* key) -> const json* {
    auto it = c.find(key);
    return it == c.end() ? nullptr : &*it;
  };
  const json* range = find("byte_range");
  const json* file = find("file");
  const json* hash = find("xxh3");
  if (!shape(find("offsets"), out.offsets) || !shape(find("shape"), out.shape) ||
      range == nullptr || !range->is_array() || range->size() != 2 ||
      !(*range)[0].is_number_unsigned() || !(*range)[1].is_number_unsigned() || file == nullptr ||
      !file->is_string() || hash == nullptr || !hash->is_string()) {
    return false;
  }
  out.begin = (*range)[0].get<std::uint64_t>();
  out.end = (*range)[1].get<std::uint64_t>();
  auto parsed_hash = parse_xxh3_hex(hash->get_ref<const std::string&>());
  if (out.end < out.begin || !parsed_hash) return false;
  out.xxh3 = *parsed_hash;
  out.file = file->get_ref<const std::string&>();
  return true;
}

/// Reads metadata.json as nlohmann::json's SAX events into a CheckpointMetadata, without a tree
/// of the whole file: only one chunk, file entry, object or top-level scalar at a time is held as
/// a JSON value and checked with the same functions (and messages) as before. Which error is
/// reported is also as before, when a file has several: the checks of the top level run at its
/// end in the same order, and of the tensors, objects and files whose values are wrong the one
/// first in key order is named (with a repeated key, its last value counts, as in a tree).
class MetadataReader {
 public:
  using string_t = json::string_t;

  explicit MetadataReader(const std::string& source) : f_(source) {}

  Result<CheckpointMetadata> read(const std::string& text) {
    const bool parsed = json::sax_parse(text, this);
    if (!parsed || where_ != Where::done) return f_.error("", "is not a JSON object");
    SH_ASSIGN_OR_RETURN(const json* format, f_.member(root_, "", "format"));
    if (!format->is_string() || format->get_ref<const std::string&>() != kFormatName) {
      return f_.error("format", "is " + describe(*format) + ", not '" + kFormatName + "'");
    }
    SH_ASSIGN_OR_RETURN(const json* version_json, f_.member(root_, "", "version"));
    SH_ASSIGN_OR_RETURN(std::uint64_t version, f_.as_unsigned(*version_json, "version"));
    if (version != kFormatVersion) {
      return f_.error("version " + std::to_string(version),
                      "is not the supported version " + std::to_string(kFormatVersion));
    }
    SH_ASSIGN_OR_RETURN(const json* step, f_.member(root_, "", "step"));
    SH_ASSIGN_OR_RETURN(m_.step, f_.as_size(*step, "step"));
    for (Section s : {Section::tensors, Section::objects, Section::files}) {
      SH_ASSIGN_OR_RETURN(const json* value, f_.member(root_, "", kSectionNames[s]));
      SH_RETURN_IF_ERROR(f_.expect_object(*value, kSectionNames[s]));
      if (!errors_[s].empty()) return errors_[s].begin()->second;
    }
    // Absent when the save had no trainer state.
    auto trainer_state = root_.find("trainer_state");
    if (trainer_state != root_.end()) {
      SH_ASSIGN_OR_RETURN(m_.trainer_state,
                          file_meta_from_json(f_, *trainer_state, "trainer_state"));
    }
    SH_RETURN_IF_ERROR(f_.only_members(
        root_, "",
        {"checksum", "files", "format", "objects", "step", "tensors", "trainer_state", "version"}));
    return std::move(m_);
  }

  /// The top level's "checksum" field. @pre read() succeeded
  const json& root() const { return root_; }

  // -- nlohmann::json SAX events --

  bool null() { return scalar(json(nullptr)); }
  bool boolean(bool value) { return scalar(json(value)); }
  bool number_integer(json::number_integer_t value) { return scalar(json(value)); }
  bool number_unsigned(json::number_unsigned_t value) { return scalar(json(value)); }
  bool number_float(json::number_float_t value, const string_t&) { return scalar(json(value)); }
  bool string(string_t& value) { return scalar(json(std::move(value))); }
  bool binary(json::binary_t&) { return false; }

  bool start_object(std::size_t) {
    if (!capture_.empty()) return open_in_capture(json::object());
    switch (where_) {
      case Where::start:
        where_ = Where::root;
        return true;
      case Where::root:
        if (auto section = section_of(key_)) {
          begin_section(*section);
          root_[key_] = json::object();
          where_ = kSectionWhere[*section];
          return true;
        }
        break;
      case Where::tensors:
        where_ = Where::tensor;
        tensor_ = json::object();
        tensor_name_ = key_;
        chunks_.clear();
        chunk_error_ = Status::ok();
        return true;
      default:
        break;
    }
    return open_in_capture(json::object());
  }

  bool start_array(std::size_t) {
    if (capture_.empty()) {
      if (where_ == Where::start) return false;
      if (where_ == Where::tensor && key_ == "chunks") {
        tensor_["chunks"] = json::array();
        chunks_.clear();
        chunk_error_ = Status::ok();
        where_ = Where::chunks;
        return true;
      }
    }
    return open_in_capture(json::array());
  }

  bool key(string_t& key) {
    if (!capture_.empty()) {
      slot_ = &(*capture_.back())[key];
      return true;
    }
    key_ = std::move(key);
    return true;
  }

  bool end_object() {
    if (!capture_.empty()) return close_in_capture();
    switch (where_) {
      case Where::root:
        where_ = Where::done;
        return true;
      case Where::tensor:
        finish_tensor();
        where_ = Where::tensors;
        return true;
      default:
        where_ = Where::root;
        return true;
    }
  }

  bool end_array() {
    if (!capture_.empty()) return close_in_capture();
    where_ = Where::tensor;
    return true;
  }

  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) {
    return false;
  }

 private:
  enum class Where { start, root, tensors, tensor, chunks, files, objects, done };
  enum Section { tensors = 0, objects = 1, files = 2 };
  static constexpr const char* kSectionNames[] = {"tensors", "objects", "files"};
  static constexpr Where kSectionWhere[] = {Where::tensors, Where::objects, Where::files};

  static std::optional<Section> section_of(const std::string& key) {
    for (Section s : {Section::tensors, Section::objects, Section::files}) {
      if (key == kSectionNames[s]) return s;
    }
    return std::nullopt;
  }

  /// A repeated section replaces the one before it.
  void begin_section(Section s) {
    errors_[s].clear();
    if (s == Section::tensors) m_.tensors.clear();
    if (s == Section::objects) m_.objects.clear();
    if (s == Section::files) m_.files.clear();
  }

  bool scalar(json value) {
    if (!capture_.empty()) {
      place(std::move(value));
      return true;
    }
    if (where_ == Where::start) return false;
    captured_ = std::move(value);
    return on_captured();
  }

  bool open_in_capture(json value) {
    if (capture_.empty()) {
      if (where_ == Where::start) return false;
      captured_ = std::move(value);
      capture_.push_back(&captured_);
    } else {
      capture_.push_back(place(std::move(value)));
    }
    return true;
  }

  bool close_in_capture() {
    capture_.pop_back();
    return capture_.empty() ? on_captured() : true;
  }

  /// Puts `value` into the captured value being built: at the end of its list, or under the
  /// last key (which a repeated key overwrites, as in a tree).
  json* place(json value) {
    json& parent = *capture_.back();
    if (parent.is_array()) {
      parent.push_back(std::move(value));
      return &parent.back();
    }
    *slot_ = std::move(value);
    return slot_;
  }

  /// A whole value outside the streamed parts is in captured_: take it where it belongs.
  bool on_captured() {
    switch (where_) {
      case Where::root:
        if (auto section = section_of(key_)) begin_section(*section);
        root_[key_] = std::move(captured_);
        return true;
      case Where::tensors: {
        const std::string field = quoted_key("tensors", key_);
        m_.tensors.erase(key_);
        errors_[Section::tensors].insert_or_assign(key_, f_.expect_object(captured_, field));
        return true;
      }
      case Where::tensor:
        tensor_[key_] = std::move(captured_);
        if (key_ == "chunks") {
          chunks_.clear();
          chunk_error_ = Status::ok();
        }
        return true;
      case Where::chunks:
        take_chunk();
        return true;
      case Where::files: {
        auto file = file_meta_from_json(f_, captured_, quoted_key("files", key_));
        record(Section::files, file, m_.files);
        return true;
      }
      case Where::objects: {
        auto object = f_.as_string(captured_, quoted_key("objects", key_));
        record(Section::objects, object, m_.objects);
        return true;
      }
      default:
        return false;
    }
  }

  template <typename T, typename Map>
  void record(Section s, Result<T>& value, Map& into) {
    if (value.is_ok()) {
      errors_[s].erase(key_);
      into.insert_or_assign(key_, std::move(*value));
    } else {
      into.erase(key_);
      errors_[s].insert_or_assign(key_, value.status());
    }
  }

  void take_chunk() {
    const std::size_t index = chunks_.size();
    if (!chunk_error_.is_ok()) return;
    ChunkMeta chunk;
    if (fast_chunk(captured_, chunk)) {
      chunks_.push_back(std::move(chunk));
      return;
    }
    auto slow = chunk_from_json(
        f_, captured_,
        quoted_key("tensors", tensor_name_) + ".chunks[" + std::to_string(index) + "]");
    if (slow.is_ok()) {
      chunks_.push_back(std::move(*slow));
    } else {
      chunk_error_ = slow.status();
    }
  }

  /// The checks of one tensor in the order a tree's reader made them.
  void finish_tensor() {
    const std::string field = quoted_key("tensors", tensor_name_);
    auto tensor = [&]() -> Result<TensorMeta> {
      TensorMeta tm;
      SH_ASSIGN_OR_RETURN(const json* dtype, f_.member(tensor_, field, "dtype"));
      SH_ASSIGN_OR_RETURN(tm.dtype, f_.as_dtype(*dtype, field + ".dtype"));
      SH_ASSIGN_OR_RETURN(const json* shape, f_.member(tensor_, field, "shape"));
      SH_ASSIGN_OR_RETURN(tm.global_shape, f_.as_shape(*shape, field + ".shape"));
      SH_ASSIGN_OR_RETURN(const json* chunks, f_.member(tensor_, field, "chunks"));
      if (!chunks->is_array())
        return f_.error(field + ".chunks", "is " + describe(*chunks) + ", not a list");
      SH_RETURN_IF_ERROR(chunk_error_);
      SH_RETURN_IF_ERROR(f_.only_members(tensor_, field, {"dtype", "shape", "chunks"}));
      tm.chunks = std::move(chunks_);
      return tm;
    }();
    key_ = tensor_name_;
    record(Section::tensors, tensor, m_.tensors);
  }

  JsonFields f_;
  Where where_ = Where::start;
  /// The last key outside a captured value.
  std::string key_;
  /// The top level's members, with an empty object for each streamed section.
  json root_ = json::object();
  CheckpointMetadata m_;
  /// Per section, the error of each entry whose value is wrong, by name.
  std::map<std::string, Status> errors_[3];
  /// The value being captured and the path into it.
  json captured_;
  std::vector<json*> capture_;
  json* slot_ = nullptr;
  /// The tensor being read: its members other than the chunks, its chunks so far and the first
  /// error among them.
  std::string tensor_name_;
  json tensor_ = json::object();
  std::vector<ChunkMeta> chunks_;
  Status chunk_error_ = Status::ok();
};
}  // namespace

Result<CheckpointMetadata> metadata_from_json(const std::string& text, const std::string& source) {
  MetadataReader reader(source);
  SH_ASSIGN_OR_RETURN(CheckpointMetadata m, reader.read(text));
  SH_RETURN_IF_ERROR(validate_metadata(m, source));
  // Last, so that a damaged field is named rather than only the checksum.
  JsonFields f(source);
  SH_ASSIGN_OR_RETURN(const json* checksum, f.member(reader.root(), "", "checksum"));
  SH_ASSIGN_OR_RETURN(std::uint64_t expected, f.as_xxh3(*checksum, "checksum"));
  if (std::uint64_t actual = metadata_text_checksum(text); actual != expected) {
    return f.error("", "was changed after it was written: its content has XXH3 " +
                           xxh3_hex(actual) + ", its field checksum says " + xxh3_hex(expected));
  }
  return m;
}

}  // namespace stagehand
