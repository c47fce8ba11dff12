#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "stagehand/checkpoint/save/planner.hpp"
#include "stagehand/core/copy_engine.hpp"
#include "stagehand/core/host_buffer.hpp"
#include "stagehand/core/sharded_tensor.hpp"
#include "stagehand/storage/file_system.hpp"

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

/// Host memory that staged pieces of bucket files pass through: buffers allocated at the sizes
/// asked for (pages touched at once, pinned on request) and cut into slots, kept across saves,
/// the slots handed out and returned as pieces are staged and written.
///
/// Thread-safety: reserve() and release_all() while no slot is taken; acquire(), try_acquire(),
/// give_back() and data() from any thread.
class StagingPool {
 public:
  /// @param block_aligned each slot starts at a 4096-byte boundary and has room for that many
  ///   more bytes than its size, so that a piece can be placed at the offset within a block that
  ///   its file bytes have (block_offset()): written with O_DIRECT (uncached writes), no copy.
  explicit StagingPool(bool pinned, bool block_aligned = false) : pinned_(pinned), block_aligned_(block_aligned) {}

  /// Where in its slot a piece that is written to file offset `file_offset` starts: that
  /// offset's place within a 4096-byte block with block_aligned slots, else 0.
  std::size_t block_offset(std::uint64_t file_offset) const {
    return block_aligned_ ? static_cast<std::size_t>(file_offset % kDirectIoBlock) : 0;
  }

  /// Makes the slots have `sizes`; every slot is free afterwards. The slots are laid into the
  /// buffers held (largest first, each into the first with room), and only the ones that do not
  /// fit get a buffer of their own, of exactly their sum: a plan cut otherwise than the one
  /// reserved for (the first save's, whose global plan gives a rank other ranks' replicas to
  /// write and leaves out its own, against the whole state's at start) allocates and touches
  /// only what is more. When that would hold more than an eighth over the sum of `sizes`
  /// (kSlackDivisor), the slots are laid into what is held and the tails of the buffers that no
  /// slot takes are given back to the system (HostBuffer::trim), so that a shrink allocates and
  /// touches nothing; pinned memory, which cannot be trimmed, is freed first and one buffer of
  /// exactly the sum allocated.
  /// @post bytes() is at least the sum of `sizes` and at most 9/8 of it (of the slots'
  ///   footprints, with block_aligned slots)
  /// With `headroom`, a buffer this allocates is an eighth of the sum larger (touched too, free
  /// for later slots), while what is held stays within the bound: a later reserve() of up to that
  /// much more then takes it without allocating.
  /// @param touch_threads how many threads touch the pages of a buffer this allocates, at once
  ///   (their faults, the first touch of fresh memory, then stay out of the saves); 0: not now,
  ///   the copies of the save that reserves touch them in the same pass as they fill them.
  Status reserve(const std::vector<std::size_t>& sizes, bool headroom = false, int touch_threads = 1);
  /// The memory held may be at most 1/kSlackDivisor more than the slots' sum.
  static constexpr std::size_t kSlackDivisor = 8;
  /// The smallest free slot of at least `bytes`, taken; blocks until one is free.
  /// @pre some slot has at least `bytes`
  std::size_t acquire(std::size_t bytes);
  /// The same without blocking; false when none is free.
  bool try_acquire(std::size_t bytes, std::size_t& slot);
  void give_back(std::size_t slot);

  std::uint8_t* data(std::size_t slot) { return starts_[slot]; }
  /// The largest slot; 0 without slots.
  std::size_t piece_bytes() const;
  std::size_t slot_count() const { return sizes_.size(); }
  /// Bytes of host memory held; may be read from any thread.
  std::size_t bytes() const { return bytes_.load(std::memory_order_relaxed); }
  /// Frees the memory and every slot; the next reserve() allocates again.
  void release_all();

 private:
  bool take_locked(std::size_t bytes, std::size_t& slot);
  void clear_locked();
  /// The memory a slot of `size` bytes takes.
  std::size_t footprint(std::size_t size) const;

  bool pinned_;
  bool block_aligned_;
  std::vector<HostBuffer> buffers_;
  /// Each slot's size and where it starts, in one of `buffers_`.
  std::vector<std::size_t> sizes_;
  std::vector<std::uint8_t*> starts_;
  std::vector<bool> free_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::atomic<std::size_t> bytes_{0};
};

/// Host blocks of one size, taken by whoever writes through one (a bucket's writer thread) and
/// given back for the next; allocated when none is free, counted as staging memory, kept until
/// release_all().
///
/// Thread-safety: every member from any thread.
class BlockPool {
 public:
  explicit BlockPool(std::size_t block_bytes) : block_bytes_(block_bytes) {}
  /// A free block, or a new one (invalid when it cannot be allocated).
  HostBuffer take();
  void give_back(HostBuffer block);
  /// Bytes of the blocks free in the pool.
  std::size_t bytes() const;
  void release_all();

 private:
  std::size_t block_bytes_;
  mutable std::mutex mutex_;
  std::vector<HostBuffer> free_;
};

/// Copies bytes [begin, end) of `bucket`'s data section from the tensors of `state` (device or
/// host memory) into `dst`, laid out exactly as in the file. Device memory is copied on `stream`
/// of `engine`: every piece enqueued at once, then one event waited for, after which `dst` is the
/// writer's (checked by engine.check_readable).
Status stage_range(const PlannedBucket& bucket, std::uint64_t begin, std::uint64_t end, const StateDict& state,
                   std::uint8_t* dst, CopyEngine& engine, CopyStream stream);

}  // namespace stagehand
