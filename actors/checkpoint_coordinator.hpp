#pragma once

#include <caf/fwd.hpp>
#include <string>

#include "stagehand/storage/object_store.hpp"

namespace stagehand {

struct CoordinatorOptions {
  /// trainer.ckpt_path: a local folder or an object-store URL.
  std::string destination;
  /// megatron_config.local_work_dir: where files for an object store are written first.
  std::string local_work_dir = "/tmp/stagehand-work";
  int world_size = 1;
  /// How to reach an object-store destination.
  ObjectStoreOptions object_store = ObjectStoreOptions::from_environment();
};

/// Spawns the coordinator that commits checkpoints: it prepares `global_step_N.tmp`, gathers
/// the report every rank's strategy pushes when its write ends, and commits the moment the last
/// one arrives (metadata, rename, tracker), or aborts when any rank failed.
///
/// Protocol:
/// - (begin_atom, step, trainer_state_json) -> string policy_dir: prepares the step's folder and
///   writes trainer_state.json into it; an error while an earlier step is still open.
/// - (rank_saved_atom, encoded report): from the strategies.
/// - (await_atom, step) -> void: answers once that step committed, or with why it did not.
/// - (abort_atom, step, reason): gives up the open step (nothing is committed).
///
/// An object-store destination: the step's folder is prepared under `local_work_dir` (the ranks
/// write there and upload their own files); begin refuses a step already committed in the store
/// (objects cannot be swapped atomically); the commit uploads trainer_state.json, the metadata and
/// then the tracker object, and removes the local folder. A failed step's uploaded objects are
/// deleted again (what cannot be deleted now is cleaned at the next start).
///
/// The actor is detached: uploads block it, never a scheduler thread.
caf::actor spawn_checkpoint_coordinator(caf::actor_system& system, CoordinatorOptions options);

}  // namespace stagehand
