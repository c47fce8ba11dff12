#pragma once

// The geometry of loading into another layout than the one saved: where a saved chunk and a
// live block overlap, and how the overlap's elements move between their row-major layouts.

#include <cstddef>
#include <cstdint>
#include <optional>

#include "stagehand/checkpoint/format/format.hpp"
#include "stagehand/core/copy_engine.hpp"
#include "stagehand/core/device.hpp"
#include "stagehand/core/sharded_tensor.hpp"

namespace stagehand {

/// The row-major strides, in elements, of `shape`.
Shape row_major_strides(const Shape& shape);

/// Elements of `block` that `chunk` holds; 0 when they do not overlap.
std::int64_t overlap_numel(const ChunkMeta& chunk, const ShardedTensorDesc& block);

/// A live block seen as a chunk of the geometry above (its offsets and shape; no file): what a
/// weight sync cuts receiver blocks by.
ChunkMeta chunk_of(const ShardedTensorDesc& block);

/// Where `chunk` lands in `block`'s memory, in elements, when all of it fills one contiguous
/// run there: it lies inside the block, and before the last dimension in which it is narrower
/// than the block it is one element wide (the same shape, or a run of whole rows).
std::optional<std::int64_t> contiguous_offset(const ChunkMeta& chunk,
                                              const ShardedTensorDesc& block);

/// Copies the elements of the overlap of a saved chunk and a live block (both row-major) whose
/// index in the chunk lies in [first, last): `src` holds the chunk's elements from `first` on,
/// `dst` is the block's memory on `device`; `elem` is the live element size. With `stream`, the
/// copies into device memory are enqueued on it (`src` must then stay as it is until an event
/// recorded after them completes); without, each is a blocking copy. With `cold`, the block is
/// not read again soon (another rank's copy of a chunk one rank read): copies into host memory
/// bypass the caches (stream_copy from kColdCopyMinBytes on).
/// @return false when a copy to the device failed.
bool copy_overlap_part(const ChunkMeta& chunk, const ShardedTensorDesc& block, std::size_t elem,
                       std::int64_t first, std::int64_t last, const std::uint8_t* src,
                       std::uint8_t* dst, Device device, const CopyStream* stream = nullptr,
                       bool cold = false);

}  // namespace stagehand
