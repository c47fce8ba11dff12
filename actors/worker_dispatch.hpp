#pragma once

#include <caf/fwd.hpp>
#include <chrono>
#include <string>
#include <vector>

namespace stagehand {

struct DispatchOptions {
  /// trainer.ckpt_path, passed to the strategies to decide sync or async.
  std::string destination;
  /// Limit of every wait on a Worker or the coordinator.
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
};

/// Spawns the WorkerDispatch: it fans every call out to all Workers and gathers the replies. One
/// failing or dead rank fails the whole call with that rank and its reason; Workers are
/// monitored, so a rank that died fails every later call at once, and aborts the checkpoint step
/// being saved (nothing partial is ever committed).
///
/// Protocol (errors as values):
/// - (train_atom, step, objective, behaviour_actions) -> (reward, loss, fence_wait_s): reward and
///   loss as rank 0 reports them (global figures), the longest wait of any rank at the fence.
/// - (fence_atom) -> seconds: every rank's fence (see Checkpointable::fence), the longest wait.
/// - (eval_atom) -> accuracy; (export_atom, version) -> void: weight sync for generators.
/// - (save_atom, step, trainer_state_json) -> (stall_s, async): finalizes any pending save first,
///   begins the step at the coordinator (which writes trainer_state.json), then saves on every
///   rank; a sync save has committed when the reply comes.
/// - (finalize_atom) -> bool: drains every rank and waits for the pending step's commit.
/// - (load_atom, path, encoded LoadScope) -> (total_s, read_s, verify_s, copy_s, uint64 bytes,
///   encoded load notes): finalizes, then loads on every rank; `path` is a checkpoint root (the
///   step its tracker names), a `global_step_N` folder or a safetensors folder. Each time is the
///   slowest rank's, the bytes every rank's, the notes every rank's names merged.
caf::actor spawn_worker_dispatch(caf::actor_system& system, std::vector<caf::actor> workers,
                                 caf::actor coordinator, DispatchOptions options);

}  // namespace stagehand
