#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "stagehand/core/dtype.hpp"
#include "stagehand/core/shape.hpp"
#include "stagehand/core/status.hpp"

namespace stagehand {

/// Data in every bucket file starts at a multiple of this.
inline constexpr std::size_t kDataAlignment = 4096;

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
Result<ParsedSafetensors> parse_safetensors_header(const ByteReader& read, std::uint64_t size,
                                                   const std::string& path);

}  // namespace stagehand
