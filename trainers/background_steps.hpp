#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "stagehand/core/priority.hpp"
#include "stagehand/core/status.hpp"

namespace stagehand {

/// Work on committed checkpoints that no training step waits for: the periodic Hugging Face
/// exports (trainer.export_interval) and the copies of the local tier into the durable one
/// (trainer.local_ckpt_path). Jobs run one after another on a thread of their own, at lowered
/// CPU and I/O priority; each reads its checkpoint and writes elsewhere (`work` says how), and a
/// failed one leaves its checkpoint as it is. `Report` is what a job says it did.
///
/// Thread-safety: every method is called from the trainer's thread; the background thread only
/// runs the queued jobs.
template <class Report>
class BackgroundSteps {
 public:
  /// One job, done or failed.
  struct Done {
    std::int64_t step = 0;
    std::string out_dir;
    Status status;
    Report report;
  };
  /// Does one job: reads the committed checkpoint `checkpoint_dir` (step `step`), writes
  /// `out_dir`, fills the report.
  using Work = std::function<Status(std::int64_t step, const std::string& checkpoint_dir, const std::string& out_dir,
                                    Report& report)>;

  /// @param what names the work in the error of a job that throws ("the export").
  BackgroundSteps(std::string what, Work work)
      : what_(std::move(what)), work_(std::move(work)), thread_([this] { run(); }) {}
  /// Finishes the job running now; queued ones are dropped.
  ~BackgroundSteps() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
      queue_.clear();
    }
    changed_.notify_all();
    thread_.join();
  }
  BackgroundSteps(const BackgroundSteps&) = delete;
  BackgroundSteps& operator=(const BackgroundSteps&) = delete;

  /// Queues the job of the committed checkpoint `checkpoint_dir` (step `step`) into `out_dir`.
  void enqueue(std::int64_t step, std::string checkpoint_dir, std::string out_dir) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back({step, std::move(checkpoint_dir), std::move(out_dir)});
    }
    changed_.notify_all();
  }

  /// The jobs that ended since the last call, in order.
  std::vector<Done> take_done() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<Done> out;
    out.swap(done_);
    return out;
  }

  /// Waits until every queued job has ended; then take_done() has them all.
  void wait_idle() {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [this] { return queue_.empty() && running_ < 0; });
  }

  /// Drops the queued jobs (their checkpoints still owe them) and waits for the one running now
  /// to end; then take_done() has every job that ran.
  /// @return the steps of the jobs dropped.
  std::vector<std::int64_t> drop_queued() {
    std::unique_lock<std::mutex> lock(mutex_);
    std::vector<std::int64_t> dropped;
    for (const auto& job : queue_) dropped.push_back(job.step);
    queue_.clear();
    changed_.wait(lock, [this] { return running_ < 0; });
    return dropped;
  }

  /// Drops the queued jobs (not the one running) of steps before `step`, for work that a newer
  /// step's job makes of no use (a copy into the durable tier).
  /// @return their steps.
  std::vector<std::int64_t> drop_queued_before(std::int64_t step) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::int64_t> dropped;
    for (auto it = queue_.begin(); it != queue_.end();) {
      if (it->step < step) {
        dropped.push_back(it->step);
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
    return dropped;
  }

  /// Steps whose checkpoints are queued or being worked on: retention must keep them.
  std::set<std::int64_t> steps_in_use() const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::set<std::int64_t> steps;
    for (const auto& job : queue_) steps.insert(job.step);
    if (running_ >= 0) steps.insert(running_);
    return steps;
  }

 private:
  struct Job {
    std::int64_t step;
    std::string checkpoint_dir;
    std::string out_dir;
  };

  void run() {
    // A hint: a job that cannot lower its priority still runs.
    (void)lower_current_thread_priority();
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      changed_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      Job job = std::move(queue_.front());
      queue_.pop_front();
      running_ = job.step;
      lock.unlock();
      Done done{job.step, job.out_dir, Status::ok(), {}};
      try {
        done.status = work_(job.step, job.checkpoint_dir, job.out_dir, done.report);
      } catch (const std::exception& e) {
        done.status = Status{ErrorCode::internal, what_ + " stopped on an exception: " + e.what()};
      }
      lock.lock();
      running_ = -1;
      done_.push_back(std::move(done));
      changed_.notify_all();
    }
  }

  const std::string what_;
  const Work work_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Job> queue_;
  /// The step being worked on now, -1 when none.
  std::int64_t running_ = -1;
  std::vector<Done> done_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace stagehand
