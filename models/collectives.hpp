#pragma once

#include <barrier>
#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include "stagehand/core/status.hpp"

namespace stagehand {

/// The collectives of one tensor- or data-parallel group, on host memory. Every reduction adds the
/// members' contributions in member order (starting from 0.0f), so results are bit-identical
/// from run to run and whichever implementation carries them.
///
/// Thread-safety: each member calls every collective from its own thread, all members the same
/// collectives in the same order; a call returns once every member has taken part, or with an
/// error when that cannot happen (a member died, a time limit passed).
class Collective {
 public:
  virtual ~Collective() = default;

  virtual int size() const = 0;

  /// Replaces `data[0..count)` of every member with the sum over members.
  virtual Status all_reduce_sum(int member, float* data, std::size_t count) = 0;

  /// Every member owns `[offset, offset + count)` of a `full` buffer of `full_count` floats on each
  /// member; afterwards every member's buffer holds every member's region.
  /// @pre offset + count <= full_count, the same full_count on every member.
  virtual Status all_gather(int member, float* full, std::size_t full_count, std::size_t offset,
                            std::size_t count) = 0;
};

/// A group whose members are threads of one process.
class HostGroup final : public Collective {
 public:
  explicit HostGroup(int size);

  int size() const override { return size_; }
  Status all_reduce_sum(int member, float* data, std::size_t count) override;
  Status all_gather(int member, float* full, std::size_t full_count, std::size_t offset,
                    std::size_t count) override;

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

/// Where a rank sits: rank = data_index * tensor_parallel + tensor_index.
struct ParallelLayout {
  int tensor_parallel = 1;
  int data_parallel = 1;

  int world_size() const { return tensor_parallel * data_parallel; }
  int tensor_index(int rank) const { return rank % tensor_parallel; }
  int data_index(int rank) const { return rank / tensor_parallel; }
};

/// The collectives a rank takes part in: its tensor-parallel and its data-parallel group.
struct RankGroups {
  std::shared_ptr<Collective> tensor;
  std::shared_ptr<Collective> data;
};

/// Groups for every rank of an in-process world.
std::vector<RankGroups> make_host_groups(const ParallelLayout& layout);

}  // namespace stagehand
