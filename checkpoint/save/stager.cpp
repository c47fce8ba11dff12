#include "stagehand/checkpoint/save/stager.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <thread>
#include <vector>

#include "stagehand/core/stream_copy.hpp"

namespace stagehand {

namespace {

constexpr std::size_t kPageBytes = 4096;
/// Smallest slot of a ring: below this, per-piece overhead outweighs the memory saved.
constexpr std::size_t kMinPieceBytes = 256u << 10;

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

/// Writes every page of [data, data + bytes) on up to `threads` threads, in 2 MiB-aligned
/// parts (whole huge pages each). Fresh memory's faults run in parallel: on a virtual machine
/// whose host backs guest memory at its first touch, about as many times faster as threads.
void touch_pages(std::uint8_t* data, std::size_t bytes, int threads) {
  constexpr std::size_t kPart = 2u << 20;
  const std::size_t parts = (bytes + kPart - 1) / kPart;
  const std::size_t n = std::min<std::size_t>(static_cast<std::size_t>(std::max(threads, 1)), parts);
  auto touch = [&](std::size_t t) {
    const std::size_t first = parts * t / n, last = parts * (t + 1) / n;
    const std::size_t begin = first * kPart, end = std::min(bytes, last * kPart);
    if (end > begin) std::memset(data + begin, 0, end - begin);
  };
  if (n <= 1) {
    touch(0);
    return;
  }
  std::vector<std::thread> workers;
  workers.reserve(n - 1);
  for (std::size_t t = 1; t < n; ++t) workers.emplace_back(touch, t);
  touch(0);
  for (auto& w : workers) w.join();
}

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

std::size_t StagingPool::footprint(std::size_t size) const {
  return block_aligned_ && size > 0 ? round_up(size, kDirectIoBlock) + kDirectIoBlock : size;
}

Status StagingPool::reserve(const std::vector<std::size_t>& sizes, bool headroom, int touch_threads) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::size_t total = 0;
  for (std::size_t s : sizes) total += footprint(s);
  const std::size_t most = total + total / kSlackDivisor;
  std::size_t held = 0;
  for (const auto& b : buffers_) held += b.size();
  // Pinned memory cannot be trimmed: freed before anything is allocated, so that the peak is the
  // larger of the two, not their sum.
  if (held > most && pinned_) buffers_.clear();
  sizes_ = sizes;
  starts_.assign(sizes.size(), nullptr);
  free_.assign(sizes.size(), true);
  std::vector<std::size_t> order(sizes.size());
  for (std::size_t j = 0; j < order.size(); ++j) order[j] = j;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return sizes[a] > sizes[b]; });
  // Largest first, each into the first buffer held with room for it.
  std::vector<std::size_t> used(buffers_.size(), 0);
  std::vector<std::size_t> rest;
  std::size_t rest_bytes = 0;
  for (std::size_t j : order) {
    if (sizes[j] == 0) continue;
    std::size_t b = 0;
    while (b < buffers_.size() && buffers_[b].size() - used[b] < footprint(sizes[j])) ++b;
    if (b == buffers_.size()) {
      rest.push_back(j);
      rest_bytes += footprint(sizes[j]);
      continue;
    }
    starts_[j] = buffers_[b].data() + used[b];
    used[b] += footprint(sizes[j]);
  }
  // Buffers no slot took are freed (moving a HostBuffer keeps its memory where it is).
  std::vector<HostBuffer> kept;
  std::vector<std::size_t> kept_used;
  held = 0;
  for (std::size_t b = 0; b < buffers_.size(); ++b) {
    if (used[b] == 0) continue;
    held += buffers_[b].size();
    kept.push_back(std::move(buffers_[b]));
    kept_used.push_back(used[b]);
  }
  buffers_ = std::move(kept);
  if (held + rest_bytes > most && !pinned_) {
    // Too much held for slots laid out in it: the tails no slot took go back to the system, and
    // nothing is allocated again (a shrink, say the first save's global plan giving a rank a
    // part of the replicas it reserved for at start, would otherwise first-touch all of it anew).
    // Each buffer's slots were laid from its start: what they take ends at what it used.
    held = 0;
    for (std::size_t b = 0; b < buffers_.size(); ++b) {
      buffers_[b].trim(kept_used[b]);
      held += buffers_[b].size();
    }
  }
  if (rest_bytes > 0 && held + rest_bytes > most) {
    // Laid out over what is held, the slots would waste too much of it: all of them anew.
    buffers_.clear();
    rest = order;
    rest_bytes = total;
  }
  if (rest_bytes > 0) {
    // The headroom only while what is held stays within the bound.
    const std::size_t more = headroom && held + rest_bytes + total / kSlackDivisor <= most ? total / kSlackDivisor : 0;
    HostBuffer buffer(rest_bytes + more, pinned_, &staging_memory());
    if (!buffer.valid()) {
      clear_locked();
      return {ErrorCode::no_space, "cannot allocate " + std::to_string(rest_bytes + more) + " bytes of host staging memory"};
    }
    if (touch_threads > 0) touch_pages(buffer.data(), buffer.size(), touch_threads);
    std::size_t at = 0;
    for (std::size_t j : rest) {
      starts_[j] = buffer.data() + at;
      at += footprint(sizes[j]);
    }
    buffers_.push_back(std::move(buffer));
  }
  held = 0;
  for (const auto& b : buffers_) held += b.size();
  bytes_.store(held, std::memory_order_relaxed);
  return Status::ok();
}

HostBuffer BlockPool::take() {
  {
    std::lock_guard lock(mutex_);
    if (!free_.empty()) {
      HostBuffer block = std::move(free_.back());
      free_.pop_back();
      return block;
    }
  }
  return HostBuffer(block_bytes_, false, &staging_memory());
}

void BlockPool::give_back(HostBuffer block) {
  std::lock_guard lock(mutex_);
  free_.push_back(std::move(block));
}

std::size_t BlockPool::bytes() const {
  std::lock_guard lock(mutex_);
  return free_.size() * block_bytes_;
}

void BlockPool::release_all() {
  std::lock_guard lock(mutex_);
  free_.clear();
}

void StagingPool::clear_locked() {
  buffers_.clear();
  sizes_.clear();
  starts_.clear();
  free_.clear();
  bytes_.store(0, std::memory_order_relaxed);
}

bool StagingPool::take_locked(std::size_t bytes, std::size_t& slot) {
  bool found = false;
  for (std::size_t j = 0; j < sizes_.size(); ++j) {
    if (free_[j] && sizes_[j] >= bytes && (!found || sizes_[j] < sizes_[slot])) {
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
  for (std::size_t s : sizes_) largest = std::max(largest, s);
  return largest;
}

void StagingPool::release_all() {
  std::lock_guard<std::mutex> lock(mutex_);
  clear_locked();
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
      // The staged bytes are read next by the writer, after the whole snapshot: past the caches.
      stream_copy(dst + (from - begin), src, bytes);
      continue;
    }
    on_device = true;
    Status copied = engine.copy_async(stream, CopyKind::device_to_host, dst + (from - begin), src, bytes);
    if (!copied.is_ok()) return copied.with_context("staging '" + state.tensors[item.tensor_index].desc.chunk_key() + "'");
  }
  if (!on_device) return Status::ok();
  auto event = engine.record(stream);
  Status st = event.is_ok() ? engine.wait(*event) : event.status();
  if (!st.is_ok()) return st.with_context("staging bucket bytes " + std::to_string(begin) + "-" + std::to_string(end));
  return engine.check_readable(dst, static_cast<std::size_t>(end - begin));
}

}  // namespace stagehand
