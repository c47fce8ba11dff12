#include "stagehand/checkpoint/stager.hpp"

#include <algorithm>
#include <cstring>
#include <map>

namespace stagehand {

namespace {

constexpr std::size_t kPageBytes = 4096;
/// Smallest slot of a ring: below this, per-piece overhead outweighs the memory saved.
constexpr std::size_t kMinPieceBytes = 256u << 10;

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

}  // namespace

std::size_t piece_count(const PlannedBucket& bucket, std::size_t piece_bytes) {
  return static_cast<std::size_t>((bucket.data_bytes + piece_bytes - 1) / piece_bytes);
}

std::vector<std::size_t> staging_slot_sizes(const SavePlan& plan, int thread_count, int staging_buckets, bool async,
                                            bool copy_out) {
  std::vector<std::size_t> sizes;
  if (!copy_out && !async) return sizes;
  std::uint64_t largest = 0;
  for (const auto& b : plan.buckets) largest = std::max(largest, b.data_bytes);
  if (largest == 0) return sizes;
  if (async && staging_buckets == 0) {
    // The whole shard, at its exact size: an async save copies everything before it returns.
    for (const auto& b : plan.buckets) {
      for (std::uint64_t at = 0; at < b.data_bytes; at += kMaxPieceBytes) {
        sizes.push_back(static_cast<std::size_t>(std::min<std::uint64_t>(kMaxPieceBytes, b.data_bytes - at)));
      }
    }
    return sizes;
  }
  const std::uint64_t budget =
      staging_buckets == 0 ? plan.data_bytes() : static_cast<std::uint64_t>(staging_buckets) * largest;
  const auto threads = static_cast<std::uint64_t>(thread_count);
  // Two slots per writer thread: every thread can stream its bucket while another piece waits.
  std::size_t piece = round_up(static_cast<std::size_t>((budget + 2 * threads - 1) / (2 * threads)), kPageBytes);
  piece = std::clamp(piece, kMinPieceBytes, kMaxPieceBytes);
  // Never more than the budget, nor more than the largest bucket needs.
  piece = std::min(piece, static_cast<std::size_t>(std::min<std::uint64_t>(budget, largest)));
  std::size_t pieces = 0;
  for (const auto& b : plan.buckets) pieces += piece_count(b, piece);
  std::size_t slots = std::max<std::size_t>(1, static_cast<std::size_t>(budget / piece));
  slots = std::min(slots, pieces);
  // A sync save's writer thread holds one slot at a time.
  if (!async) slots = std::min(slots, static_cast<std::size_t>(threads));
  sizes.assign(slots, piece);
  return sizes;
}

Status StagingPool::reserve(const std::vector<std::size_t>& sizes) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto recount = [this] {
    std::size_t sum = 0;
    for (const auto& s : slots_) sum += s.size();
    bytes_.store(sum, std::memory_order_relaxed);
  };
  // A buffer of the same size is kept whatever slot it was (the first save's plan may order its
  // pieces otherwise than the plan the slots were reserved for): it is already allocated and
  // touched. Only the sizes that are new are allocated; buffers no size asks for are freed.
  std::multimap<std::size_t, HostBuffer> kept;
  for (auto& slot : slots_) {
    if (slot.valid()) kept.emplace(slot.size(), std::move(slot));
  }
  slots_.clear();
  slots_.resize(sizes.size());
  free_.assign(sizes.size(), true);
  for (std::size_t j = 0; j < sizes.size(); ++j) {
    if (auto same = kept.find(sizes[j]); same != kept.end()) {
      slots_[j] = std::move(same->second);
      kept.erase(same);
    }
  }
  kept.clear();
  for (std::size_t j = 0; j < sizes.size(); ++j) {
    if (slots_[j].valid()) continue;
    slots_[j] = HostBuffer(sizes[j], pinned_, &staging_memory());
    if (!slots_[j].valid()) {
      slots_.resize(j);
      free_.resize(j);
      recount();
      return {ErrorCode::no_space, "cannot allocate a host staging buffer of " + std::to_string(sizes[j]) + " bytes"};
    }
    // Touch every page now: first-touch page faults would otherwise land in the first save.
    std::memset(slots_[j].data(), 0, slots_[j].size());
  }
  recount();
  return Status::ok();
}

bool StagingPool::take_locked(std::size_t bytes, std::size_t& slot) {
  bool found = false;
  for (std::size_t j = 0; j < slots_.size(); ++j) {
    if (free_[j] && slots_[j].size() >= bytes && (!found || slots_[j].size() < slots_[slot].size())) {
      slot = j;
      found = true;
    }
  }
  if (found) free_[slot] = false;
  return found;
}

std::size_t StagingPool::acquire(std::size_t bytes) {
  std::unique_lock<std::mutex> lock(mutex_);
  std::size_t slot = 0;
  cv_.wait(lock, [&] { return take_locked(bytes, slot); });
  return slot;
}

bool StagingPool::try_acquire(std::size_t bytes, std::size_t& slot) {
  std::lock_guard<std::mutex> lock(mutex_);
  return take_locked(bytes, slot);
}

void StagingPool::give_back(std::size_t slot) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    free_[slot] = true;
  }
  cv_.notify_all();
}

std::size_t StagingPool::piece_bytes() const {
  std::size_t largest = 0;
  for (const auto& s : slots_) largest = std::max(largest, s.size());
  return largest;
}

void StagingPool::release_all() {
  std::lock_guard<std::mutex> lock(mutex_);
  slots_.clear();
  free_.clear();
  bytes_.store(0, std::memory_order_relaxed);
}

Status stage_range(const PlannedBucket& bucket, std::uint64_t begin, std::uint64_t end, const StateDict& state,
                   std::uint8_t* dst, CopyEngine& engine, CopyStream stream) {
  bool on_device = false;
  for (const PlannedItem& item : bucket.items) {
    const std::uint64_t from = std::max(begin, item.data_offset);
    const std::uint64_t to = std::min(end, item.data_offset + item.nbytes);
    if (from >= to) continue;
    const Tensor& tensor = state.tensors[item.tensor_index].tensor;
    const auto* src = static_cast<const std::uint8_t*>(tensor.data()) + (from - item.data_offset);
    const auto bytes = static_cast<std::size_t>(to - from);
    if (!tensor.device().is_cuda()) {
      std::memcpy(dst + (from - begin), src, bytes);
      continue;
    }
    on_device = true;
    Status copied = engine.copy_async(stream, CopyKind::device_to_host, dst + (from - begin), src, bytes);
    if (!copied.is_ok()) return copied.with_context("staging '" + item.key + "'");
  }
  if (!on_device) return Status::ok();
  auto event = engine.record(stream);
  Status st = event.is_ok() ? engine.wait(*event) : event.status();
  if (!st.is_ok()) return st.with_context("staging bucket bytes " + std::to_string(begin) + "-" + std::to_string(end));
  return engine.check_readable(dst, static_cast<std::size_t>(end - begin));
}

}  // namespace stagehand
