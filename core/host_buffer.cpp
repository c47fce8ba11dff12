#include "stagehand/core/host_buffer.hpp"

#include <sys/mman.h>

#include <utility>

#include "stagehand/core/device.hpp"

namespace stagehand {

void MemoryCounter::add(std::size_t bytes) {
  std::size_t now = current_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  std::size_t seen = peak_.load(std::memory_order_relaxed);
  while (now > seen && !peak_.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
  }
}

void MemoryCounter::sub(std::size_t bytes) { current_.fetch_sub(bytes, std::memory_order_relaxed); }

MemoryCounter& staging_memory() {
  static MemoryCounter counter;
  return counter;
}

HostBuffer::HostBuffer(std::size_t bytes, bool pinned, MemoryCounter* counter)
    : data_(static_cast<std::uint8_t*>(host_alloc(bytes, pinned))),
      size_(bytes),
      pinned_(pinned),
      counter_(counter) {
  if (data_ == nullptr) {
    size_ = 0;
  } else if (counter_ != nullptr) {
    counter_->add(size_);
  }
}

HostBuffer::~HostBuffer() { release(); }

HostBuffer::HostBuffer(HostBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      pinned_(other.pinned_),
      counter_(other.counter_) {}

HostBuffer& HostBuffer::operator=(HostBuffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    pinned_ = other.pinned_;
    counter_ = other.counter_;
  }
  return *this;
}

bool HostBuffer::trim(std::size_t bytes) {
  if (pinned_ || data_ == nullptr || bytes >= size_) return !pinned_;
  constexpr std::size_t kPage = 4096;
  const std::size_t keep = (bytes + kPage - 1) / kPage * kPage;
  // The block stays allocated (freed whole later); its pages past `keep` go back to the system.
  if (keep < size_) ::madvise(data_ + keep, size_ - keep, MADV_DONTNEED);
  if (counter_ != nullptr) counter_->sub(size_ - bytes);
  size_ = bytes;
  return true;
}

void HostBuffer::release() {
  if (data_ == nullptr) return;
  host_free(data_, pinned_);
  if (counter_ != nullptr) counter_->sub(size_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace stagehand
