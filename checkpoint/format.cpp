#include "stagehand/checkpoint/format.hpp"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <nlohmann/json.hpp>
#include <string_view>
#include <tuple>

#include "stagehand/core/sharded_tensor.hpp"
#include "stagehand/storage/local_files.hpp"

namespace stagehand {

using nlohmann::json;

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

/// The largest header parse_safetensors_header reads (safetensors' own reader has the same limit).
constexpr std::uint64_t kMaxHeaderBytes = 100u << 20;

json shape_to_json(const Shape& s) {
  json out = json::array();
  for (std::int64_t d : s.dims()) out.push_back(d);
  return out;
}

/// Bytes of a block of `shape` and elements of `elem_size` bytes; nullopt when they exceed
/// INT64_MAX, so that every count, offset and stride derived from a valid shape fits an int64.
std::optional<std::uint64_t> checked_nbytes(const Shape& shape, std::size_t elem_size) {
  for (std::int64_t d : shape.dims()) {
    if (d == 0) return 0;
  }
  std::uint64_t n = elem_size;
  constexpr auto kMax = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  for (std::int64_t d : shape.dims()) {
    if (d < 0 || n > kMax / static_cast<std::uint64_t>(d)) return std::nullopt;
    n *= static_cast<std::uint64_t>(d);
  }
  return n;
}

/// Elements of a shape whose byte size checked_nbytes accepted (unlike Shape::numel, no
/// intermediate product can overflow when a later dimension is 0).
std::uint64_t elements(const Shape& shape) {
  return *checked_nbytes(shape, 1);
}

std::string range_string(std::uint64_t begin, std::uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + ")";
}

/// Names a JSON value in a message without printing the whole of it (it may be huge).
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

/// Reads typed values out of parsed JSON without exceptions. Every error is corruption naming
/// the file and the path of the field ("tensors['w'].chunks[1].shape[0]").
class JsonFields {
 public:
  explicit JsonFields(std::string file) : file_(std::move(file)) {}

  Status error(const std::string& field, const std::string& why) const {
    return {ErrorCode::corruption, "'" + file_ + "': " + (field.empty() ? "" : field + " ") + why};
  }

  Status expect_object(const json& v, const std::string& field) const {
    if (v.is_object()) return Status::ok();
    return error(field, "is " + describe(v) + ", not an object");
  }

  /// An error naming the first member of `object` that is none of `known`; ok when there is
  /// none. The checksum covers only the format's fields, so any other is refused.
  /// @pre object.is_object()
  Status only_members(const json& object, const std::string& field,
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

  /// `object[key]`. @pre object.is_object()
  Result<const json*> member(const json& object, const std::string& field, const char* key) const {
    auto it = object.find(key);
    std::string path = field.empty() ? key : field + "." + key;
    if (it == object.end()) return error(path, "is missing");
    return &*it;
  }

  Result<std::uint64_t> as_unsigned(const json& v, const std::string& field) const {
    // Floats are refused, not truncated, and never converted when out of range.
    if (v.is_number_unsigned()) return v.get<std::uint64_t>();
    if (v.is_number_integer() && v.get<std::int64_t>() >= 0)
      return static_cast<std::uint64_t>(v.get<std::int64_t>());
    return error(field, "is " + describe(v) + ", not an unsigned integer");
  }

  /// A dimension, offset or step: an unsigned integer that fits an int64.
  Result<std::int64_t> as_size(const json& v, const std::string& field) const {
    SH_ASSIGN_OR_RETURN(std::uint64_t value, as_unsigned(v, field));
    if (value > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      return error(field, "is " + describe(v) + ", beyond the largest size " +
                              std::to_string(std::numeric_limits<std::int64_t>::max()));
    }
    return static_cast<std::int64_t>(value);
  }

  Result<std::string> as_string(const json& v, const std::string& field) const {
    if (!v.is_string()) return error(field, "is " + describe(v) + ", not a string");
    return v.get<std::string>();
  }

  Result<DType> as_dtype(const json& v, const std::string& field) const {
    SH_ASSIGN_OR_RETURN(std::string name, as_string(v, field));
    auto dtype = dtype_from_name(name);
    if (!dtype) return error(field, "is " + describe(v) + ", not a known dtype");
    return *dtype;
  }

  Result<std::uint64_t> as_xxh3(const json& v, const std::string& field) const {
    SH_ASSIGN_OR_RETURN(std::string text, as_string(v, field));
    auto hash = parse_xxh3_hex(text);
    if (!hash) return error(field, "is " + describe(v) + ", not 16 lowercase hex digits");
    return *hash;
  }

  Result<Shape> as_shape(const json& v, const std::string& field) const {
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

  /// A [begin, end] pair of unsigned integers with begin <= end.
  Result<std::pair<std::uint64_t, std::uint64_t>> as_range(const json& v,
                                                           const std::string& field) const {
    if (!v.is_array() || v.size() != 2)
      return error(field, "is " + describe(v) + ", not a list of two offsets");
    SH_ASSIGN_OR_RETURN(std::uint64_t begin, as_unsigned(v[0], field + "[0]"));
    SH_ASSIGN_OR_RETURN(std::uint64_t end, as_unsigned(v[1], field + "[1]"));
    if (end < begin) return error(field, range_string(begin, end) + " ends before it begins");
    return std::pair{begin, end};
  }

 private:
  std::string file_;
};

std::string quoted_key(const std::string& parent, const std::string& key) {
  return parent + "['" + key + "']";
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

Result<FileMeta> file_meta_from_json(const JsonFields& f, const json& value, const std::string& field) {
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
      if (value > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return false;
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
  if (!shape(find("offsets"), out.offsets) || !shape(find("shape"), out.shape) || range == nullptr ||
      !range->is_array() || range->size() != 2 || !(*range)[0].is_number_unsigned() ||
      !(*range)[1].is_number_unsigned() || file == nullptr || !file->is_string() || hash == nullptr ||
      !hash->is_string()) {
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
      SH_ASSIGN_OR_RETURN(m_.trainer_state, file_meta_from_json(f_, *trainer_state, "trainer_state"));
    }
    SH_RETURN_IF_ERROR(f_.only_members(root_, "", {"checksum", "files", "format", "objects", "step", "tensors",
                                                   "trainer_state", "version"}));
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

  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) { return false; }

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
    auto slow = chunk_from_json(f_, captured_,
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
      if (!chunks->is_array()) return f_.error(field + ".chunks", "is " + describe(*chunks) + ", not a list");
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

/// Writes metadata.json's JSON text straight from a CheckpointMetadata (no JSON tree: at
/// thousands of ranks the tree costs seconds and gigabytes). Members come in key order and
/// strings are escaped as nlohmann::json's dump() does, so the compact text is the pretty text
/// minus its whitespace outside strings, and what the "checksum" member holds is the hash that
/// metadata_text_checksum takes of the file as read.
///
/// One pass makes both: the compact text without the "checksum" member is hashed as it is made
/// (never held whole), and the pretty text is written beside it with the checksum's 16 digits
/// filled in at the end. Pretty text puts each member of the top level, each file, object and
/// tensor, and each chunk on a line of its own, and writes the rest compactly.
class MetadataWriter {
 public:
  /// @param out where the pretty text goes.
  explicit MetadataWriter(std::string* out) : out_(out) {}
  /// Appends the pretty text to `file` a piece at a time, starting the write-back of each, and
  /// writes the checksum into its place last.
  explicit MetadataWriter(WritableFile* file) : out_(&piece_), file_(file) {}

  /// The pretty text of `m`, with the XXH3 of its compact text without a "checksum" member as
  /// its first member, into *out or the file.
  template <typename Metadata>
  void write(const Metadata& m) {
    if (file_ != nullptr) {
      out_->reserve(kPieceBytes + 64 * 1024);
    } else {
      out_->clear();
      out_->reserve(estimated_size(m));
    }
    hash_.reset();
    put('{');
    // Pretty only: the hashed text has no checksum member, and its first member no comma.
    pretty_only("\n \"checksum\": \"");
    const std::size_t checksum_digits = written_ + out_->size();
    pretty_only("0000000000000000\"");
    member("files", true);
    map(m.files, [&](const FileMeta& f) { file_meta(f); });
    member("format");
    string(kFormatName);
    member("objects");
    map(m.objects, [&](const std::string& value) { string(value); });
    member("step");
    number(m.step);
    member("tensors");
    tensors(m.tensors);
    if (m.trainer_state) {
      member("trainer_state");
      file_meta(*m.trainer_state);
    }
    member("version");
    number(kFormatVersion);
    pretty_only("\n");
    put('}');
    pretty_only("\n");
    char digits[16];
    hex16(hash_.digest(), digits);
    if (file_ != nullptr) {
      flush_piece(0);
      if (status_.is_ok()) status_ = file_->write_at(checksum_digits, digits, sizeof(digits));
    } else {
      out_->replace(checksum_digits, sizeof(digits), digits, sizeof(digits));
    }
  }

  /// The first error of a write to the file.
  const Status& status() const { return status_; }

 private:
  /// Enough for the usual names and numbers, so that the text is not copied as it grows.
  template <typename Metadata>
  static std::size_t estimated_size(const Metadata& m) {
    std::size_t chunks = 0;
    for (const auto& entry : m.tensors) chunks += tensor_of(entry).chunks.size();
    return 256 + 64 * m.files.size() + 64 * m.objects.size() + 96 * m.tensors.size() + 160 * chunks;
  }

  static void hex16(std::uint64_t value, char* digits) {
    constexpr char kHex[] = "0123456789abcdef";
    for (int i = 15; i >= 0; --i) {
      digits[i] = kHex[value & 0xf];
      value >>= 4;
    }
  }

  /// Text of both the pretty and the hashed compact form.
  void put(std::string_view text) {
    out_->append(text);
    hash_.update(text.data(), text.size());
  }

  void put(char c) {
    out_->push_back(c);
    hash_.update(c);
  }

  /// Whitespace and the checksum member: the pretty text only.
  void pretty_only(std::string_view text) { out_->append(text); }

  /// Hands the text so far to the file once it holds at least `at_least` bytes.
  void flush_piece(std::size_t at_least) {
    if (piece_.size() < at_least || piece_.empty()) return;
    if (status_.is_ok()) status_ = file_->append(piece_.data(), piece_.size());
    if (status_.is_ok()) status_ = file_->start_writeback(written_, piece_.size());
    written_ += piece_.size();
    piece_.clear();
  }

  /// Every entry starts on a line of its own: a place to hand a piece to the file.
  void line(int depth) {
    if (file_ != nullptr) flush_piece(kPieceBytes);
    out_->push_back('\n');
    out_->append(static_cast<std::size_t>(depth), ' ');
  }

  /// A member of the top level; `first` in the hashed text (the pretty one starts with the
  /// checksum).
  void member(const char* key, bool first = false) {
    if (first) {
      pretty_only(",");
    } else {
      put(',');
    }
    line(1);
    key_(key);
  }

  void key_(std::string_view key) {
    string(key);
    put(':');
    pretty_only(" ");
  }

  template <typename T>
  void number(T value) {
    char buf[24];
    auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), value);
    put(std::string_view(buf, static_cast<std::size_t>(end - buf)));
  }

  /// As nlohmann::json's dump(): the two-character escapes, \u00xx for other control
  /// characters, everything else (UTF-8 included) as it is.
  void string(std::string_view text) {
    put('"');
    std::size_t plain = 0;
    for (std::size_t i = 0; i < text.size(); ++i) {
      const auto c = static_cast<unsigned char>(text[i]);
      if (c >= 0x20 && c != '"' && c != '\\') continue;
      put(text.substr(plain, i - plain));
      plain = i + 1;
      switch (c) {
        case '"': put("\\\""); break;
        case '\\': put("\\\\"); break;
        case '\b': put("\\b"); break;
        case '\f': put("\\f"); break;
        case '\n': put("\\n"); break;
        case '\r': put("\\r"); break;
        case '\t': put("\\t"); break;
        default: {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
          put(buf);
        }
      }
    }
    put(text.substr(plain));
    put('"');
  }

  void hash_string(std::uint64_t hash) {
    char buf[18];
    buf[0] = '"';
    hex16(hash, buf + 1);
    buf[17] = '"';
    put(std::string_view(buf, sizeof(buf)));
  }

  void shape(const Shape& s) {
    put('[');
    for (std::size_t i = 0; i < s.rank(); ++i) {
      if (i > 0) put(',');
      number(s[i]);
    }
    put(']');
  }

  /// A map of the top level's members: one entry a line.
  template <typename Map, typename WriteValue>
  void map(const Map& entries, WriteValue write_value) {
    put('{');
    bool first = true;
    for (const auto& [name, value] : entries) {
      if (!first) put(',');
      first = false;
      line(2);
      key_(name);
      write_value(value);
    }
    if (!entries.empty()) line(1);
    put('}');
  }

  void file_meta(const FileMeta& f) {
    put("{\"size\":");
    pretty_only(" ");
    number(f.size);
    put(",\"xxh3\":");
    pretty_only(" ");
    hash_string(f.xxh3);
    put('}');
  }

  static const TensorMeta& tensor_of(const std::pair<const std::string, TensorMeta>& entry) { return entry.second; }
  static const GatheredTensor& tensor_of(const GatheredTensor& t) { return t; }

  /// The fields of a chunk that metadata.json lists, wherever it is held.
  struct ChunkFields {
    const Shape& offsets;
    const Shape& shape;
    const std::string& file;
    std::uint64_t begin;
    std::uint64_t end;
    std::uint64_t xxh3;
  };
  static ChunkFields fields(const ChunkMeta& c) { return {c.offsets, c.shape, c.file, c.begin, c.end, c.xxh3}; }
  static ChunkFields fields(const GatheredChunk& c) {
    const ChunkRecord& r = *c.record;
    return {r.desc.global_offset, r.desc.local_shape, *c.file, r.begin, r.end, r.xxh3};
  }

  /// Chunks read ahead of the one being written: the chunks of a tensor lie in as many reports
  /// as it has chunks, and the wait for memory is most of what writing one costs.
  static constexpr std::size_t kPrefetchAhead = 8;
  static void prefetch(const ChunkMeta&) {}
  static void prefetch(const GatheredChunk& c) {
    __builtin_prefetch(&c.record->desc.global_offset);
    __builtin_prefetch(&c.record->desc.local_shape);
    __builtin_prefetch(&c.record->begin);
  }

  void tensors(const std::map<std::string, TensorMeta>& entries) {
    map(entries, [&](const TensorMeta& t) { tensor(t); });
  }

  /// As map() does for the copy's map.
  void tensors(const std::vector<GatheredTensor>& entries) {
    put('{');
    for (std::size_t i = 0; i < entries.size(); ++i) {
      if (i > 0) put(',');
      line(2);
      key_(entries[i].name);
      tensor(entries[i]);
    }
    if (!entries.empty()) line(1);
    put('}');
  }

  template <typename Tensor>
  void tensor(const Tensor& t) {
    put("{\"chunks\":");
    pretty_only(" ");
    put('[');
    for (std::size_t i = 0; i < t.chunks.size(); ++i) {
      if (i + kPrefetchAhead < t.chunks.size()) prefetch(t.chunks[i + kPrefetchAhead]);
      const ChunkFields c = fields(t.chunks[i]);
      if (i > 0) put(',');
      line(3);
      put("{\"byte_range\":");
      pretty_only(" ");
      put('[');
      number(c.begin);
      put(',');
      number(c.end);
      put("],\"file\":");
      pretty_only(" ");
      string(c.file);
      put(",\"offsets\":");
      pretty_only(" ");
      shape(c.offsets);
      put(",\"shape\":");
      pretty_only(" ");
      shape(c.shape);
      put(",\"xxh3\":");
      pretty_only(" ");
      hash_string(c.xxh3);
      put('}');
    }
    if (!t.chunks.empty()) line(2);
    put("],\"dtype\":");
    pretty_only(" ");
    string(dtype_name(t.dtype));
    put(",\"shape\":");
    pretty_only(" ");
    shape(t.global_shape);
    put('}');
  }

  /// Text handed to the file at a time: its write-back runs while the next is formed.
  static constexpr std::size_t kPieceBytes = 4 << 20;

  /// The pretty text: the caller's string, or piece_.
  std::string* out_;
  WritableFile* file_ = nullptr;
  /// The text not yet handed to file_.
  std::string piece_;
  /// Bytes handed to file_ so far.
  std::uint64_t written_ = 0;
  Status status_;
  /// Of the compact text without the checksum member.
  BufferedXxh3Stream hash_;
};

// -- metadata.json's checksum, over the text as read --

// JSON's whitespace is space, tab, line feed and carriage return; no other byte below 0x21 may
// stand outside a string (nor, unescaped, inside one), so in JSON text "a byte up to 0x20
// outside a string" is exactly its whitespace.
bool is_space_byte(char c) {
  return static_cast<unsigned char>(c) <= 0x20;
}

/// One past the quote that closes the string whose opening quote is at `open`; text.size()
/// when none does.
std::size_t string_end(std::string_view text, std::size_t open) {
  for (std::size_t i = open + 1; i < text.size(); ++i) {
    if (text[i] == '\\') {
      ++i;
    } else if (text[i] == '"') {
      return i + 1;
    }
  }
  return text.size();
}

/// Hashes the compact text of `text` up to the end of its first top-level "checksum" member,
/// leaving out that member and the comma that separates it from a neighbour. Returns where it
/// stopped, outside any string: after the member's comma, at the brace that closes the top
/// level when the member is last, or text.size() when there is no such member.
std::size_t hash_up_to_checksum_end(std::string_view text, BufferedXxh3Stream& hash) {
  const char* const p = text.data();
  // [run, i) is text neither hashed nor dropped yet: hashed when whitespace or the checksum
  // member follows it, dropped when it is part of that member.
  std::size_t run = 0;
  int depth = 0;
  bool root_is_object = false;
  bool in_checksum = false;
  // In the top-level object: the next string is a member's key.
  bool key_next = false;
  // A comma between top-level members, hashed only once the member after it turns out not to be
  // the checksum.
  bool comma_held = false;
  std::size_t i = 0;
  while (i < text.size()) {
    if (is_space_byte(p[i])) {
      if (!in_checksum) hash.update(p + run, i - run);
      do {
        ++i;
      } while (i < text.size() && is_space_byte(p[i]));
      run = i;
      continue;
    }
    switch (p[i]) {
      case '"': {
        const std::size_t end = string_end(text, i);
        if (key_next && depth == 1) {
          key_next = false;
          if (text.substr(i, end - i) == "\"checksum\"") {
            hash.update(p + run, i - run);
            run = i;
            in_checksum = true;
          } else if (comma_held) {
            hash.update(',');
            comma_held = false;
          }
        }
        i = end;
        continue;
      }
      case ',':
        if (depth == 1 && root_is_object) {
          if (in_checksum) {
            // The comma after the member goes with it; the one before it, if any, stays.
            if (comma_held) hash.update(',');
            return i + 1;
          }
          hash.update(p + run, i - run);
          comma_held = true;
          key_next = true;
          run = ++i;
          continue;
        }
        break;
      case '{':
      case '[':
        if (depth++ == 0) key_next = root_is_object = p[i] == '{';
        break;
      case '}':
      case ']':
        // A checksum member that comes last takes the comma before it along.
        if (depth-- == 1 && in_checksum) return i;
        break;
      default:
        break;
    }
    ++i;
  }
  if (!in_checksum) hash.update(p + run, text.size() - run);
  return text.size();
}

// -- whitespace outside strings, eight bytes at a time --

constexpr std::uint64_t kEachByte = 0x0101010101010101;
constexpr std::uint64_t kHighBits = 0x8080808080808080;

/// The high bit of each byte of `word` that equals `c`.
std::uint64_t bytes_equal(std::uint64_t word, char c) {
  const std::uint64_t x = word ^ (kEachByte * static_cast<unsigned char>(c));
  return ~(((x & ~kHighBits) + ~kHighBits) | x) & kHighBits;
}

/// The high bit of each byte of `word` up to 0x20.
std::uint64_t space_bytes(std::uint64_t word) {
  return ~(((word & ~kHighBits) + kEachByte * (0x80 - 0x21)) | word) & kHighBits;
}

/// The eight bytes at `p` with the first in the lowest byte, whatever the machine's order.
std::uint64_t load_word(const char* p) {
  std::uint64_t word;
  std::memcpy(&word, p, sizeof(word));
  if constexpr (std::endian::native == std::endian::big) word = __builtin_bswap64(word);
  return word;
}

/// Copies `text` into `out` less its whitespace outside strings, one byte at a time, carrying
/// whether a string and an escape in it are open; returns the bytes written.
std::size_t compact_bytes(std::string_view text, char* out, bool& in_string, bool& escaped) {
  std::size_t k = 0;
  for (char c : text) {
    out[k] = c;
    if (escaped) {
      escaped = false;
      ++k;
    } else if (in_string) {
      escaped = c == '\\';
      in_string = c != '"';
      ++k;
    } else {
      in_string = c == '"';
      k += !is_space_byte(c);
    }
  }
  return k;
}

/// Hashes `text` less its whitespace outside strings. @pre text starts outside a string
void hash_without_spaces(std::string_view text, BufferedXxh3Stream& hash) {
  constexpr std::size_t kBlock = 4096;
  char out[kBlock];
  bool in_string = false;
  bool escaped = false;
  for (std::size_t block = 0; block < text.size(); block += kBlock) {
    const std::string_view in = text.substr(block, kBlock);
    std::size_t k = 0;
    std::size_t i = 0;
    for (; i + 8 <= in.size(); i += 8) {
      const std::uint64_t word = load_word(in.data() + i);
      if (escaped || bytes_equal(word, '\\') != 0) {
        // Rare: an escape changes which quotes open and close strings.
        k += compact_bytes(in.substr(i, 8), out + k, in_string, escaped);
        continue;
      }
      // A byte is inside a string (or opens one) when an odd number of quotes opened or closed
      // strings up to it.
      std::uint64_t quotes = bytes_equal(word, '"');
      quotes ^= quotes << 8;
      quotes ^= quotes << 16;
      quotes ^= quotes << 32;
      const std::uint64_t inside = quotes ^ (kHighBits * in_string);
      const std::uint64_t dropped = space_bytes(word) & ~inside;
      in_string = inside >> 63;
      if (dropped == 0) {
        std::memcpy(out + k, in.data() + i, 8);
        k += 8;
        continue;
      }
      for (std::size_t j = 0; j < 8; ++j) {
        out[k] = in[i + j];
        k += ((dropped >> (8 * j + 7)) & 1) ^ 1;
      }
    }
    k += compact_bytes(in.substr(i), out + k, in_string, escaped);
    hash.update(out, k);
  }
}

/// Whether two blocks share an element (a block with an empty dimension shares none).
/// @pre both have the same rank
bool blocks_overlap(const ChunkMeta& a, const ChunkMeta& b) {
  for (std::size_t i = 0; i < a.shape.rank(); ++i) {
    if (std::max(a.offsets[i], b.offsets[i]) >=
        std::min(a.offsets[i] + a.shape[i], b.offsets[i] + b.shape[i])) {
      return false;
    }
  }
  return true;
}

/// Proves that the chunks of `t` tile its global shape.
/// @pre every chunk has the global rank and lies inside the global shape, whose byte size fits
///      an int64 (so do the element counts of it and of every chunk).
/// @return the first reason they do not; nullopt when they do.
std::optional<std::string> tiling_error(const TensorMeta& t) {
  std::vector<const ChunkMeta*> chunks;
  for (const auto& c : t.chunks)
    chunks.push_back(&c);
  std::sort(chunks.begin(), chunks.end(),
            [](const ChunkMeta* a, const ChunkMeta* b) { return a->offsets < b->offsets; });
  for (std::size_t i = 1; i < chunks.size(); ++i) {
    // Equal offsets mean equal chunk keys, even for chunks that hold no element.
    if (chunks[i]->offsets == chunks[i - 1]->offsets)
      return "two chunks at " + chunks[i]->offsets.to_string();
  }
  std::erase_if(chunks, [](const ChunkMeta* c) { return elements(c->shape) == 0; });
  const std::size_t rank = t.global_shape.rank();
  if (rank > 0 && chunks.size() > 1) {
    // Sweep along the dimension with the most distinct offsets, comparing only chunks whose
    // ranges along it meet: in a grid of chunks, each meets only its own slab.
    std::size_t sweep = 0;
    std::size_t most = 0;
    for (std::size_t d = 0; d < rank; ++d) {
      std::vector<std::int64_t> starts;
      for (const auto* c : chunks)
        starts.push_back(c->offsets[d]);
      std::sort(starts.begin(), starts.end());
      auto distinct =
          static_cast<std::size_t>(std::unique(starts.begin(), starts.end()) - starts.begin());
      if (distinct > most) {
        most = distinct;
        sweep = d;
      }
    }
    std::sort(chunks.begin(), chunks.end(), [sweep](const ChunkMeta* a, const ChunkMeta* b) {
      return a->offsets[sweep] < b->offsets[sweep];
    });
    for (std::size_t i = 0; i < chunks.size(); ++i) {
      const std::int64_t end = chunks[i]->offsets[sweep] + chunks[i]->shape[sweep];
      for (std::size_t j = i + 1; j < chunks.size() && chunks[j]->offsets[sweep] < end; ++j) {
        if (blocks_overlap(*chunks[i], *chunks[j])) {
          return "chunks at " + chunks[i]->offsets.to_string() + " and " +
                 chunks[j]->offsets.to_string() + " overlap";
        }
      }
    }
  }
  // Disjoint blocks inside the global shape cover all of it exactly when their sizes add up.
  std::uint64_t covered = 0;
  for (const auto* c : chunks)
    covered += elements(c->shape);
  if (covered != elements(t.global_shape)) {
    return "its chunks hold " + std::to_string(covered) + " of its " +
           std::to_string(elements(t.global_shape)) + " elements";
  }
  return std::nullopt;
}

}  // namespace

bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

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

const SafetensorsEntry* ParsedSafetensors::find(const std::string& key) const {
  auto it =
      std::lower_bound(entries.begin(), entries.end(), key,
                       [](const SafetensorsEntry& e, const std::string& k) { return e.key < k; });
  return it != entries.end() && it->key == key ? &*it : nullptr;
}

Result<ParsedSafetensors> parse_safetensors_header(const ByteReader& read, std::uint64_t size, const std::string& path) {
  if (size < 8) return Status{ErrorCode::corruption, "'" + path + "' is too short for safetensors"};
  std::uint8_t len_bytes[8];
  SH_RETURN_IF_ERROR(read(0, len_bytes, 8));
  std::uint64_t len = 0;
  for (int i = 7; i >= 0; --i) len = len << 8 | len_bytes[i];
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

std::string metadata_to_json(const CheckpointMetadata& m) {
  std::string text;
  MetadataWriter(&text).write(m);
  return text;
}

std::string metadata_to_json(const GatheredMetadata& m) {
  std::string text;
  MetadataWriter(&text).write(m);
  return text;
}

Status write_metadata_json(const GatheredMetadata& m, WritableFile& file) {
  MetadataWriter writer(&file);
  writer.write(m);
  return writer.status();
}

std::uint64_t metadata_text_checksum(std::string_view text) {
  BufferedXxh3Stream hash;
  // The writer puts the checksum first, so the rest, all of it hashed, goes the fast way.
  const std::size_t rest = hash_up_to_checksum_end(text, hash);
  hash_without_spaces(text.substr(rest), hash);
  return hash.digest();
}

Result<CheckpointMetadata> metadata_from_json(const std::string& text, const std::string& source) {
  MetadataReader reader(source);
  SH_ASSIGN_OR_RETURN(CheckpointMetadata m, reader.read(text));
  SH_RETURN_IF_ERROR(validate_metadata(m, source));
  // Last, so that a damaged field is named rather than only the checksum.
  JsonFields f(source);
  SH_ASSIGN_OR_RETURN(const json* checksum, f.member(reader.root(), "", "checksum"));
  SH_ASSIGN_OR_RETURN(std::uint64_t expected, f.as_xxh3(*checksum, "checksum"));
  if (std::uint64_t actual = metadata_text_checksum(text); actual != expected) {
    return f.error("", "was changed after it was written: its content has XXH3 " + xxh3_hex(actual) +
                           ", its field checksum says " + xxh3_hex(expected));
  }
  return m;
}

Status validate_metadata(const CheckpointMetadata& m, const std::string& source) {
  auto bad = [&](const std::string& why) {
    return Status{ErrorCode::corruption, "'" + source + "': " + why};
  };
  if (m.step < 0) return bad("step " + std::to_string(m.step) + " is negative");
  for (const auto& [name, f] : m.files) {
    // Files are opened as policy/<name>: a path would reach outside the checkpoint.
    if (!is_plain_file_name(name)) return bad("file '" + name + "' is not a plain file name");
  }
  for (const auto& [name, t] : m.tensors) {
    const std::string tensor = "tensor '" + name + "'";
    if (name.empty() || name.find('@') != std::string::npos) {
      return bad(tensor +
                 ": a tensor name must be non-empty and free of '@' (it starts every chunk key)");
    }
    if (!checked_nbytes(t.global_shape, dtype_size(t.dtype))) {
      return bad(tensor + ": global shape " + t.global_shape.to_string() + " of " +
                 std::string(dtype_name(t.dtype)) + " holds more bytes than an int64 counts");
    }
    const std::size_t rank = t.global_shape.rank();
    for (const auto& c : t.chunks) {
      // Named only in an error: a checkpoint of many ranks has hundreds of thousands of chunks.
      auto chunk_name = [&] { return tensor + " chunk " + c.offsets.to_string(); };
      if (c.offsets.rank() != rank || c.shape.rank() != rank) {
        return bad(chunk_name() + ": offsets " + c.offsets.to_string() + " and shape " +
                   c.shape.to_string() + " do not both have the rank of the global shape " +
                   t.global_shape.to_string());
      }
      for (std::size_t i = 0; i < rank; ++i) {
        if (c.offsets[i] > t.global_shape[i] || c.shape[i] > t.global_shape[i] - c.offsets[i]) {
          return bad(chunk_name() + " of shape " + c.shape.to_string() +
                     " lies outside the global shape " + t.global_shape.to_string());
        }
      }
      // Inside the global shape, so its size fits too.
      const std::uint64_t nbytes = *checked_nbytes(c.shape, dtype_size(t.dtype));
      if (c.end < c.begin || c.end - c.begin != nbytes) {
        return bad(chunk_name() + ": byte_range " + range_string(c.begin, c.end) + " does not hold the " +
                   std::to_string(nbytes) + " bytes of " + std::string(dtype_name(t.dtype)) + " " +
                   c.shape.to_string());
      }
      auto file = m.files.find(c.file);
      if (file == m.files.end())
        return bad(chunk_name() + ": its file '" + c.file + "' is not listed in files");
      if (c.end > file->second.size) {
        return bad(chunk_name() + ": byte_range " + range_string(c.begin, c.end) + " runs past the " +
                   std::to_string(file->second.size) + " bytes of '" + c.file + "'");
      }
    }
    if (auto why = tiling_error(t)) return bad(tensor + ": " + *why);
  }
  return Status::ok();
}

Status check_chunk_in_header(const ParsedSafetensors& header, const std::string& path,
                             const std::string& tensor, DType dtype, const ChunkMeta& chunk) {
  const std::string key = chunk_key(tensor, chunk.offsets);
  auto bad = [&](const std::string& why) {
    return Status{ErrorCode::corruption, "'" + path + "': tensor '" + tensor + "' chunk " +
                                             chunk.offsets.to_string() + ": " + why};
  };
  const SafetensorsEntry* e = header.find(key);
  if (e == nullptr) return bad("the header has no entry '" + key + "'");
  if (e->dtype != dtype) {
    return bad("header entry '" + key + "' has dtype " + std::string(dtype_name(e->dtype)) +
               ", the metadata says " + std::string(dtype_name(dtype)));
  }
  if (!(e->shape == chunk.shape)) {
    return bad("header entry '" + key + "' has shape " + e->shape.to_string() +
               ", the metadata says " + chunk.shape.to_string());
  }
  if (e->begin + header.data_start != chunk.begin || e->end + header.data_start != chunk.end) {
    return bad("header entry '" + key + "' has bytes " +
               range_string(e->begin + header.data_start, e->end + header.data_start) +
               " of the file, the metadata's byte_range is " +
               range_string(chunk.begin, chunk.end));
  }
  return Status::ok();
}

}  // namespace stagehand
