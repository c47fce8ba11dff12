#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "stagehand/checkpoint/format/format.hpp"
#include "stagehand/core/sharded_tensor.hpp"
#include "stagehand/storage/file_system.hpp"

namespace stagehand {

/// A checkpoint's metadata with, for every tensor, its chunks ordered along one dimension, so
/// that the chunks overlapping a block are found without looking at the others.
///
/// A metadata.json of R ranks lists O(R) chunks of every sharded tensor. A rank that loads needs
/// only the few that overlap its blocks: part_for() finds them by binary search, so that R ranks
/// each taking their part cost O(R log R) together instead of O(R^2).
///
/// Thread-safety: immutable once made; any number of threads may call part_for() at once.
class MetadataIndex {
 public:
  /// @pre `metadata` passed validate_metadata (its chunks tile each tensor).
  explicit MetadataIndex(CheckpointMetadata metadata);

  const CheckpointMetadata& metadata() const { return metadata_; }

  /// What a load of `state` reads: every tensor of `state` that the checkpoint holds, with only
  /// the chunks that share an element with the live block, in the order the metadata lists
  /// them; the files those chunks are in; the objects `state` names. The step and the trainer
  /// state's record are the checkpoint's. A tensor or object the checkpoint lacks is left out
  /// (the loader names it).
  CheckpointMetadata part_for(const StateDict& state) const;

 private:
  /// A tensor's chunks by ascending offset along `dim`; every chunk spans at most `max_extent`
  /// along it.
  struct TensorOrder {
    std::size_t dim = 0;
    std::int64_t max_extent = 0;
    std::vector<std::uint32_t> by_offset;
  };

  /// Indices (into the tensor's chunks) of the chunks that share an element with `block`, in no
  /// particular order.
  std::vector<std::uint32_t> overlapping(const TensorMeta& tensor, const TensorOrder& order,
                                         const ShardedTensorDesc& block) const;

  CheckpointMetadata metadata_;
  std::map<std::string, TensorOrder> orders_;
};

/// The MetadataIndex of the metadata.json at `path` on `fs`, read by `read` once per process
/// and shared by every rank of the process that loads the same file: R in-process ranks parse
/// it once, not R times, and a checkpoint in an object store is fetched once. The last file read
/// stays cached; a file that changed since (another version by FileSystem::stat_file, or other
/// first bytes, which hold its "checksum" field) is read again. A concurrent call for the same
/// file waits for the first one's read instead of reading it again.
Result<std::shared_ptr<const MetadataIndex>> shared_metadata_index(
    FileSystem& fs, const std::string& path, const std::function<Result<CheckpointMetadata>()>& read);

}  // namespace stagehand
