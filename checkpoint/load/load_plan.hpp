#pragma once

// Planning a load's reads: which byte ranges of which files, coalesced into few large reads.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "stagehand/checkpoint/load/checkpoint_reader.hpp"
#include "stagehand/core/dtype.hpp"
#include "stagehand/core/sharded_tensor.hpp"

namespace stagehand {

/// A byte range of one file that a load needs.
struct ReadRange {
  std::string file;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
};

/// Groups `ranges` into reads: ranges of the same file where one ends exactly where the next
/// begins are merged while the read stays at most `max_bytes` (a range larger than that is a read
/// of its own); a gap, however small, starts a new read. Reads come out ordered by file, then
/// offset, each listing the indices of its ranges in `ranges` by ascending offset.
/// @pre ranges of one file do not overlap.
std::vector<std::vector<std::size_t>> coalesce_ranges(const std::vector<ReadRange>& ranges,
                                                      std::uint64_t max_bytes);

/// One saved chunk that overlaps a live block, to be read and verified.
struct ChunkJob {
  /// The block the chunk fills.
  ShardedTensor* live = nullptr;
  const ChunkMeta* chunk = nullptr;
  const DataFile* file = nullptr;
  /// The block's memory the whole chunk is read into; null when it goes through a buffer.
  std::uint8_t* direct = nullptr;
  /// The saved dtype; when it differs from the live one, elements are converted on the way.
  DType saved = DType::f32;
  /// Other blocks the same chunk fills (another rank of the process, another live tensor taken
  /// from the same saved one): the chunk is read and verified once and copied into each.
  std::vector<ShardedTensor*> copies;
};

/// Merges the jobs that read the same chunk (same file, same offset) into one, whose `copies`
/// name the other blocks: a job that reads straight into its block is kept as the one that
/// reads. Jobs keep their order otherwise.
void merge_shared_chunks(std::vector<ChunkJob>& jobs);

/// A byte range of one chunk inside a read.
struct Piece {
  std::size_t job = 0;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
};

/// One coalesced read: neighbouring pieces of one file, all read straight into tensors or all
/// through a buffer.
struct ReadTask {
  const DataFile* file = nullptr;
  bool direct = false;
  std::vector<Piece> pieces;
  std::uint64_t begin() const { return pieces.front().begin; }
  std::uint64_t end() const { return pieces.back().end; }
};

/// Groups the jobs into tasks of coalesced whole chunks, ordered by file and offset: one thread
/// reads each task, so that each chunk's hash sees its bytes in order.
std::vector<ReadTask> plan_reads(const std::vector<ChunkJob>& jobs, std::uint64_t max_read_bytes);

}  // namespace stagehand
