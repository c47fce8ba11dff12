#pragma once

#include <optional>
#include <string>

#include "stagehand/checkpoint/metadata/metadata.hpp"
#include "stagehand/checkpoint/format/safetensors.hpp"
#include "stagehand/core/dtype.hpp"
#include "stagehand/core/status.hpp"

namespace stagehand {

/// The one check of a checkpoint's structure that load and verify share, so that a checkpoint
/// that verifies loads. Proves for every tensor that its global shape's byte size fits in an
/// int64, that each chunk has the global shape's rank, lies inside it and names a listed file
/// (a plain name) with a byte range that lies inside that file's size and holds exactly
/// dtype x shape bytes, and that the chunks tile the global shape: no element in two chunks,
/// none in no chunk. Errors are corruption naming `source`, the tensor and the chunk.
Status validate_metadata(const CheckpointMetadata& metadata, const std::string& source);

/// Whether the chunks of `t` tile its global shape: no two share an element (nor an offset) and
/// together they hold every element. The reason they do not, naming the chunks; nullopt when
/// they do.
/// @pre every chunk has the global rank and lies inside the global shape, whose byte size fits
///      an int64 (so do the element counts of it and of every chunk).
std::optional<std::string> tiling_error(const TensorMeta& t);

/// Checks that the header of the data file at `path` holds `chunk` of `tensor` (a `dtype`
/// tensor) as metadata.json records it: an entry under its chunk key with the same dtype, shape
/// and absolute byte range.
Status check_chunk_in_header(const ParsedSafetensors& header, const std::string& path,
                             const std::string& tensor, DType dtype, const ChunkMeta& chunk);

}  // namespace stagehand
