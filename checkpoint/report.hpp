#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "stagehand/core/sharded_tensor.hpp"
#include "stagehand/core/status.hpp"

namespace stagehand {

/// A chunk as written: what it is, where its bytes are, and their checksum.
struct ChunkRecord {
  ShardedTensorDesc desc;
  /// Absolute byte range in the bucket file.
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  std::uint64_t xxh3 = 0;
};

/// The outcome of writing one bucket file.
struct BucketWriteResult {
  /// Global bucket index within the rank (not the index inside a wave).
  int bucket = 0;
  std::string file;
  std::uint64_t size = 0;
  std::uint64_t xxh3 = 0;
  std::vector<ChunkRecord> chunks;
  Status status;
};

/// Everything one rank tells the coordinator about one save: sent exactly once, merged across
/// waves, with the first error when there was one (later waves are then not run).
struct RankSaveReport {
  int rank = 0;
  std::int64_t step = 0;
  std::vector<BucketWriteResult> buckets;
  std::map<std::string, std::string> objects;
  Status status;

  std::uint64_t bytes_written() const {
    std::uint64_t sum = 0;
    for (const auto& b : buckets) sum += b.status.is_ok() ? b.size : 0;
    return sum;
  }
};

}  // namespace stagehand
