#pragma once

#include <cstdint>
#include <string>

#include "strategy/planner.hpp"
#include "strategy/report.hpp"
#include "strategy/storage.hpp"

namespace stagehand {

/// Writes one bucket file to `dir`: the planned header, then the staged `data` in large
/// sequential writes, taking the XXH3 of every chunk and of the whole file on the way, then
/// fsync. Errors carry the rank, bucket, file and errno.
BucketWriteResult write_bucket(StorageBackend& storage, const std::string& dir, int rank,
                               const PlannedBucket& bucket, const std::uint8_t* data);

}  // namespace stagehand
