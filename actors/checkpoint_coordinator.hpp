#pragma once

#include <caf/fwd.hpp>
#include <memory>
#include <string>

#include "stagehand/storage/default_file_system.hpp"

namespace stagehand {

struct CoordinatorOptions {
  /// trainer.ckpt_path: a local folder or an object-store URL.
  std::string destination;
  int world_size = 1;
  /// What the checkpoint root is on (default_file_system(): local paths and object stores
  /// reached by the AWS environment variables).
  std::shared_ptr<FileSystem> file_system = default_file_system();
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
/// The root is a CheckpointStore: on a file system without renames (an object store) begin
/// refuses a step already committed (objects cannot be swapped atomically), the ranks write in
/// place, and a failed step's objects are deleted again (what cannot be deleted now is cleaned
/// at the next start).
///
/// The actor is detached: commits and uploads block it, never a scheduler thread.
caf::actor spawn_checkpoint_coordinator(caf::actor_system& system, CoordinatorOptions options);

}  // namespace stagehand
