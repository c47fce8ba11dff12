#pragma once

#include <atomic>
#include <caf/fwd.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "stagehand/storage/file_system.hpp"
#include "stagehand/actors/protocol.hpp"
#include "stagehand/config/config.hpp"
#include "stagehand/core/status.hpp"
#include "stagehand/checkpoint/sync/weight_channel.hpp"
#include "stagehand/models/weight_store.hpp"

namespace stagehand {

struct TrainerOptions {
  Config config;
  /// One JSON line per step and per committed save; empty for none.
  std::string metrics_out;
  /// Print progress to stdout.
  bool progress = true;
  /// Set by SIGTERM/SIGINT: save the last completed step, drain, stop. Read by the exports and
  /// uploads too, so it must outlive any the run leaves behind (a global, as stagehand-train's).
  const std::atomic<bool>* stop_requested = nullptr;
  /// Where the Workers publish weights for the fully-async trainer's generators
  /// (weight_sync.transport collective); null otherwise.
  std::shared_ptr<WeightStore> weights;
  /// The weight-sync channel the Workers push to (weight_sync.transport shm: a name, tcp:
  /// "tcp://HOST:PORT"): the weight_sync.channel, or the run's own for the fully-async trainer's
  /// generators; empty for none.
  std::string weight_channel;
  /// What ckpt_path, resume_path, init_from and export_path are on.
  std::shared_ptr<FileSystem> file_system;
};

/// The channel options of `weight_sync` (connect waits: half of `call_timeout`).
WeightChannelOptions weight_channel_options(const WeightSyncConfig& weight_sync, std::chrono::milliseconds call_timeout);

/// What a trainer did, for the summary and the exit code.
struct TrainerSummary {
  Status status;
  std::int64_t first_step = 0;
  std::int64_t last_step = 0;
  std::int64_t checkpoints_committed = 0;
  double total_stall_s = 0;
  /// Seconds training waited at the fence for saves staging in the background (the longest
  /// rank's wait, summed over steps).
  double total_fence_wait_s = 0;
  double last_accuracy = 0;
  /// Periodic exports (trainer.export_interval) that were written, and that failed.
  std::int64_t exports_done = 0;
  std::int64_t exports_failed = 0;
  /// With a local tier: copies into the durable tier that landed, and that failed; the step the
  /// durable tier's tracker names at the end (-1: none).
  std::int64_t uploads_done = 0;
  std::int64_t uploads_failed = 0;
  /// An export or upload was left behind, still in a call that did not return (a file system
  /// that does not answer): the process should end without its static destructors, which
  /// that job's thread may still need (stagehand-train leaves with std::_Exit).
  bool work_left_behind = false;
  std::int64_t durable_step = -1;
  bool stopped_by_signal = false;
  /// After a signal: the step saved on it (the last one trained); -1 when none was trained.
  std::int64_t signal_save_step = -1;
  /// After a signal and a failure: the step the tracker names (the newest committed checkpoint);
  /// none when there is no tracker or it cannot be read.
  std::optional<std::int64_t> tracked_step;
  std::string latest_checkpoint;
  /// The exclusive lock on a local ckpt_path, taken before anything is cleaned or saved. It lives
  /// as long as this summary, so that a finalize after the trainer ended (teardown), which may
  /// still commit a save, runs under it.
  std::unique_ptr<FileLock> root_lock;
  /// With a local tier, the lock on a local durable ckpt_path, as root_lock.
  std::unique_ptr<FileLock> durable_lock;
};

/// Spawns the trainer named by `options.config.trainer.kind` (SyncTrainer: GRPO-style RL;
/// FullyAsyncTrainer: the same objective with actions sampled by generator actors from weights at
/// most `fully_async.max_staleness_steps` behind; SftTrainer: supervised) as an actor that drives `dispatch`: resume, train, save on the
/// checkpoint policy, finalize at the end. It fills `*summary` and exits.
/// @return an error for a kind that cannot be run.
Result<caf::actor> spawn_trainer(caf::actor_system& system, dispatch_actor dispatch, TrainerOptions options,
                                 std::shared_ptr<TrainerSummary> summary);

}  // namespace stagehand
