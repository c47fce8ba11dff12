#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "stagehand/checkpoint/planner.hpp"
#include "stagehand/checkpoint/report.hpp"
#include "stagehand/checkpoint/stager.hpp"
#include "stagehand/core/sharded_tensor.hpp"
#include "stagehand/core/thread_pool.hpp"
#include "stagehand/storage/local_files.hpp"

namespace stagehand {

struct SaveEngineOptions {
  /// Buckets per rank, and writer threads.
  int thread_count = 2;
  /// Buckets staged per wave; 0 stages all buckets in one wave.
  int staging_buckets = 0;
  /// Pin the staging buffers (when the state lives on a GPU).
  bool pinned = false;
  /// Runs once in every writer thread before its first task.
  std::function<void()> writer_thread_start = nullptr;
  /// Free the staging buffers when a save's last bucket is written (ckpt_staging_memory:
  /// per_save); otherwise they are kept for the next save (persistent).
  bool release_after_save = false;
};

/// One rank's synchronous checkpoint writer: plans, stages in waves and writes bucket files.
/// Its writer threads and staging buffers are created once and reused by every save.
///
/// Thread-safety: one save at a time (the owner serializes calls).
class SaveEngine {
 public:
  /// Checks the options; errors name the bad option.
  static Result<std::unique_ptr<SaveEngine>> create(int rank, SaveEngineOptions options,
                                                    std::shared_ptr<StorageBackend> storage = local_storage());

  // -- properties --

  int rank() const { return rank_; }
  const SaveEngineOptions& options() const { return options_; }
  /// Bytes of host staging buffers held now; may be read from any thread.
  std::size_t staging_bytes() const { return staging_.bytes(); }
  /// Whether begin_async() leaves buckets to stage in the background (staging waves).
  /// @pre a plan was made (prepare, save or begin_async)
  bool stages_in_background() const { return plan_ && static_cast<std::size_t>(wave_size()) < plan_->buckets.size(); }

  // -- saving --

  /// The plan for `state`, made anew only when its structure changed.
  Result<const SavePlan*> plan_for(const StateDict& state);

  /// Plans `state` and, unless the buffers are freed after every save, allocates the staging
  /// buffers now, so that the first save does not pay for them (pinned allocations of gigabytes
  /// take about a second).
  Status prepare(const StateDict& state);

  /// Stages and writes every bucket of `state` into `policy_dir`, in waves of
  /// `staging_buckets`. The first error stops the waves after it.
  /// @post report.buckets holds one result per bucket attempted, in bucket order.
  RankSaveReport save(const StateDict& state, const std::string& policy_dir, std::int64_t step);

  /// Starts an async save of `state`: stages its first wave now (every bucket when
  /// staging_buckets is 0: the device-to-host copy), and its objects.
  Status begin_async(const StateDict& state);

  /// Finishes what begin_async() started, into `policy_dir`: writes the staged wave, then stages
  /// and writes each further wave from `state` as the slots free up. `on_all_staged` runs once,
  /// as soon as every bucket is staged (at once when staging_buckets is 0), or when the save ends
  /// early on an error; from then on the save never reads `state` again, so the state may be
  /// modified. May run on another thread than begin_async, never concurrently with another call
  /// on this engine.
  /// @pre the last begin_async() succeeded, with the same `state`, which is not modified before
  ///      `on_all_staged` runs
  RankSaveReport write_async(const StateDict& state, const std::string& policy_dir, std::int64_t step,
                             const std::function<void()>& on_all_staged);

 private:
  SaveEngine(int rank, SaveEngineOptions options, std::shared_ptr<StorageBackend> storage);

  int wave_size() const;
  RankSaveReport make_report(std::int64_t step) const;
  /// Runs `task(bucket, slot)` for buckets [first, last) on the writer threads, one each.
  std::vector<BucketWriteResult> run_wave(
      int first, int last, const std::function<BucketWriteResult(const PlannedBucket&, std::uint8_t*)>& task);
  BucketWriteResult stage_result(const PlannedBucket& bucket, const Status& staged) const;
  /// Opens the files of buckets [first, last), stages (when `state` is given) and writes each in
  /// `parts` runs of items on the writer threads, and takes each file's XXH3. The files stay open
  /// in `unsynced`. `on_staged` (when set) runs once every part of the wave is staged.
  std::vector<BucketWriteResult> write_wave(int first, int last, int parts, const StateDict* state,
                                            const std::string& policy_dir,
                                            std::vector<std::unique_ptr<WritableFile>>& unsynced,
                                            const std::function<void()>& on_staged = {});
  /// Stages (all but a first wave that begin_async staged) and writes every bucket in waves;
  /// `on_all_staged` as for write_async.
  RankSaveReport save_in_waves(const StateDict& state, bool first_wave_staged, const std::string& policy_dir,
                               std::int64_t step, const std::function<void()>& on_all_staged);
  std::string bucket_context(const PlannedBucket& bucket) const;
  /// fsyncs and closes every file still open, in parallel; the first error becomes the report's.
  void finish_all(RankSaveReport& report, std::vector<std::unique_ptr<WritableFile>>& unsynced);

  int rank_;
  SaveEngineOptions options_;
  std::shared_ptr<StorageBackend> storage_;
  std::optional<SavePlan> plan_;
  /// Objects of the state that begin_async() staged.
  std::map<std::string, std::string> staged_objects_;
  StagingPool staging_;
  ThreadPool writers_;
};

}  // namespace stagehand
