#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "stagehand/checkpoint/save/report.hpp"
#include "stagehand/core/dtype.hpp"
#include "stagehand/core/shape.hpp"

namespace stagehand {

/// metadata.json's "format": what a reader refuses a file without.
inline constexpr const char* kFormatName = "stagehand-dist-ckpt";
/// metadata.json's "version": the one this build reads and writes.
inline constexpr int kFormatVersion = 1;

/// One chunk of a saved tensor: the block it holds and where its bytes are.
struct ChunkMeta {
  Shape offsets;
  Shape shape;
  std::string file;
  /// Absolute byte range in `file`.
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  std::uint64_t xxh3 = 0;
};

/// A saved tensor: its dtype, its global shape and the chunks that tile it.
struct TensorMeta {
  DType dtype = DType::f32;
  Shape global_shape;
  std::vector<ChunkMeta> chunks;
};

/// A file of the checkpoint: its size and the XXH3 of all its bytes.
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
  /// The chunk's block: the descriptor its rank planned (DescriptorOf).
  const ShardedTensorDesc* desc = nullptr;
  /// The name of the file the chunk is in (its bucket's).
  const std::string* file = nullptr;
};

struct GatheredTensor {
  /// Its first chunk's descriptor: the tensor's name, dtype and global shape (every chunk's).
  const ShardedTensorDesc* desc = nullptr;
  /// By offsets: a run of GatheredMetadata::chunks (one vector for every tensor's, not one
  /// vector each).
  std::span<const GatheredChunk> chunks;

  std::string_view name() const { return desc->name; }
  DType dtype() const { return desc->dtype; }
  const Shape& global_shape() const { return desc->global_shape; }
};

/// Moves, never copies: its tensors point into its own chunks.
struct GatheredMetadata {
  GatheredMetadata() = default;
  GatheredMetadata(GatheredMetadata&&) = default;
  GatheredMetadata& operator=(GatheredMetadata&&) = default;
  GatheredMetadata(const GatheredMetadata&) = delete;
  GatheredMetadata& operator=(const GatheredMetadata&) = delete;

  std::int64_t step = 0;
  /// By name.
  std::vector<GatheredTensor> tensors;
  /// Every tensor's chunks, tensor after tensor (each tensor's `chunks` points here).
  std::vector<GatheredChunk> chunks;
  std::map<std::string, std::string> objects;
  std::map<std::string, FileMeta> files;
  std::optional<FileMeta> trainer_state;
};

}  // namespace stagehand
