#include "stagehand/core/staging_fence.hpp"

#include <chrono>

namespace stagehand {

void StagingFence::close() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++readers_;
}

void StagingFence::open() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (readers_ > 0) --readers_;
  }
  cv_.notify_all();
}

double StagingFence::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (readers_ == 0) return 0;
  const auto start = std::chrono::steady_clock::now();
  ++waiters_;
  cv_.notify_all();
  cv_.wait(lock, [this] { return readers_ == 0; });
  --waiters_;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

bool StagingFence::wait_for_waiter(std::chrono::milliseconds at_most) {
  std::unique_lock<std::mutex> lock(mutex_);
  return cv_.wait_for(lock, at_most, [this] { return waiters_ > 0; });
}

bool StagingFence::is_open() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return readers_ == 0;
}

}  // namespace stagehand
