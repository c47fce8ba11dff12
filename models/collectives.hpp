#pragma once

#include <barrier>
#include <cstddef>
#include <mutex>
#include <vector>

namespace stagehand {

/// Collectives among the in-process members of one tensor- or data-parallel group, on host
/// memory. Every reduction adds the members' contributions in member order, so results are
/// bit-identical from run to run.
///
/// Thread-safety: each member calls every collective from its own thread, all members the same
/// collectives in the same order; a call returns once every member has taken part.
class HostGroup {
 public:
  explicit HostGroup(int size);

  int size() const { return size_; }

  /// Replaces `data[0..count)` of every member with the sum over members.
  void all_reduce_sum(int member, float* data, std::size_t count);

  /// Every member owns `[offset, offset + count)` of a `full` buffer of the same length on each
  /// member; afterwards every member's buffer holds every member's region.
  void all_gather(int member, float* full, std::size_t offset, std::size_t count);

 private:
  struct Slot {
    float* data = nullptr;
    std::size_t offset = 0;
    std::size_t count = 0;
  };

  int size_;
  std::vector<Slot> slots_;
  std::vector<float> scratch_;
  std::barrier<> barrier_;
};

}  // namespace stagehand
