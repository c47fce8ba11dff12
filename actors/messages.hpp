#pragma once

#include <caf/atom.hpp>

#include <algorithm>
#include <chrono>

#include "stagehand/strategy/messages.hpp"

namespace stagehand {

/// The limit of a wait that holds a wait limited by `inner` which starts a little later (a
/// Worker's wait for the coordinator's plan, which times out `inner` after the first rank's plan
/// came in): the inner limit passes first, and its error, which names the late rank, is the one
/// the caller sees, not the outer wait's own timeout.
inline std::chrono::milliseconds outer_limit(std::chrono::milliseconds inner) {
  return inner + std::max<std::chrono::milliseconds>(std::chrono::seconds(2), inner / 10);
}

/// How long a Worker waits for the coordinator's answer to its plan, with the coordinator's
/// limit `timeout`: a plan may wait for a failed save of its step to drain (at most `timeout`),
/// then for the other ranks' plans (`timeout` from the first one). Only the backstop of a lost
/// coordinator.
inline std::chrono::milliseconds plan_wait_limit(std::chrono::milliseconds timeout) { return outer_limit(2 * timeout); }

// -- atoms of the protocols of actors/protocol.hpp (the typed interfaces say what each carries;
// the checkpoint atoms save, finalize, load and ranksaved are strategy/messages.hpp's) --

using train_atom = caf::atom_constant<caf::atom("train")>;
using eval_atom = caf::atom_constant<caf::atom("eval")>;
using fence_atom = caf::atom_constant<caf::atom("fence")>;
/// Publish the current weights for generators.
using export_atom = caf::atom_constant<caf::atom("export")>;
/// generate_atom, batch step, weights version, first context, count -> vector<int32> actions
/// (the fully-async trainer's generators, trainers/generator.hpp).
using generate_atom = caf::atom_constant<caf::atom("generate")>;
using attach_atom = caf::atom_constant<caf::atom("attach")>;
using report_to_atom = caf::atom_constant<caf::atom("reportto")>;
using plan_atom = caf::atom_constant<caf::atom("plan")>;
using await_atom = caf::atom_constant<caf::atom("await")>;
using poll_atom = caf::atom_constant<caf::atom("poll")>;
using abort_atom = caf::atom_constant<caf::atom("abort")>;
using rank_down_atom = caf::atom_constant<caf::atom("rankdown")>;
using timeout_atom = caf::atom_constant<caf::atom("timeout")>;
using write_timeout_atom = caf::atom_constant<caf::atom("wtimeout")>;
using drained_atom = caf::atom_constant<caf::atom("drained")>;

// -- atoms of a world of processes (actors/process_world.hpp) --

/// join_atom, first rank, world size, wire version, job, the process's Workers: a process joins
/// rank 0.
using join_atom = caf::atom_constant<caf::atom("join")>;
/// join_error_atom, reason: rank 0 refused a join, or the world failed to form.
using join_error_atom = caf::atom_constant<caf::atom("joinerror")>;
/// peers_atom, rendezvous, coordinator: the world is complete; its collectives meet at rank 0's
/// rendezvous store.
using peers_atom = caf::atom_constant<caf::atom("peers")>;
/// shutdown_atom, exit code: rank 0 is done; every rank exits with that code.
using shutdown_atom = caf::atom_constant<caf::atom("shutdown")>;
/// leave_atom: a process is done with the world (its Checkpointer closed).
using leave_atom = caf::atom_constant<caf::atom("leave")>;
/// rdv_set_atom, key, value -> void: publishes a collectives rendezvous value at rank 0.
using rdv_set_atom = caf::atom_constant<caf::atom("rdvset")>;
/// rdv_get_atom, key -> value, once some rank has published it.
using rdv_get_atom = caf::atom_constant<caf::atom("rdvget")>;

// -- atoms of a host's file server (actors/file_server.hpp) --

/// rfs_atom, call, path, second path, handle, offset, size, bytes, session -> code, message,
/// value, bytes, strings: one call of a remote file system.
using rfs_atom = caf::atom_constant<caf::atom("rfs")>;
/// rfs_gone_atom: a client's session tells its waiting calls that the server is gone.
using rfs_gone_atom = caf::atom_constant<caf::atom("rfsgone")>;

}  // namespace stagehand
