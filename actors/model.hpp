#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "stagehand/core/sharded_tensor.hpp"
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

  /// Refreshes whatever is derived from the state after a checkpoint was loaded into it.
  virtual Status on_loaded() { return Status::ok(); }
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
  virtual Result<StepMetrics> train_step(std::int64_t step, Objective objective,
                                         const std::vector<std::int32_t>& behaviour_actions) = 0;

  /// Publishes this rank's part of the current weights as `version` for generators.
  virtual Status export_weights(std::int64_t version) = 0;

  /// Greedy accuracy on held-out data, the same on every rank.
  virtual Result<double> evaluate() = 0;
};

}  // namespace stagehand
