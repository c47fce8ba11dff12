#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "stagehand/checkpoint/report.hpp"
#include "stagehand/core/dtype.hpp"
#include "stagehand/core/shape.hpp"
#include "stagehand/core/status.hpp"
#include "stagehand/core/utf8.hpp"
#include "stagehand/core/xxh3.hpp"

namespace stagehand {

class WritableFile;

inline constexpr const char* kFormatName = "stagehand-dist-ckpt";
inline constexpr int kFormatVersion = 1;
/// Data in every bucket file starts at a multiple of this.
inline constexpr std::size_t kDataAlignment = 4096;
inline constexpr const char* kTrackerFile = "latest_ckpt_global_step.txt";
inline constexpr const char* kPolicyDir = "policy";
inline constexpr const char* kMetadataFile = "metadata.json";
inline constexpr const char* kTrainerStateFile = "trainer_state.json";
/// A Hugging Face safetensors folder's one file, when everything fits in one.
inline constexpr const char* kHfSingleFile = "model.safetensors";
/// The index of a Hugging Face folder sharded into several files.
inline constexpr const char* kHfIndexFile = "model.safetensors.index.json";

// -- folders --

/// Paths of one checkpoint root (`ckpt_path`).
struct CheckpointLayout {
  std::string root;

  std::string step_dir(std::int64_t step) const;
  std::string tmp_dir(std::int64_t step) const;
  std::string tracker() const;
  static std::string policy_dir(const std::string& checkpoint_dir);
  /// "__<rank>_<bucket>.safetensors".
  static std::string bucket_file_name(int rank, int bucket);
};

/// Whether `name` names a file inside a folder: not empty, ".", "..", and free of '/' and NUL.
bool is_plain_file_name(const std::string& name);

// -- safetensors --

/// One entry of a safetensors header: a chunk and its byte range in the data section.
struct SafetensorsEntry {
  std::string key;
  DType dtype = DType::f32;
  Shape shape;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
};

/// Serializes the 8-byte length and the JSON header, padded with spaces so that the data section
/// starts at a multiple of kDataAlignment.
std::string make_safetensors_header(const std::vector<SafetensorsEntry>& entries);

/// The header of a safetensors file.
struct ParsedSafetensors {
  /// Sorted by key; each range is relative to the data section, lies inside it, holds exactly
  /// its dtype x shape bytes and shares no byte with another entry.
  std::vector<SafetensorsEntry> entries;
  std::uint64_t data_start = 0;

  /// The entry named `key`; nullptr when there is none.
  const SafetensorsEntry* find(const std::string& key) const;
};

/// Parses and checks the header of the safetensors file at `path`.
Result<ParsedSafetensors> parse_safetensors_header(const std::string& path);

/// Reads exactly `bytes` at `offset` into `dst`.
using ByteReader = std::function<Status(std::uint64_t offset, void* dst, std::size_t bytes)>;

/// The same for a file of `size` bytes read through `read` (a local file or an object); `path`
/// names it in errors. Never throws: a malformed header is a corruption Status naming the file,
/// the entry and the field.
Result<ParsedSafetensors> parse_safetensors_header(const ByteReader& read, std::uint64_t size, const std::string& path);

// -- metadata.json --

struct ChunkMeta {
  Shape offsets;
  Shape shape;
  std::string file;
  /// Absolute byte range in `file`.
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  std::uint64_t xxh3 = 0;
};

struct TensorMeta {
  DType dtype = DType::f32;
  Shape global_shape;
  std::vector<ChunkMeta> chunks;
};

struct FileMeta {
  std::uint64_t size = 0;
  std::uint64_t xxh3 = 0;
};

/// The contents of `policy/metadata.json`: deterministic, no timestamps or host names.
struct CheckpointMetadata {
  std::int64_t step = 0;
  std::map<std::string, TensorMeta> tensors;
  std::map<std::string, std::string> objects;
  /// Data files in policy/, by name.
  std::map<std::string, FileMeta> files;
  /// trainer_state.json beside policy/; none when the save had no trainer state.
  std::optional<FileMeta> trainer_state;
};

/// A checkpoint's metadata as the commit gathers it from the ranks' reports: what metadata.json
/// lists, pointing into the reports instead of copying them (at 1,024 ranks of 500 tensors they
/// hold half a million chunks, and a copy of each cost more than writing it out).
struct GatheredChunk {
  const ChunkRecord* record = nullptr;
  /// The name of the file the chunk is in (its bucket's).
  const std::string* file = nullptr;
};

struct GatheredTensor {
  /// Points into a report, as the chunks do.
  std::string_view name;
  DType dtype = DType::f32;
  Shape global_shape;
  /// By offsets.
  std::vector<GatheredChunk> chunks;
};

struct GatheredMetadata {
  std::int64_t step = 0;
  /// By name.
  std::vector<GatheredTensor> tensors;
  std::map<std::string, std::string> objects;
  std::map<std::string, FileMeta> files;
  std::optional<FileMeta> trainer_state;
};

/// metadata.json's text: deterministic (members in key order, strings escaped as
/// nlohmann::json's dump() escapes them), one line for each file, object, tensor and chunk, and
/// a "checksum" member first (metadata_text_checksum of the text).
/// @pre every name and object is valid UTF-8 (is_valid_utf8).
std::string metadata_to_json(const CheckpointMetadata& metadata);
/// The same text for the metadata the reports hold (what metadata_to_json of the copy holds).
std::string metadata_to_json(const GatheredMetadata& metadata);
/// Appends that text to `file` a few MiB at a time as it is formed, starting each piece's
/// write-back at once, and writes the checksum into its place last; the caller syncs the file.
Status write_metadata_json(const GatheredMetadata& metadata, WritableFile& file);

/// Parses metadata.json, checks the format name and version and every field's type and range,
/// then applies validate_metadata, then checks the file's "checksum" against
/// metadata_text_checksum of `text`, so that a hand edit of any field is found (also one that
/// reorders members or escapes a string otherwise; only whitespace outside strings may change).
/// Never throws: errors are corruption naming `source` and the field (for instance
/// "tensors['w'].chunks[1].byte_range[0]"), or saying that the file "was changed after it was
/// written" with both digests.
Result<CheckpointMetadata> metadata_from_json(const std::string& text, const std::string& source);

/// What metadata.json's "checksum" holds: the XXH3 of the file's compact text without that
/// member, taken in one pass over the bytes of `text` as they are. Hashed is everything except
/// whitespace outside strings (space, tab, line feed, carriage return) and the top-level
/// "checksum" member: its key, colon, value and the comma that separates it from a neighbour,
/// wherever in the top level it stands. Only the first top-level member whose key is written
/// "checksum" is left out; a "checksum" key inside a value, a second top-level one, or one
/// spelled with an escape is hashed like any other text (so a file with two never verifies).
///
/// For every text metadata_to_json writes, indented any way, this is the digest its checksum
/// holds: its compact text is that text minus whitespace, with members already in key order and
/// strings escaped as nlohmann::json's dump() escapes them. Every other change alters the digest:
/// a value, the order of members, the escaping of a string.
/// Defined for any text (on text that is not JSON the digest means nothing); never reads past
/// `text`.
std::uint64_t metadata_text_checksum(std::string_view text);

/// The one check of a checkpoint's structure that load and verify share, so that a checkpoint
/// that verifies loads. Proves for every tensor that its global shape's byte size fits in an
/// int64, that each chunk has the global shape's rank, lies inside it and names a listed file
/// (a plain name) with a byte range that lies inside that file's size and holds exactly
/// dtype x shape bytes, and that the chunks tile the global shape: no element in two chunks,
/// none in no chunk. Errors are corruption naming `source`, the tensor and the chunk.
Status validate_metadata(const CheckpointMetadata& metadata, const std::string& source);

/// Checks that the header of the data file at `path` holds `chunk` of `tensor` (a `dtype`
/// tensor) as metadata.json records it: an entry under its chunk key with the same dtype, shape
/// and absolute byte range.
Status check_chunk_in_header(const ParsedSafetensors& header, const std::string& path,
                             const std::string& tensor, DType dtype, const ChunkMeta& chunk);

}  // namespace stagehand
