#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "stagehand/checkpoint/save/report.hpp"

namespace stagehand {

/// The persistent queue of a rank's background checkpoint writes. Created once per strategy;
/// its thread lives until destruction and runs scheduled calls one after another.
///
/// Thread-safety: schedule(), drain(), take_finished() and pending() may be called from any
/// thread. Each call's result is handed out exactly once, by drain() or take_finished(). The
/// destructor runs every scheduled call to its end.
class AsyncCallsQueue {
 public:
  using Call = std::function<RankSaveReport()>;
  /// Invoked on the queue's thread right after a call finished.
  using OnFinished = std::function<void(std::int64_t call_id)>;

  explicit AsyncCallsQueue(OnFinished on_finished = {});
  ~AsyncCallsQueue();
  AsyncCallsQueue(const AsyncCallsQueue&) = delete;
  AsyncCallsQueue& operator=(const AsyncCallsQueue&) = delete;

  /// Queues `call`; returns its id.
  std::int64_t schedule(Call call);

  /// Blocks until every scheduled call has finished; returns the results not yet handed out.
  std::vector<RankSaveReport> drain();

  /// Results of calls finished so far and not yet handed out; never blocks.
  std::vector<RankSaveReport> take_finished();

  /// Calls scheduled and not yet finished.
  int pending() const;

 private:
  void run();

  OnFinished on_finished_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::pair<std::int64_t, Call>> calls_;
  std::vector<RankSaveReport> finished_;
  std::int64_t next_id_ = 0;
  int running_ = 0;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace stagehand
