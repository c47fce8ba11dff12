// The trainers that differ only in their objective, and the one entry point for all.
#include "stagehand/trainers/trainer.hpp"

#include <caf/all.hpp>

#include "stagehand/trainers/fully_async_trainer.hpp"
#include "stagehand/trainers/trainer_base.hpp"

namespace stagehand {

namespace {

/// GRPO-style RL: a group of sampled actions per context, group-normalized advantages.
class SyncTrainer final : public TrainerBase {
 public:
  using TrainerBase::TrainerBase;

 protected:
  Objective objective() const override { return Objective::rl; }
  const char* name() const override { return "sync"; }
};

/// Supervised cross-entropy on the rewarding arm.
class SftTrainer final : public TrainerBase {
 public:
  using TrainerBase::TrainerBase;

 protected:
  Objective objective() const override { return Objective::sft; }
  const char* name() const override { return "sft"; }
};

}  // namespace

Result<caf::actor> spawn_trainer(caf::actor_system& system, dispatch_actor dispatch, TrainerOptions options,
                                 std::shared_ptr<TrainerSummary> summary) {
  switch (options.config.trainer.kind) {
    case TrainerKind::sync:
      return system.spawn<SyncTrainer>(std::move(dispatch), std::move(options), std::move(summary));
    case TrainerKind::sft:
      return system.spawn<SftTrainer>(std::move(dispatch), std::move(options), std::move(summary));
    case TrainerKind::fully_async:
      return spawn_fully_async_trainer(system, std::move(dispatch), std::move(options), std::move(summary));
  }
  return Status{ErrorCode::invalid_argument, "unknown trainer.kind"};
}

WeightChannelOptions weight_channel_options(const WeightSyncConfig& weight_sync, std::chrono::milliseconds call_timeout) {
  WeightChannelOptions options;
  options.bucket_bytes = static_cast<std::uint64_t>(weight_sync.bucket_mib) << 20;
  options.receiver_timeout = std::chrono::seconds(weight_sync.receiver_timeout_s);
  // Within the export call that creates a publisher, which waits this long for the other ranks.
  options.connect_timeout = call_timeout / 2;
  return options;
}

}  // namespace stagehand
