#include "stagehand/checkpoint/stager.hpp"

#include <algorithm>
#include <cstring>

namespace stagehand {

Status StagingPool::reserve(const SavePlan& plan, int wave_size) {
  std::size_t slots = std::min(plan.buckets.size(), static_cast<std::size_t>(wave_size));
  std::vector<std::size_t> need(slots, 0);
  for (std::size_t b = 0; b < plan.buckets.size(); ++b) {
    std::size_t j = b % static_cast<std::size_t>(wave_size);
    need[j] = std::max<std::size_t>(need[j], plan.buckets[b].data_bytes);
  }
  auto recount = [this] {
    std::size_t sum = 0;
    for (const auto& s : slots_) sum += s.size();
    bytes_.store(sum, std::memory_order_relaxed);
  };
  slots_.resize(slots);
  for (std::size_t j = 0; j < slots; ++j) {
    if (slots_[j].size() == need[j]) continue;
    slots_[j] = HostBuffer();
    if (need[j] == 0) continue;
    slots_[j] = HostBuffer(need[j], pinned_, &staging_memory());
    if (!slots_[j].valid()) {
      slots_[j] = HostBuffer();
      recount();
      return {ErrorCode::no_space, "cannot allocate a host staging buffer of " +
                                       std::to_string(need[j]) + " bytes"};
    }
    // Touch every page now: first-touch page faults would otherwise land in the first save.
    std::memset(slots_[j].data(), 0, slots_[j].size());
  }
  recount();
  return Status::ok();
}

void StagingPool::release() {
  slots_.clear();
  bytes_.store(0, std::memory_order_relaxed);
}

Status stage_items(const PlannedBucket& bucket, std::size_t first, std::size_t last, const StateDict& state,
                   std::uint8_t* dst) {
  for (std::size_t i = first; i < last; ++i) {
    const PlannedItem& item = bucket.items[i];
    const Tensor& tensor = state.tensors[item.tensor_index].tensor;
    Status st = tensor.copy_to_host(dst + item.data_offset);
    if (!st.is_ok()) return st.with_context("staging '" + item.key + "'");
  }
  return Status::ok();
}

}  // namespace stagehand
