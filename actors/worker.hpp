#pragma once

#include <caf/fwd.hpp>
#include <memory>

#include "stagehand/actors/model.hpp"
#include "stagehand/strategy/megatron_strategy.hpp"

namespace stagehand {

/// Spawns the Worker of one rank: it owns the rank's Checkpointable (its shard of model and
/// optimizer state; a Model when it also trains) and that rank's MegatronStrategy (linked:
/// neither outlives the other). Detached: a training step blocks in collectives with the other
/// ranks' Workers.
///
/// Protocol (errors as values):
/// - (train_atom, step, objective) -> (reward, loss); (eval_atom) -> accuracy;
///   (export_atom, version) -> void: only when `state_owner` is a Model, else an error.
/// - (save_atom, step, destination, policy_dir) -> (stall_s, async); (finalize_atom) -> bool;
///   (load_atom, checkpoint_dir, encoded LoadScope) -> (total_s, read_s, verify_s, copy_s, bytes,
///   encoded load notes): the owner's load_selection() for that scope goes to the strategy,
///   which loads; after a load the owner refreshes what it derives from its state
///   (Checkpointable::on_loaded).
/// - The strategy's pushed (rank_saved_atom, report) goes on to `coordinator`; a dead Worker's
///   reports never arrive, so a save it took part in cannot commit.
/// - (report_to_atom, coordinator): sets the coordinator later (a Worker in another process than
///   rank 0 learns it when the world is complete); reports pushed before are kept until then.
///
/// Every message it takes and sends is a registered, serializable type (register_wire_types),
/// so the Worker may be in another process or on another host than the dispatch.
/// @pre strategy_options.rank is this Worker's rank.
Result<caf::actor> spawn_worker(caf::actor_system& system, std::unique_ptr<Checkpointable> state_owner,
                                StrategyOptions strategy_options, caf::actor coordinator);

}  // namespace stagehand
