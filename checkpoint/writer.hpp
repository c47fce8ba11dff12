#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "stagehand/checkpoint/format.hpp"
#include "stagehand/checkpoint/planner.hpp"
#include "stagehand/checkpoint/report.hpp"
#include "stagehand/storage/file_system.hpp"

namespace stagehand {

/// Creates bucket file `bucket.file_name` in `dir` and writes its planned header: the first step
/// of writing a bucket.
Result<std::unique_ptr<WritableFile>> open_bucket_file(FileSystem& fs, const std::string& dir,
                                                       const PlannedBucket& bucket);

/// Hashes a bucket file's bytes in one pass, in file order: every chunk's XXH3 (into `chunks`,
/// with its place in the file) and the whole file's (its header, then its data section).
///
/// Thread-safety: one thread at a time.
class BucketHasher {
 public:
  /// @post `chunks` has one record per item; each gets its XXH3 once its last byte is consumed.
  BucketHasher(const PlannedBucket& bucket, std::vector<ChunkRecord>& chunks);
  /// The next `bytes` of the data section.
  void consume(const std::uint8_t* data, std::size_t bytes);
  /// @pre the whole data section was consumed
  std::uint64_t file_digest() const { return file_.digest(); }

 private:
  /// Records every item that ends at or before the bytes consumed so far.
  void close_finished_items();

  const PlannedBucket& bucket_;
  std::vector<ChunkRecord>& chunks_;
  Xxh3Stream file_;
  Xxh3Stream item_;
  std::size_t next_item_ = 0;
  std::uint64_t consumed_ = 0;
};

/// Writes `bytes` at `offset` of `file`, then (when `early_writeback`) starts the write-back of
/// that range, so that dirty pages do not pile up until the fsync.
Status write_and_start_writeback(WritableFile& file, std::uint64_t offset, const std::uint8_t* data,
                                 std::size_t bytes, bool early_writeback);

}  // namespace stagehand
