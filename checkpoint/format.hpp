#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "stagehand/core/dtype.hpp"
#include "stagehand/core/shape.hpp"
#include "stagehand/core/status.hpp"

namespace stagehand {

inline constexpr const char* kFormatName = "stagehand-dist-ckpt";
inline constexpr int kFormatVersion = 1;
/// Data in every bucket file starts at a multiple of this.
inline constexpr std::size_t kDataAlignment = 4096;
inline constexpr const char* kTrackerFile = "latest_ckpt_global_step.txt";
inline constexpr const char* kPolicyDir = "policy";
inline constexpr const char* kMetadataFile = "metadata.json";
inline constexpr const char* kTrainerStateFile = "trainer_state.json";

// -- checksums --

std::uint64_t xxh3(const void* data, std::size_t bytes);
/// 16 lowercase hex digits.
std::string xxh3_hex(std::uint64_t hash);
std::optional<std::uint64_t> parse_xxh3_hex(const std::string& text);

/// Streaming XXH3 over a sequence of byte ranges.
class Xxh3Stream {
 public:
  Xxh3Stream();
  ~Xxh3Stream();
  Xxh3Stream(const Xxh3Stream&) = delete;
  Xxh3Stream& operator=(const Xxh3Stream&) = delete;
  void update(const void* data, std::size_t bytes);
  std::uint64_t digest() const;

 private:
  void* state_;
};

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

/// Parses the header of a safetensors file whose first bytes are `prefix` (at least the header).
/// @return the entries (data-relative ranges) and the data section's start offset.
struct ParsedSafetensors {
  std::vector<SafetensorsEntry> entries;
  std::uint64_t data_start = 0;
};
Result<ParsedSafetensors> parse_safetensors_header(const std::string& path);

/// Reads exactly `bytes` at `offset` into `dst`.
using ByteReader = std::function<Status(std::uint64_t offset, void* dst, std::size_t bytes)>;

/// The same for a file of `size` bytes read through `read` (a local file or an object);
/// `path` names it in errors.
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
  std::map<std::string, FileMeta> files;
};

std::string metadata_to_json(const CheckpointMetadata& metadata);
/// Parses and checks the format name and version; errors name `source`.
Result<CheckpointMetadata> metadata_from_json(const std::string& text, const std::string& source);

}  // namespace stagehand
