#include "stagehand/core/staging_fence.hpp"

#include <chrono>

namespace stagehand {

void StagingFence::close() {
  std::lock_guard<std::mutex> lock(mutex_);
  open_ = false;
}

void StagingFence::open() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    open_ = true;
  }
  cv_.notify_all();
}

double StagingFence::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (open_) return 0;
  const auto start = std::chrono::steady_clock::now();
  cv_.wait(lock, [this] { return open_; });
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

bool StagingFence::is_open() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return open_;
}

}  // namespace stagehand
