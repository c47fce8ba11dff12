#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "stagehand/core/sharded_tensor.hpp"

namespace stagehand {

/// One chunk placed in a bucket file.
struct PlannedItem {
  /// Index of the tensor in the state dict the plan was made from (its descriptor is there: not
  /// copied here, which with 100,000 tensors would hold ~30 MB more).
  std::size_t tensor_index = 0;
  /// Its key in the bucket's header (its descriptor's chunk_key()) is in the header alone: a
  /// copy here held ~9 MB more with 100,000 tensors, for as long as the plan is kept.
  std::uint64_t nbytes = 0;
  /// Offset in the bucket's data section.
  std::uint64_t data_offset = 0;
};

/// One bucket: one file, written by one writer thread.
struct PlannedBucket {
  int index = 0;
  std::string file_name;
  std::vector<PlannedItem> items;
  std::uint64_t data_bytes = 0;
  /// The safetensors length prefix and padded JSON header.
  std::string header;

  std::uint64_t file_size() const { return header.size() + data_bytes; }
};

/// Where every chunk of one rank goes. Deterministic for the same descriptors and thread count.
struct SavePlan {
  int rank = 0;
  std::vector<PlannedBucket> buckets;
  /// Identifies the state's structure; a plan is reused while it does not change.
  std::uint64_t signature = 0;

  std::uint64_t data_bytes() const;
  std::uint64_t file_bytes() const;
};

/// A hash of names, dtypes, shapes, offsets and replica ids.
std::uint64_t structure_signature(const std::vector<ShardedTensorDesc>& descs);
/// The same of a state's descriptors, without copying them.
std::uint64_t structure_signature(const StateDict& state);

/// A chunk that several ranks hold (data-parallel replicas of a weight), any of which may write it.
struct ReplicatedChunk {
  std::string key;
  std::uint64_t bytes = 0;
  /// The ranks that hold it, in increasing order.
  std::vector<int> holders;
};

/// Which holder writes each chunk, so that no rank writes much more than its share: chunks in
/// order of size (largest first, then key), each to the holder that writes the fewest bytes so
/// far, counting `base_bytes[r]` (what rank r writes anyway), the lowest rank on ties, as
/// Megatron's fully parallel save spreads replicated tensors. Every rank that computes it from the
/// same chunks gets the same answer, so each chunk has exactly one writer.
/// @return the writing rank of each chunk, in the order of `chunks`.
/// @pre every chunk has a holder; every holder indexes `base_bytes`
std::vector<int> balance_writers(const std::vector<ReplicatedChunk>& chunks, std::vector<std::uint64_t> base_bytes);

/// Drops replicas (replica_id != 0) and splits the rest into `bucket_count` buckets: largest
/// chunk first, each into the bucket with the fewest bytes (lowest index on ties); chunks of
/// equal size go in key order.
/// @pre bucket_count >= 1 and every descriptor is valid.
SavePlan plan_save(int rank, const std::vector<ShardedTensorDesc>& descs, int bucket_count);
/// The same of a state's descriptors, without copying them.
SavePlan plan_save(int rank, const StateDict& state, int bucket_count);

}  // namespace stagehand
