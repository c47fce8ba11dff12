#pragma once

#include <caf/atom.hpp>

#include "stagehand/strategy/messages.hpp"

namespace stagehand {

// -- atoms between trainers, the WorkerDispatch and Workers (plus the checkpoint atoms of
// strategy/messages.hpp that the Worker passes on to its strategy: save, finalize, load) --

/// train_atom, step, objective (0 rl, 1 sft), behaviour actions (empty: sample on-policy)
///   -> (double reward, double loss, double fence_wait_s)
using train_atom = caf::atom_constant<caf::atom("train")>;
/// eval_atom -> double greedy accuracy
using eval_atom = caf::atom_constant<caf::atom("eval")>;
/// fence_atom -> double seconds waited: returns once no save reads the state any more (every
/// bucket of a pending async save staged); the largest wait of any rank.
using fence_atom = caf::atom_constant<caf::atom("fence")>;
/// export_atom, version -> void: publish the current weights for generators.
using export_atom = caf::atom_constant<caf::atom("export")>;
/// generate_atom, batch step, weights version, first context, count -> vector<int32> actions
using generate_atom = caf::atom_constant<caf::atom("generate")>;
/// Internal to a Worker: attach_atom, strategy actor.
using attach_atom = caf::atom_constant<caf::atom("attach")>;
/// report_to_atom, coordinator: where a Worker forwards its strategy's write reports (sent to
/// Workers in other processes once the world is complete).
using report_to_atom = caf::atom_constant<caf::atom("reportto")>;

// -- atoms of the checkpoint coordinator (actors/checkpoint_coordinator.hpp) --

/// begin_atom, step, trainer_state_json -> policy_dir to write into
using begin_atom = caf::atom_constant<caf::atom("begin")>;
/// await_atom, step -> void once that step committed (or its error)
using await_atom = caf::atom_constant<caf::atom("await")>;
/// abort_atom, step, reason: the coordinator gives up an open step (a rank died).
using abort_atom = caf::atom_constant<caf::atom("abort")>;
/// phases_atom, step -> JSON text: where the committed step's save spent its time (the slowest
/// rank's copy_s, hash_s, write_s, fsync_s, upload_s, and commit_s, commit_cpu_s); "{}" for a step it does not
/// know. Trainers and the bench ask the WorkerDispatch, which asks the coordinator.
using phases_atom = caf::atom_constant<caf::atom("phases")>;

// -- atoms of a world of processes (actors/process_world.hpp) --

/// join_atom, rank, world_size, wire_version, worker: a rank joins rank 0.
using join_atom = caf::atom_constant<caf::atom("join")>;
/// join_error_atom, reason: rank 0 refused a join, or the world failed to form.
using join_error_atom = caf::atom_constant<caf::atom("joinerror")>;
/// peers_atom, rendezvous, coordinator: the world is complete; its collectives meet at rank 0's
/// rendezvous store.
using peers_atom = caf::atom_constant<caf::atom("peers")>;
/// shutdown_atom, exit code: rank 0 is done; every rank exits with that code.
using shutdown_atom = caf::atom_constant<caf::atom("shutdown")>;
/// Internal to the world actor: the join time limit passed.
using timeout_atom = caf::atom_constant<caf::atom("timeout")>;
/// rdv_set_atom, key, value -> void: publishes a collectives rendezvous value at rank 0.
using rdv_set_atom = caf::atom_constant<caf::atom("rdvset")>;
/// rdv_get_atom, key -> value, once some rank has published it.
using rdv_get_atom = caf::atom_constant<caf::atom("rdvget")>;

}  // namespace stagehand
