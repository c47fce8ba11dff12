#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "stagehand/checkpoint/planner.hpp"
#include "stagehand/core/copy_engine.hpp"
#include "stagehand/core/host_buffer.hpp"
#include "stagehand/core/sharded_tensor.hpp"

namespace stagehand {

/// Bytes of a bucket file's data section that pass through one staging slot at a time.
inline constexpr std::size_t kMaxPieceBytes = 64u << 20;

/// The sizes of the host staging slots a save needs, each charged to staging_memory():
/// - none when nothing must be copied out first (a sync save of host-resident tensors, written
///   straight from their memory);
/// - one slot per piece of every bucket, at its exact size, for an async save with
///   `staging_buckets` 0 (the whole shard is snapshotted before the save returns);
/// - otherwise a ring of equal slots holding at most `staging_buckets` buckets' worth of bytes
///   (all buckets' when 0), and for a sync save no more slots than writer threads.
std::vector<std::size_t> staging_slot_sizes(const SavePlan& plan, int thread_count, int staging_buckets, bool async,
                                            bool copy_out);

/// A bucket's data section cut into pieces of at most `piece_bytes`: piece k is bytes
/// [k * piece_bytes, min((k + 1) * piece_bytes, data_bytes)).
std::size_t piece_count(const PlannedBucket& bucket, std::size_t piece_bytes);

/// Host buffers that staged pieces of bucket files pass through: allocated once (pages touched
/// at once, pinned on request), kept across saves while the sizes stay the same, handed out and
/// returned as pieces are staged and written.
///
/// Thread-safety: reserve() and release_all() while no slot is taken; acquire(), try_acquire(),
/// give_back() and data() from any thread.
class StagingPool {
 public:
  explicit StagingPool(bool pinned) : pinned_(pinned) {}

  /// Makes the slots have exactly `sizes`; every slot is free afterwards.
  Status reserve(const std::vector<std::size_t>& sizes);
  /// The smallest free slot of at least `bytes`, taken; blocks until one is free.
  /// @pre some slot has at least `bytes`
  std::size_t acquire(std::size_t bytes);
  /// The same without blocking; false when none is free.
  bool try_acquire(std::size_t bytes, std::size_t& slot);
  void give_back(std::size_t slot);

  std::uint8_t* data(std::size_t slot) { return slots_[slot].data(); }
  /// The largest slot; 0 without slots.
  std::size_t piece_bytes() const;
  std::size_t slot_count() const { return slots_.size(); }
  /// Bytes held by all slots; may be read from any thread.
  std::size_t bytes() const { return bytes_.load(std::memory_order_relaxed); }
  /// Frees every slot; the next reserve() allocates them again.
  void release_all();

 private:
  bool take_locked(std::size_t bytes, std::size_t& slot);

  bool pinned_;
  std::vector<HostBuffer> slots_;
  std::vector<bool> free_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::atomic<std::size_t> bytes_{0};
};

/// Copies bytes [begin, end) of `bucket`'s data section from the tensors of `state` (device or
/// host memory) into `dst`, laid out exactly as in the file. Device memory is copied on `stream`
/// of `engine`: every piece enqueued at once, then one event waited for, after which `dst` is the
/// writer's (checked by engine.check_readable).
Status stage_range(const PlannedBucket& bucket, std::uint64_t begin, std::uint64_t end, const StateDict& state,
                   std::uint8_t* dst, CopyEngine& engine, CopyStream stream);

}  // namespace stagehand
