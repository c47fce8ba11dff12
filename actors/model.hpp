#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "stagehand/checkpoint/load/loader.hpp"
#include "stagehand/core/sharded_tensor.hpp"
#include "stagehand/core/staging_fence.hpp"
#include "stagehand/core/status.hpp"

namespace stagehand {

/// What a Worker saves and loads for one rank: the rank's checkpointable state, and a hook after
/// a load. Enough for a checkpoint-only user; a trainable model implements Model instead.
///
/// Thread-safety: called from its Worker's thread only. The state's tensors are read by the
/// rank's MegatronStrategy while a save copies or writes them.
class Checkpointable {
 public:
  virtual ~Checkpointable() = default;

  /// The rank's checkpointable state, shared with its MegatronStrategy. Small objects in it
  /// (RNG position, optimizer step) are kept current by the owner.
  virtual std::shared_ptr<StateDict> state() = 0;

  /// How a load of `scope` fills the state: the selection fields of LoadOptions (what it skips,
  /// which tensors it fills from a saved tensor of another name, which objects may be missing).
  /// The default follows Stagehand's naming conventions (load_selection_by_name).
  virtual LoadOptions load_selection(const LoadScope& scope) { return load_selection_by_name(*state(), scope); }

  /// Refreshes whatever is derived from the state after a checkpoint was loaded into it:
  /// `scope` is what the load took, `report` names what it could not find (optional objects,
  /// tensors of a non-strict load), which the model must re-derive or start afresh.
  virtual Status on_loaded(const LoadScope& scope, const LoadReport& report) {
    (void)scope;
    (void)report;
    return Status::ok();
  }

  /// Waits until no checkpoint save reads the state any more: call it before modifying a tensor
  /// of state(). An async save with staging waves (ckpt_save_staging_buckets > 0) returns before
  /// every bucket is staged and stages the rest from the live state in the background; otherwise
  /// this returns at once.
  /// @return the seconds waited.
  double fence() { return fence_ ? fence_->wait() : 0; }

  /// Whether no checkpoint save reads the state (fence() would return at once); may be asked
  /// from any thread.
  bool fence_open() const { return !fence_ || fence_->is_open(); }

  /// Called by the Worker that holds this, with the fence of its strategy.
  void attach_fence(std::shared_ptr<StagingFence> fence) { fence_ = std::move(fence); }

 private:
  std::shared_ptr<StagingFence> fence_;
};

/// A checkpointable holding nothing but `state`.
std::unique_ptr<Checkpointable> checkpointable_state(std::shared_ptr<StateDict> state);

/// What one training step optimizes.
enum class Objective { rl, sft };

/// Global (all-rank) figures of one training step.
struct StepMetrics {
  /// Mean reward of the sampled actions (RL).
  double reward = 0;
  /// Mean loss over the global batch.
  double loss = 0;
  /// Seconds this rank waited at the fence for a save's background staging.
  double fence_wait_s = 0;
};

/// One rank's share of a trainable model: what a Worker trains as well as checkpoints.
/// Stagehand's reference workload (models/) implements it; a user's own model can too.
///
/// Thread-safety: as Checkpointable; collectives inside a step synchronize with the other
/// ranks' Workers.
class Model : public Checkpointable {
 public:
  /// Trains step `step` (1-based) on this rank's part of the global batch. For RL,
  /// `behaviour_actions` holds the actions generators sampled for the whole global batch (group
  /// after group); empty means sample them here from the current policy.
  /// The state may only be modified after fence(): a model that fences itself (see
  /// fences_itself) calls it right before its optimizer step and reports the wait in
  /// `fence_wait_s`; otherwise the Worker fences before calling this.
  virtual Result<StepMetrics> train_step(std::int64_t step, Objective objective,
                                         const std::vector<std::int32_t>& behaviour_actions) = 0;

  /// Whether train_step calls fence() itself, as late as it can (right before it modifies the
  /// state), so that a save's background staging overlaps the forward and backward passes.
  virtual bool fences_itself() const { return false; }

  /// Publishes this rank's part of the current weights as `version` for generators by the
  /// model's own means (weight_sync.transport collective). A Worker with a weight-sync
  /// publisher (WeightPublishing, actors/worker.hpp) pushes its state's tensors instead.
  virtual Status export_weights(std::int64_t version) = 0;

  /// Greedy accuracy on held-out data, the same on every rank.
  virtual Result<double> evaluate() = 0;
};

}  // namespace stagehand
