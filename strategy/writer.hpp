#pragma once

#include <cstdint>
#include <string>

#include "strategy/planner.hpp"
#include "strategy/report.hpp"
#include "strategy/storage.hpp"

namespace stagehand {

/// Writes one bucket file to `dir`: the planned header, then the staged `data` in large
/// sequential writes, taking the XXH3 of every chunk and of the whole file on the way. Errors
/// carry the rank, bucket, file and errno.
/// @param unsynced when null, the file is fsynced and closed here; otherwise it is handed over
///        open, its bytes written but not yet durable, for finish_bucket() (so that the staging
///        buffer can be reused without waiting for the disk).
BucketWriteResult write_bucket(StorageBackend& storage, const std::string& dir, int rank,
                               const PlannedBucket& bucket, const std::uint8_t* data,
                               std::unique_ptr<WritableFile>* unsynced = nullptr);

/// fsyncs and closes a file that write_bucket() handed over; records an error in `result`.
void finish_bucket(int rank, std::unique_ptr<WritableFile> file, BucketWriteResult& result);

}  // namespace stagehand
