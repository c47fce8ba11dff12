#pragma once

#include <caf/fwd.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "stagehand/checkpoint/sync/weight_channel.hpp"
#include "stagehand/config/config.hpp"
#include "stagehand/models/weight_store.hpp"

namespace stagehand {

/// Where a generator reads the policy's weights.
struct GeneratorWeights {
  /// weight_sync.transport collective: the store the trainer ranks publish to (versions kept
  /// there until the trainer drops them).
  std::shared_ptr<WeightStore> store;
  /// weight_sync.transport shm: the channel the trainer ranks push every version to. The
  /// generator receives each one in the background (as receiver `name`) and keeps the newest
  /// `keep` versions.
  std::string channel;
  std::string name;
  WeightChannelOptions options;
  std::int64_t keep = 2;
};

/// Spawns a generator of the fully-async trainer: it samples actions with a published version of
/// the policy weights while the trainer trains (detached: it blocks until that version exists).
///
/// Protocol: (generate_atom, batch_step, version, first_context, count) -> vector<int32> actions,
/// `group_size` per context, context after context. An error when that version does not come
/// within `timeout`, or was passed over (a push dropped this generator: it names why).
caf::actor spawn_generator(caf::actor_system& system, const ModelConfig& model, std::uint64_t seed,
                           GeneratorWeights weights, std::chrono::milliseconds timeout);

}  // namespace stagehand
