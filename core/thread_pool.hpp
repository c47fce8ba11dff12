#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

namespace stagehand {

/// A fixed set of threads, created once and kept until destruction, that run submitted tasks in
/// submission order.
///
/// Thread-safety: submit() may be called from any thread. The destructor finishes every task
/// already submitted, then joins.
class ThreadPool {
 public:
  /// @param on_start runs once in each thread before its first task (e.g. to lower priority).
  explicit ThreadPool(int threads, std::function<void()> on_start = {});
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  std::future<void> submit(std::function<void()> task);

 private:
  void run();

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<void()>> tasks_;
  bool stopping_ = false;
  std::function<void()> on_start_;
  std::vector<std::thread> threads_;
};

}  // namespace stagehand
