#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "stagehand/checkpoint/format/format.hpp"
#include "stagehand/checkpoint/save/planner.hpp"
#include "stagehand/checkpoint/save/report.hpp"
#include "stagehand/storage/file_system.hpp"

namespace stagehand {

/// Creates bucket file `bucket.file_name` in `dir` and writes its planned header: the first step
/// of writing a bucket. `uncached`: created with FileSystem::create_file_uncached.
Result<std::unique_ptr<WritableFile>> open_bucket_file(FileSystem& fs, const std::string& dir,
                                                       const PlannedBucket& bucket, bool uncached = false);

/// Hashes a bucket file's bytes in one pass, in file order: every chunk's XXH3 (into `chunks`,
/// with its place in the file) and the whole file's (its header, then its data section).
///
/// Thread-safety: one thread at a time.
class BucketHasher {
 public:
  /// @post `chunks` has one record per item (naming its tensor by the item's index); each gets its XXH3 once its last byte is consumed.
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

/// Starts the write-back of written ranges (WritableFile::start_writeback: sync_file_range) on a
/// thread of its own, so that no writer waits for it. A sync_file_range blocks while the device's
/// request queue is full, and inline, the writes of that bucket waited behind it; such waits made
/// some saves twice as slow as the others (docs/benchmarks.md, "Steadiness of saves"). Requests for a file that are still queued when it is synced are dropped: the sync
/// writes everything back. A file's queued ranges that touch are merged, so the queue stays about
/// one range per file open for writing however far the thread falls behind.
///
/// Thread-safety: every member from any thread. The files' start_writeback() runs on this
/// object's thread while their writers go on writing (WritableFile allows it).
class BackgroundWriteback {
 public:
  /// @param thread_start run first on the thread (the writers' priority: its requests carry the
  ///        thread's I/O priority); may be empty.
  explicit BackgroundWriteback(const std::function<void()>& thread_start = nullptr);
  ~BackgroundWriteback();
  BackgroundWriteback(const BackgroundWriteback&) = delete;
  BackgroundWriteback& operator=(const BackgroundWriteback&) = delete;

  /// Queues the write-back of [offset, offset + bytes) of `file`.
  void request(WritableFile& file, std::uint64_t offset, std::size_t bytes);
  /// @post no write-back of `file` runs or will run: call before it is synced, closed or destroyed.
  void forget(WritableFile& file);
  /// Ranges whose write-back this object started, after merging.
  std::uint64_t started() const;

 private:
  struct Range {
    WritableFile* file;
    std::uint64_t begin;
    std::uint64_t end;
  };
  void run(const std::function<void()>& thread_start);

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable idle_;
  std::deque<Range> queue_;
  WritableFile* running_ = nullptr;
  bool stopping_ = false;
  std::uint64_t started_ = 0;
  std::thread thread_;
};

/// Writes `bytes` at `offset` of `file`, then (when `writeback` is not null) has the write-back
/// of that range started, so that dirty pages do not pile up until the fsync.
Status write_and_start_writeback(WritableFile& file, std::uint64_t offset, const std::uint8_t* data,
                                 std::size_t bytes, BackgroundWriteback* writeback);

/// Bytes hashed and then written at once: small enough to stay in the CPU cache between the
/// hash and the write's copy into the page cache.
inline constexpr std::size_t kHashBlockBytes = 2u << 20;
/// Bytes written at once into a file that takes writes around the page cache
/// (WritableFile::direct_block): such a write does not read the bytes through the CPU's cache,
/// and the thread waits for the device, so fewer, larger writes.
inline constexpr std::size_t kDirectWriteBytes = 4 * kHashBlockBytes;
/// A bounce block (hash_and_write). Its writes end at block boundaries: the first of a range
/// is up to 4095 bytes shorter, the others kBounceBytes. One block per bucket being written: at
/// 8 threads 32 MiB. 8 MiB blocks held 64 MiB (a save of 100 tensors: 68 MiB extra, DCP's 2.4);
/// 2 MiB blocks made that save ~1.1x slower, 4 MiB ones no slower (bench/many_tensors.py).
inline constexpr std::size_t kBounceBytes = 2 * kHashBlockBytes;

/// Adds the seconds `work` takes to `phase`; returns what it returns.
template <class F>
auto timed(double& phase, F&& work) {
  const auto start = std::chrono::steady_clock::now();
  auto result = work();
  phase += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

/// Hashes `bytes` of `bucket`'s data section at data offset `at` from `data` into `hasher`, and
/// writes them to `file` (write_and_start_writeback), adding the seconds to `phases`. With
/// `bounce` (kBounceBytes, kDirectIoBlock-aligned), the bytes are copied there first (copy_s),
/// each write's at its file offset's place within a block: a file that takes writes around the
/// page cache then takes them whole, whatever the alignment of `data`.
Status hash_and_write(WritableFile& file, const PlannedBucket& bucket, BucketHasher& hasher, std::uint64_t at,
                      const std::uint8_t* data, std::size_t bytes, SavePhases& phases, BackgroundWriteback* writeback,
                      std::uint8_t* bounce = nullptr);

}  // namespace stagehand
