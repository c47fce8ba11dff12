#pragma once

#include <caf/fwd.hpp>
#include <chrono>
#include <memory>

#include "stagehand/config/config.hpp"
#include "stagehand/models/weight_store.hpp"

namespace stagehand {

/// Spawns a generator of the fully-async trainer: it samples actions with a published version of
/// the policy weights while the trainer trains (detached: it blocks until that version exists).
///
/// Protocol: (generate_atom, batch_step, version, first_context, count) -> vector<int32> actions,
/// `group_size` per context, context after context.
caf::actor spawn_generator(caf::actor_system& system, const ModelConfig& model, std::uint64_t seed,
                           std::shared_ptr<WeightStore> weights, std::chrono::milliseconds timeout);

}  // namespace stagehand
