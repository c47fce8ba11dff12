#pragma once

#include <caf/fwd.hpp>
#include <memory>

#include "stagehand/actors/protocol.hpp"
#include "stagehand/trainers/trainer.hpp"

namespace stagehand {

/// Spawns the fully-async trainer (trainer.kind fully_async): GRPO-style RL whose batches come
/// from `fully_async.num_generators` generator actors. Batch s is sampled with the weights of
/// version max(0, s - 1 - L) (L = fully_async.max_staleness_steps), so generation of later
/// batches runs while the trainer trains and saves, and no sample is more than L versions behind
/// the weights it trains. The schedule is fixed, so runs (and resumes) are exactly reproducible:
/// batches generated but not yet consumed are part of the checkpoint (trainer_state.json).
/// @pre options.weights is the store the Workers publish their weights to.
caf::actor spawn_fully_async_trainer(caf::actor_system& system, dispatch_actor dispatch, TrainerOptions options,
                                     std::shared_ptr<TrainerSummary> summary);

}  // namespace stagehand
