#include "stagehand/trainers/background_export.hpp"

#include <exception>

#include "stagehand/core/priority.hpp"

namespace stagehand {

BackgroundExports::BackgroundExports(ExportOptions options, std::shared_ptr<FileSystem> fs)
    : options_(std::move(options)), fs_(std::move(fs)), thread_([this] { run(); }) {}

BackgroundExports::~BackgroundExports() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    queue_.clear();
  }
  changed_.notify_all();
  thread_.join();
}

void BackgroundExports::enqueue(std::int64_t step, std::string checkpoint_dir, std::string out_dir) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back({step, std::move(checkpoint_dir), std::move(out_dir)});
  }
  changed_.notify_all();
}

std::vector<BackgroundExports::Done> BackgroundExports::take_done() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Done> out;
  out.swap(done_);
  return out;
}

void BackgroundExports::wait_idle() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [this] { return queue_.empty() && running_ < 0; });
}

void BackgroundExports::drop_queued() {
  std::unique_lock<std::mutex> lock(mutex_);
  queue_.clear();
  changed_.wait(lock, [this] { return running_ < 0; });
}

std::set<std::int64_t> BackgroundExports::steps_in_use() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::set<std::int64_t> steps;
  for (const auto& job : queue_) steps.insert(job.step);
  if (running_ >= 0) steps.insert(running_);
  return steps;
}

void BackgroundExports::run() {
  // A hint: an export that cannot lower its priority still runs.
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
      done.status = export_checkpoint(*fs_, job.checkpoint_dir, job.out_dir, options_, &done.report);
    } catch (const std::exception& e) {
      done.status = Status{ErrorCode::internal, std::string("the export stopped on an exception: ") + e.what()};
    }
    lock.lock();
    running_ = -1;
    done_.push_back(std::move(done));
    changed_.notify_all();
  }
}

}  // namespace stagehand
