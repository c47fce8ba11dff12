#pragma once

#include <atomic>
#include <caf/fwd.hpp>
#include <cstdint>
#include <memory>
#include <string>

#include "stagehand/config/config.hpp"
#include "stagehand/core/status.hpp"
#include "stagehand/models/weight_store.hpp"

namespace stagehand {

struct TrainerOptions {
  Config config;
  /// One JSON line per step and per committed save; empty for none.
  std::string metrics_out;
  /// Print progress to stdout.
  bool progress = true;
  /// Set by SIGTERM/SIGINT: save the last completed step, drain, stop.
  const std::atomic<bool>* stop_requested = nullptr;
  /// Where the Workers publish weights for the fully-async trainer's generators.
  std::shared_ptr<WeightStore> weights;
};

/// What a trainer did, for the summary and the exit code.
struct TrainerSummary {
  Status status;
  std::int64_t first_step = 0;
  std::int64_t last_step = 0;
  std::int64_t checkpoints_committed = 0;
  double total_stall_s = 0;
  double last_accuracy = 0;
  bool stopped_by_signal = false;
  std::int64_t signal_save_step = -1;
  std::string latest_checkpoint;
};

/// Spawns the trainer named by `options.config.trainer.kind` (SyncTrainer: GRPO-style RL;
/// FullyAsyncTrainer: the same objective with actions sampled by generator actors from weights at
/// most `fully_async.max_staleness_steps` behind; SftTrainer: supervised) as an actor that drives `dispatch`: resume, train, save on the
/// checkpoint policy, finalize at the end. It fills `*summary` and exits.
/// @return an error for a kind that cannot be run.
Result<caf::actor> spawn_trainer(caf::actor_system& system, caf::actor dispatch, TrainerOptions options,
                                 std::shared_ptr<TrainerSummary> summary);

}  // namespace stagehand
