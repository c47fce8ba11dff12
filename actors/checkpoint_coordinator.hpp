#pragma once

#include <caf/fwd.hpp>
#include <chrono>
#include <memory>
#include <string>

#include "stagehand/actors/protocol.hpp"
#include "stagehand/storage/default_file_system.hpp"

namespace stagehand {

struct CoordinatorOptions {
  /// trainer.ckpt_path: a local folder or an object-store URL.
  std::string destination;
  /// Ranks of the job, in all processes.
  int world_size = 1;
  /// What the checkpoint root is on (default_file_system(): local paths and object stores
  /// reached by the AWS environment variables).
  std::shared_ptr<FileSystem> file_system = default_file_system();
  /// How long the local plans of one step may take to come in, from the first one: a rank that
  /// does not plan the step by then (it stalled, or skipped the save) fails it on every rank.
  std::chrono::milliseconds plan_timeout = std::chrono::minutes(10);
  /// How long the ranks may take to write a step once it is planned: a rank that has not
  /// reported by then (it stalled) fails the step, named. 0: no limit of the coordinator's own
  /// (the callers' limits apply; an async save's writes may take as long as training lets them).
  std::chrono::milliseconds write_timeout{0};
  /// The setting `write_timeout` comes from, for its error.
  std::string write_timeout_setting = "the write time limit";
};

/// Spawns the coordinator of a job's checkpoints (coordinator_actor, actors/protocol.hpp). It
/// drives each save through its steps:
/// 1. Plan: every rank sends its local plan; once all of them are in it makes the global plan
///    (make_global_plan: ranks agree on the step and on every tensor, the blocks tile each
///    tensor, replicas are written once and the writers balanced), reusing the last one while
///    no rank's structure changed. Only then does it prepare the step's folder and answer every
///    rank with where to write and what (the ranks wait for this in an async save's stall, so
///    nothing here syncs a file: the trainer state is kept for the commit). A bad plan, a rank
///    that plans another step, or one that does not plan within `plan_timeout`, fails the save
///    on every rank before any file exists, naming the rank.
/// 2. Commit: it gathers the report every rank pushes when its write ends, and commits the
///    moment the last one arrives (trainer state, metadata, rename, tracker, through the
///    CheckpointStore), or aborts when any rank failed (removing what the step left).
/// Waiters (await_atom) get the CommitInfo or the reason. A rank reported down (rank_down_atom)
/// fails what is open and every later save: the world is broken.
///
/// On a file system without renames (an object store) a step already committed is refused
/// (objects cannot be swapped atomically), the ranks write in place, and a failed step's files
/// are deleted again (what cannot be deleted now is cleaned at the next start).
///
/// The actor runs on the scheduler, not detached: a commit blocks one scheduler thread (CAF
/// starts at least 4). A detached actor's thread waits in the actor system's destructor until the
/// actor object is destroyed, and CAF 0.17 can keep it alive past that point: replies it sent to
/// ranks of other processes were found (gdb, on a hung rank 0) still held, as forward messages
/// to the BASP broker, after the middleman had stopped; each holds a reference to the sender.
/// Rank 0 then never exited after another rank was stopped or killed mid-save.
coordinator_actor spawn_checkpoint_coordinator(caf::actor_system& system, CoordinatorOptions options);

}  // namespace stagehand
