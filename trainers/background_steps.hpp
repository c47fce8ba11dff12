#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "stagehand/core/priority.hpp"
#include "stagehand/core/status.hpp"

namespace stagehand {

/// What the jobs of one BackgroundSteps share with the trainer: the request to stop, which a
/// job asks between the pieces of its work (`piece()`), and the count of pieces asked so far,
/// by which a waiting trainer tells a job that moves from one that hangs (a file system that no
/// longer answers).
class JobControl {
 public:
  /// @param signal also asks the jobs to stop when it turns true (a signal's flag); it must
  ///     outlive every job, a job left running included (BackgroundSteps::stop).
  explicit JobControl(const std::atomic<bool>* signal) : signal_(signal) {}
  /// Called by a job before each piece of its work: counts it.
  /// @return whether the job is to stop.
  bool piece() {
    pieces_.fetch_add(1, std::memory_order_relaxed);
    return stopping();
  }
  bool stopping() const { return stop_.load() || (signal_ != nullptr && signal_->load()); }
  void stop() { stop_.store(true); }
  std::uint64_t pieces() const { return pieces_.load(std::memory_order_relaxed); }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<std::uint64_t> pieces_{0};
  const std::atomic<bool>* const signal_;
};

/// Work on committed checkpoints that no training step waits for: the periodic Hugging Face
/// exports (trainer.export_interval) and the copies of the local tier into the durable one
/// (trainer.local_ckpt_path). Jobs run one after another on a thread of their own, at lowered
/// CPU and I/O priority; each reads its checkpoint and writes elsewhere (`work` says how), and a
/// failed one leaves its checkpoint as it is. `Report` is what a job says it did.
///
/// No wait here is without a limit: a job that hangs (a write to a file system that no longer
/// answers) is found by its lack of progress (wait_idle) and left behind by stop(), so that the
/// run can end; what its work captured stays alive until it ends.
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
  /// `out_dir`, fills the report; calls `control.piece()` before each piece of its work and
  /// stops (failing as aborted) when it says so. It must own what it uses (a job may outlive
  /// this object: stop()).
  using Work = std::function<Status(std::int64_t step, const std::string& checkpoint_dir, const std::string& out_dir,
                                    JobControl& control, Report& report)>;

  /// What stop() did.
  struct Stopped {
    /// The steps of the queued jobs it dropped.
    std::vector<std::int64_t> dropped;
    /// The step of a job that did not end within the limit and was left running; -1: none.
    std::int64_t left_running = -1;
  };

  /// @param what names the work in the error of a job that throws ("the export").
  /// @param signal a flag that also stops the jobs (JobControl); null for none.
  BackgroundSteps(std::string what, Work work, const std::atomic<bool>* signal = nullptr)
      : state_(std::make_shared<State>(std::move(what), std::move(work), signal)),
        thread_([state = state_] { run(*state); }) {}
  /// Finishes the job running now (unless stop() left it running); queued ones are dropped.
  ~BackgroundSteps() {
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      state_->stopping = true;
      state_->queue.clear();
    }
    state_->changed.notify_all();
    if (left_running_) {
      thread_.detach();
    } else {
      thread_.join();
    }
  }
  BackgroundSteps(const BackgroundSteps&) = delete;
  BackgroundSteps& operator=(const BackgroundSteps&) = delete;

  /// Queues the job of the committed checkpoint `checkpoint_dir` (step `step`) into `out_dir`.
  void enqueue(std::int64_t step, std::string checkpoint_dir, std::string out_dir) {
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      state_->queue.push_back({step, std::move(checkpoint_dir), std::move(out_dir)});
    }
    state_->changed.notify_all();
  }

  /// The jobs that ended since the last call, in order.
  std::vector<Done> take_done() {
    std::lock_guard<std::mutex> lock(state_->mutex);
    std::vector<Done> out;
    out.swap(state_->done);
    return out;
  }

  /// Waits until every queued job has ended, as long as they move: gives up once the running
  /// job (the same one) has asked for no piece for `still_limit` (none: never gives up, for jobs
  /// whose every call has a limit of its own). Then take_done() has every job that ended.
  /// @return the step of the job that stalled; none when every job ended.
  std::optional<std::int64_t> wait_idle(std::optional<std::chrono::milliseconds> still_limit) {
    State& s = *state_;
    const auto poll = std::min<std::chrono::milliseconds>(still_limit.value_or(std::chrono::milliseconds(100)),
                                                          std::chrono::milliseconds(100));
    std::unique_lock<std::mutex> lock(s.mutex);
    std::uint64_t pieces = s.control.pieces();
    std::int64_t job = s.running;
    auto since = std::chrono::steady_clock::now();
    for (;;) {
      if (s.changed.wait_for(lock, poll, [&s] { return s.queue.empty() && s.running < 0; })) return std::nullopt;
      const auto now = std::chrono::steady_clock::now();
      if (s.control.pieces() != pieces || s.running != job) {
        pieces = s.control.pieces();
        job = s.running;
        since = now;
      } else if (still_limit && job >= 0 && now - since >= *still_limit) {
        stalled_ = Stalled{job, pieces};
        return job;
      }
    }
  }

  /// Stops: drops the queued jobs (their checkpoints still owe them), asks the running one to
  /// stop at its next piece, and waits for it at most `limit` (none: as long as it takes, for
  /// jobs whose every call has a limit of its own; not at all for a job wait_idle found stalled
  /// that has not moved since). One still running then is left to end on its own
  /// thread (a hung write): this object no longer waits for it, its destructor included. Then
  /// take_done() has every job that ended; nothing queued after it runs.
  Stopped stop(std::optional<std::chrono::milliseconds> limit) {
    Stopped out;
    out.dropped = request_stop();
    State& s = *state_;
    std::unique_lock<std::mutex> lock(s.mutex);
    if (stalled_ && stalled_->step == s.running && stalled_->pieces == s.control.pieces()) {
      limit = std::chrono::milliseconds(0);
    }
    const auto ended = [&s] { return s.running < 0; };
    if (!limit) {
      s.changed.wait(lock, ended);
    } else if (!s.changed.wait_for(lock, *limit, ended)) {
      out.left_running = s.running;
      left_running_ = true;
    }
    return out;
  }

  /// stop()'s first half, without the wait: drops the queued jobs and asks the running one to
  /// stop (so that several BackgroundSteps stop at once).
  /// @return the steps of the jobs dropped.
  std::vector<std::int64_t> request_stop() {
    State& s = *state_;
    std::vector<std::int64_t> dropped;
    {
      std::lock_guard<std::mutex> lock(s.mutex);
      s.stopping = true;
      s.control.stop();
      for (const auto& job : s.queue) dropped.push_back(job.step);
      s.queue.clear();
    }
    s.changed.notify_all();
    return dropped;
  }

  /// Whether the jobs are to stop (stop(), or the signal).
  bool stopping() const { return state_->control.stopping(); }

  /// Drops the queued jobs (not the one running) of steps before `step`, for work that a newer
  /// step's job makes of no use (a copy into the durable tier).
  /// @return their steps.
  std::vector<std::int64_t> drop_queued_before(std::int64_t step) {
    std::lock_guard<std::mutex> lock(state_->mutex);
    std::vector<std::int64_t> dropped;
    auto& queue = state_->queue;
    for (auto it = queue.begin(); it != queue.end();) {
      if (it->step < step) {
        dropped.push_back(it->step);
        it = queue.erase(it);
      } else {
        ++it;
      }
    }
    return dropped;
  }

  /// Steps whose checkpoints are queued or being worked on: retention must keep them.
  std::set<std::int64_t> steps_in_use() const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    std::set<std::int64_t> steps;
    for (const auto& job : state_->queue) steps.insert(job.step);
    if (state_->running >= 0) steps.insert(state_->running);
    return steps;
  }

 private:
  struct Job {
    std::int64_t step;
    std::string checkpoint_dir;
    std::string out_dir;
  };

  /// What the thread uses, shared with it: a job left running keeps it alive.
  struct State {
    State(std::string what_, Work work_, const std::atomic<bool>* signal)
        : what(std::move(what_)), work(std::move(work_)), control(signal) {}
    const std::string what;
    const Work work;
    JobControl control;
    std::mutex mutex;
    std::condition_variable changed;
    std::deque<Job> queue;
    /// The step being worked on now, -1 when none.
    std::int64_t running = -1;
    std::vector<Done> done;
    bool stopping = false;
  };

  static void run(State& s) {
    // A hint: a job that cannot lower its priority still runs.
    (void)lower_current_thread_priority();
    std::unique_lock<std::mutex> lock(s.mutex);
    for (;;) {
      s.changed.wait(lock, [&s] { return s.stopping || !s.queue.empty(); });
      if (s.stopping) return;
      Job job = std::move(s.queue.front());
      s.queue.pop_front();
      s.running = job.step;
      lock.unlock();
      Done done{job.step, job.out_dir, Status::ok(), {}};
      try {
        done.status = s.work(job.step, job.checkpoint_dir, job.out_dir, s.control, done.report);
      } catch (const std::exception& e) {
        done.status = Status{ErrorCode::internal, s.what + " stopped on an exception: " + e.what()};
      }
      lock.lock();
      s.running = -1;
      s.done.push_back(std::move(done));
      s.changed.notify_all();
    }
  }

  std::shared_ptr<State> state_;
  /// The job wait_idle last found stalled, and its pieces then.
  struct Stalled {
    std::int64_t step;
    std::uint64_t pieces;
  };
  std::optional<Stalled> stalled_;
  /// stop() left a job running: the destructor does not wait for it.
  bool left_running_ = false;
  std::thread thread_;
};

}  // namespace stagehand
