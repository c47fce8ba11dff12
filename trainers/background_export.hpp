#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "stagehand/checkpoint/export.hpp"
#include "stagehand/core/status.hpp"
#include "stagehand/storage/file_system.hpp"

namespace stagehand {

/// The periodic Hugging Face exports of a run (trainer.export_interval): committed checkpoints
/// exported one after another on a thread of their own, at lowered CPU and I/O priority, so that
/// no training step waits for one. An export only reads its checkpoint; a failed one leaves the
/// checkpoint as it is and its partial output is removed (export_checkpoint).
///
/// Thread-safety: every method is called from the trainer's thread; the export thread only runs
/// the queued exports.
class BackgroundExports {
 public:
  /// One export, done or failed.
  struct Done {
    std::int64_t step = 0;
    std::string out_dir;
    Status status;
    ExportReport report;
  };

  BackgroundExports(ExportOptions options, std::shared_ptr<FileSystem> fs);
  /// Finishes the export running now; queued ones are dropped.
  ~BackgroundExports();
  BackgroundExports(const BackgroundExports&) = delete;
  BackgroundExports& operator=(const BackgroundExports&) = delete;

  /// Queues the export of the committed checkpoint `checkpoint_dir` (step `step`) into `out_dir`.
  void enqueue(std::int64_t step, std::string checkpoint_dir, std::string out_dir);

  /// The exports that ended since the last call, in order.
  std::vector<Done> take_done();

  /// Waits until every queued export has ended; then take_done() has them all.
  void wait_idle();

  /// Drops the queued exports (their checkpoints still owe them) and waits for the one running
  /// now to end; then take_done() has every export that ran.
  void drop_queued();

  /// Steps whose checkpoints are queued or being exported: retention must keep them.
  std::set<std::int64_t> steps_in_use() const;

 private:
  struct Job {
    std::int64_t step;
    std::string checkpoint_dir;
    std::string out_dir;
  };
  void run();

  const ExportOptions options_;
  const std::shared_ptr<FileSystem> fs_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Job> queue_;
  /// The step being exported now, -1 when none.
  std::int64_t running_ = -1;
  std::vector<Done> done_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace stagehand
