#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace stagehand {

/// Counts live bytes of one kind of host allocation and their high-water mark.
///
/// Thread-safety: every member may be called from any thread concurrently.
class MemoryCounter {
 public:
  void add(std::size_t bytes);
  void sub(std::size_t bytes);
  std::size_t current() const { return current_.load(std::memory_order_relaxed); }
  std::size_t peak() const { return peak_.load(std::memory_order_relaxed); }
  /// Restarts the high-water mark from the current value.
  void reset_peak() { peak_.store(current(), std::memory_order_relaxed); }

 private:
  std::atomic<std::size_t> current_{0};
  std::atomic<std::size_t> peak_{0};
};

/// Every checkpoint staging buffer of the process is charged here.
MemoryCounter& staging_memory();

/// A host allocation of an exact size, 4096-byte aligned, pinned on request, charged to a counter.
///
/// Thread-safety: a HostBuffer is owned by one thread at a time; moving transfers ownership.
class HostBuffer {
 public:
  HostBuffer() = default;
  /// Allocates `bytes`; check `valid()` (allocation can fail for large sizes).
  HostBuffer(std::size_t bytes, bool pinned, MemoryCounter* counter);
  ~HostBuffer();
  HostBuffer(HostBuffer&& other) noexcept;
  HostBuffer& operator=(HostBuffer&& other) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  bool valid() const { return data_ != nullptr; }
  std::uint8_t* data() { return data_; }
  const std::uint8_t* data() const { return data_; }
  std::size_t size() const { return size_; }
  /// Gives the pages past the first `bytes` (rounded up to a page) back to the system and
  /// charges only `bytes` from then on, keeping the first `bytes` where they are: a smaller
  /// buffer without a new allocation, whose pages would be faulted in again. Not for pinned
  /// memory (false, nothing done).
  /// @pre bytes <= size()
  bool trim(std::size_t bytes);

 private:
  void release();

  std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
  bool pinned_ = false;
  MemoryCounter* counter_ = nullptr;
};

}  // namespace stagehand
