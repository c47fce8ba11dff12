#pragma once

#include <caf/fwd.hpp>
#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "stagehand/actors/model.hpp"
#include "stagehand/checkpoint/sync/weight_channel.hpp"
#include "stagehand/actors/protocol.hpp"
#include "stagehand/strategy/megatron_strategy.hpp"

namespace stagehand {

/// Where a Worker pushes its weights (weight_sync, docs/weight_sync.md): on each export it pushes
/// the tensors of its state whose names start with `prefix` as that version through its rank's
/// publisher on `channel` (open_weight_publisher: "tcp://HOST:PORT" over TCP, a name over shared
/// memory; made at the first export). The push runs in the background
/// with the state's fence closed: the next training step's forward and backward passes overlap
/// it, and its optimizer step waits at the fence until the push ended.
struct WeightPublishing {
  std::string channel;
  /// Trainer ranks on the channel (the world size).
  int world = 1;
  std::string prefix = "model.";
  WeightChannelOptions options;
};

/// Spawns the Worker of one rank (worker_actor, actors/protocol.hpp): it owns the rank's
/// Checkpointable (its shard of model and optimizer state; a Model when it also trains) and
/// that rank's MegatronStrategy (linked: neither outlives the other). Detached: a training step
/// blocks in collectives with the other ranks' Workers.
///
/// Protocol (errors as values, never exceptions):
/// - (train_atom, TrainOrder) -> StepMetrics; (eval_atom) -> accuracy; (export_atom, version,
///   wait_for): only when `state_owner` is a Model, else an error. With `publishing` it answers
///   once the push started (the previous push's error, if any, is the answer) and the push
///   waits for `wait_for` receivers first; without, the model's export_weights().
/// - (fence_atom) -> seconds waited (Checkpointable::fence).
/// - (save_atom, SaveCall) -> SaveAck: sends the rank's local plan to the coordinator, which
///   answers once every rank's plan is in (the global plan); then has the strategy write the
///   blocks assigned to this rank. The structure travels only when it changed since this rank's
///   last plan.
/// - (finalize_atom) -> bool: the strategy drains.
/// - (load_atom, LoadCall) -> LoadReport: the owner's load_selection() for the scope goes to the
///   strategy, which loads; after a load the owner refreshes what it derives from its state
///   (Checkpointable::on_loaded).
/// - The strategy's pushed (rank_saved_atom, report) goes on to the coordinator; a dead Worker's
///   reports never arrive, so a save it took part in cannot commit.
/// - (report_to_atom, coordinator): sets the coordinator later (a Worker in another process than
///   rank 0 learns it when the world is complete); reports pushed before are kept until then.
///
/// Every message it takes and sends is a registered, serializable type (register_wire_types),
/// so the Worker may be in another process or on another host than the dispatch.
/// @param call_timeout the limit of each of its own requests (to the coordinator and the strategy).
/// @pre strategy_options.rank is this Worker's rank.
Result<worker_actor> spawn_worker(caf::actor_system& system, std::unique_ptr<Checkpointable> state_owner,
                                  StrategyOptions strategy_options, coordinator_actor coordinator,
                                  std::chrono::milliseconds call_timeout = std::chrono::minutes(10),
                                  std::optional<WeightPublishing> publishing = std::nullopt);

}  // namespace stagehand
