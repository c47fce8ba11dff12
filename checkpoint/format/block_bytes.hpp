#pragma once

// Internal to the checkpoint layer: the byte counts and ranges that safetensors headers and
// metadata.json claim, computed without overflow and named in errors the same way.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "stagehand/core/shape.hpp"

namespace stagehand {

/// Bytes of a block of `shape` and elements of `elem_size` bytes; nullopt when they exceed
/// INT64_MAX, so that every count, offset and stride derived from a valid shape fits an int64.
inline std::optional<std::uint64_t> checked_nbytes(const Shape& shape, std::size_t elem_size) {
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

/// "[begin, end)", as errors name a byte range.
inline std::string range_string(std::uint64_t begin, std::uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + ")";
}

}  // namespace stagehand
