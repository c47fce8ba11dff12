#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "stagehand/checkpoint/planner.hpp"
#include "stagehand/checkpoint/report.hpp"
#include "stagehand/storage/local_files.hpp"

namespace stagehand {

/// Creates bucket file `bucket.file_name` in `dir` and writes its planned header: the first step
/// of writing a bucket.
Result<std::unique_ptr<WritableFile>> open_bucket_file(StorageBackend& storage, const std::string& dir,
                                                       const PlannedBucket& bucket);

/// Writes items [first, last) of `bucket` from the staged `data` at their places in the file, in
/// large writes, and records each as `chunks[i]` with its XXH3. Disjoint item ranges of one file
/// may be written by several threads at once. An error names the file and the errno.
Status write_bucket_items(WritableFile& file, const PlannedBucket& bucket, std::size_t first, std::size_t last,
                          const std::uint8_t* data, std::vector<ChunkRecord>& chunks);

/// XXH3 of a whole bucket file: its header, then the staged data section.
std::uint64_t bucket_file_xxh3(const PlannedBucket& bucket, const std::uint8_t* data);

/// Item boundaries that split `bucket` into at most `parts` runs of consecutive items of about
/// equal bytes: part p holds items [bounds[p], bounds[p + 1]).
std::vector<std::size_t> split_items(const PlannedBucket& bucket, int parts);

/// fsyncs and closes a bucket file; records an error in `result`.
void finish_bucket(int rank, std::unique_ptr<WritableFile> file, BucketWriteResult& result);

}  // namespace stagehand
