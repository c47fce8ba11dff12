#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "stagehand/checkpoint/planner.hpp"
#include "stagehand/core/host_buffer.hpp"
#include "stagehand/core/sharded_tensor.hpp"

namespace stagehand {

/// Host buffers that hold staged buckets: one slot per bucket of a wave, each allocated at the
/// exact size of the largest bucket it holds (and its pages touched at once), charged to
/// staging_memory(), and kept across saves while the sizes stay the same.
///
/// Thread-safety: reserve() from one thread; distinct slots may then be filled concurrently.
class StagingPool {
 public:
  explicit StagingPool(bool pinned) : pinned_(pinned) {}

  /// Makes slot j fit bucket w * wave_size + j for every wave w.
  /// @pre wave_size >= 1
  Status reserve(const SavePlan& plan, int wave_size);

  std::uint8_t* slot(std::size_t j) { return slots_[j].data(); }
  /// Bytes held by all slots; may be read from any thread.
  std::size_t bytes() const { return bytes_.load(std::memory_order_relaxed); }
  /// Frees every slot; the next reserve() allocates them again.
  void release();

 private:
  bool pinned_;
  std::vector<HostBuffer> slots_;
  std::atomic<std::size_t> bytes_{0};
};

/// Copies items [first, last) of `bucket` from `state` (device or host memory) into `dst`, laid
/// out exactly as the bucket file's data section.
Status stage_items(const PlannedBucket& bucket, std::size_t first, std::size_t last, const StateDict& state,
                   std::uint8_t* dst);

/// Stages every item of `bucket`.
inline Status stage_bucket(const PlannedBucket& bucket, const StateDict& state, std::uint8_t* dst) {
  return stage_items(bucket, 0, bucket.items.size(), state, dst);
}

}  // namespace stagehand
