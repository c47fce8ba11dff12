#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "stagehand/core/sharded_tensor.hpp"
#include "stagehand/core/status.hpp"

namespace stagehand {

/// A chunk as written: which of the rank's tensors it is, where its bytes are, and their
/// checksum. The tensor is named by its index in the state the rank saved (the order of its
/// local plan, which the coordinator holds), not by a copy of its descriptor: with 100,000
/// tensors the copies were ~20 MB per save, and as much again on the wire per rank.
struct ChunkRecord {
  std::uint32_t tensor = 0;
  /// Absolute byte range in the bucket file.
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  std::uint64_t xxh3 = 0;
};

/// Seconds a save spent in each phase. For one bucket: its writer thread's time; for a rank:
/// the slowest bucket's time in each phase (buckets run in parallel), and the upload.
struct SavePhases {
  /// Device-to-host (or host) copies into staging buffers; 0 for a zero-copy save.
  double copy_s = 0;
  /// Chunk and file checksums.
  double hash_s = 0;
  /// Writes into the page cache (or the storage backend).
  double write_s = 0;
  double fsync_s = 0;
  /// Uploading the rank's files to an object store.
  double upload_s = 0;

  /// Each phase the larger of this and `other`.
  void take_max(const SavePhases& other);
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
  SavePhases phases;
  /// An async save copied the bucket's snapshot straight into the file's memory (a file written
  /// over in a folder kept in memory: FileSystemCapabilities::in_memory), not through staging.
  bool staged_in_file = false;
};

/// Everything one rank tells the coordinator about one save: sent exactly once, merged across
/// waves, with the first error when there was one (later waves are then not run).
struct RankSaveReport {
  int rank = 0;
  std::int64_t step = 0;
  std::vector<BucketWriteResult> buckets;
  std::map<std::string, std::string> objects;
  Status status;
  SavePhases phases;
  /// CPU seconds the rank's writer threads spent on this save (staging copies, checksums,
  /// writes and syncs), and the calling thread on an async save's copies before it returns
  /// (SaveEngine::begin_async), summed over the threads: what the save took from the cores,
  /// without the time its threads waited for one.
  double cpu_s = 0;

  std::uint64_t bytes_written() const {
    std::uint64_t sum = 0;
    for (const auto& b : buckets) sum += b.status.is_ok() ? b.size : 0;
    return sum;
  }
};

// -- for CAF's serialization: reports travel from every rank to the coordinator --

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ChunkRecord& x) {
  return f(x.tensor, x.begin, x.end, x.xxh3);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SavePhases& x) {
  return f(x.copy_s, x.hash_s, x.write_s, x.fsync_s, x.upload_s);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, BucketWriteResult& x) {
  return f(x.bucket, x.file, x.size, x.xxh3, x.chunks, x.status, x.phases, x.staged_in_file);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RankSaveReport& x) {
  return f(x.rank, x.step, x.buckets, x.objects, x.status, x.phases, x.cpu_s);
}

inline void SavePhases::take_max(const SavePhases& other) {
  copy_s = std::max(copy_s, other.copy_s);
  hash_s = std::max(hash_s, other.hash_s);
  write_s = std::max(write_s, other.write_s);
  fsync_s = std::max(fsync_s, other.fsync_s);
  upload_s = std::max(upload_s, other.upload_s);
}

}  // namespace stagehand
