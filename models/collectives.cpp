#include "stagehand/models/collectives.hpp"

#include <algorithm>

namespace stagehand {

HostGroup::HostGroup(int size)
    : size_(size), slots_(static_cast<std::size_t>(size)), barrier_(size) {}

Status HostGroup::all_reduce_sum(int member, float* data, std::size_t count) {
  if (size_ == 1) return Status::ok();
  slots_[static_cast<std::size_t>(member)] = {data, 0, count};
  barrier_.arrive_and_wait();
  if (member == 0) {
    scratch_.assign(count, 0.0f);
    for (const auto& slot : slots_) {
      for (std::size_t i = 0; i < count; ++i) scratch_[i] += slot.data[i];
    }
  }
  barrier_.arrive_and_wait();
  std::copy_n(scratch_.data(), count, data);
  barrier_.arrive_and_wait();
  return Status::ok();
}

Status HostGroup::all_gather(int member, float* full, std::size_t, std::size_t offset,
                             std::size_t count) {
  if (size_ == 1) return Status::ok();
  slots_[static_cast<std::size_t>(member)] = {full, offset, count};
  barrier_.arrive_and_wait();
  for (int other = 0; other < size_; ++other) {
    if (other == member) continue;
    const Slot& slot = slots_[static_cast<std::size_t>(other)];
    std::copy_n(slot.data + slot.offset, slot.count, full + slot.offset);
  }
  barrier_.arrive_and_wait();
  return Status::ok();
}

std::vector<RankGroups> make_host_groups(const ParallelLayout& layout) {
  std::vector<std::shared_ptr<HostGroup>> tensor(static_cast<std::size_t>(layout.data_parallel));
  std::vector<std::shared_ptr<HostGroup>> data(static_cast<std::size_t>(layout.tensor_parallel));
  for (auto& g : tensor) g = std::make_shared<HostGroup>(layout.tensor_parallel);
  for (auto& g : data) g = std::make_shared<HostGroup>(layout.data_parallel);
  std::vector<RankGroups> out;
  for (int rank = 0; rank < layout.world_size(); ++rank) {
    out.push_back({tensor[static_cast<std::size_t>(layout.data_index(rank))],
                   data[static_cast<std::size_t>(layout.tensor_index(rank))]});
  }
  return out;
}

}  // namespace stagehand
