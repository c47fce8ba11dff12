#include "stagehand/strategy/async_calls_queue.hpp"

namespace stagehand {

AsyncCallsQueue::AsyncCallsQueue(OnFinished on_finished)
    : on_finished_(std::move(on_finished)), thread_([this] { run(); }) {}

AsyncCallsQueue::~AsyncCallsQueue() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::int64_t AsyncCallsQueue::schedule(Call call) {
  std::int64_t id = 0;
  {
    std::lock_guard lock(mutex_);
    id = next_id_++;
    calls_.emplace_back(id, std::move(call));
  }
  cv_.notify_all();
  return id;
}

std::vector<RankSaveReport> AsyncCallsQueue::drain() {
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [this] { return calls_.empty() && running_ == 0; });
  return std::exchange(finished_, {});
}

std::vector<RankSaveReport> AsyncCallsQueue::take_finished() {
  std::lock_guard lock(mutex_);
  return std::exchange(finished_, {});
}

int AsyncCallsQueue::pending() const {
  std::lock_guard lock(mutex_);
  return static_cast<int>(calls_.size()) + running_;
}

void AsyncCallsQueue::run() {
  for (;;) {
    std::pair<std::int64_t, Call> next;
    {
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [this] { return stopping_ || !calls_.empty(); });
      if (calls_.empty()) return;
      next = std::move(calls_.front());
      calls_.pop_front();
      ++running_;
    }
    RankSaveReport report = next.second();
    {
      std::lock_guard lock(mutex_);
      finished_.push_back(std::move(report));
      --running_;
    }
    cv_.notify_all();
    if (on_finished_) on_finished_(next.first);
  }
}

}  // namespace stagehand
