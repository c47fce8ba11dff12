#include "stagehand/checkpoint/metadata/metadata_json.hpp"

#include <charconv>
#include <cstdio>

#include "stagehand/core/xxh3.hpp"
#include "stagehand/storage/file_system.hpp"

namespace stagehand {

namespace {

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
    for (const auto& entry : m.tensors)
      chunks += tensor_of(entry).chunks.size();
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
        case '"':
          put("\\\"");
          break;
        case '\\':
          put("\\\\");
          break;
        case '\b':
          put("\\b");
          break;
        case '\f':
          put("\\f");
          break;
        case '\n':
          put("\\n");
          break;
        case '\r':
          put("\\r");
          break;
        case '\t':
          put("\\t");
          break;
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

  static const TensorMeta& tensor_of(const std::pair<const std::string, TensorMeta>& entry) {
    return entry.second;
  }
  static const GatheredTensor& tensor_of(const GatheredTensor& t) { return t; }
  static DType dtype_of(const TensorMeta& t) { return t.dtype; }
  static DType dtype_of(const GatheredTensor& t) { return t.dtype(); }
  static const Shape& global_shape_of(const TensorMeta& t) { return t.global_shape; }
  static const Shape& global_shape_of(const GatheredTensor& t) { return t.global_shape(); }

  /// The fields of a chunk that metadata.json lists, wherever it is held.
  struct ChunkFields {
    const Shape& offsets;
    const Shape& shape;
    const std::string& file;
    std::uint64_t begin;
    std::uint64_t end;
    std::uint64_t xxh3;
  };
  static ChunkFields fields(const ChunkMeta& c) {
    return {c.offsets, c.shape, c.file, c.begin, c.end, c.xxh3};
  }
  static ChunkFields fields(const GatheredChunk& c) {
    const ChunkRecord& r = *c.record;
    return {c.desc->global_offset, c.desc->local_shape, *c.file, r.begin, r.end, r.xxh3};
  }

  /// Chunks read ahead of the one being written: the chunks of a tensor lie in as many reports
  /// as it has chunks, and the wait for memory is most of what writing one costs.
  static constexpr std::size_t kPrefetchAhead = 8;
  static void prefetch(const ChunkMeta&) {}
  static void prefetch(const GatheredChunk& c) {
    __builtin_prefetch(&c.desc->global_offset);
    __builtin_prefetch(&c.desc->local_shape);
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
      key_(entries[i].name());
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
    string(dtype_name(dtype_of(t)));
    put(",\"shape\":");
    pretty_only(" ");
    shape(global_shape_of(t));
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

}  // namespace

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

}  // namespace stagehand
