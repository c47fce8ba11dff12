#pragma once

#include <caf/fwd.hpp>
#include <chrono>
#include <string>
#include <vector>

#include "stagehand/actors/protocol.hpp"

namespace stagehand {

struct DispatchOptions {
  /// Limit of every wait on a Worker or the coordinator.
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
  /// How that limit is set, for the message when it passes ("trainer.call_timeout_s").
  std::string timeout_setting = "the call time limit";
  /// The global rank of the first Worker (the others follow), for messages: the first of this
  /// process's ranks in an SPMD job.
  int first_rank = 0;
};

/// Spawns the WorkerDispatch (dispatch_actor, actors/protocol.hpp): it fans every call out to
/// `workers` and gathers the replies. `workers` are every rank of a job driven from one place
/// (stagehand-train's trainer), or the ranks of one process of an SPMD job (each process's
/// Checkpointer has its own dispatch; the coordinator is shared).
///
/// One failing, stalled or dead rank fails the whole call with that rank and its reason in the
/// error (a rank that does not answer within the limit is named with the limit and
/// `timeout_setting`). Workers and the coordinator are monitored: a rank that died fails every
/// later call at once and aborts the step being saved; a coordinator that died (rank 0's
/// process) fails every call in flight and every later one, naming it. Nothing partial is ever
/// committed.
///
/// Protocol (errors as values):
/// - (train_atom, TrainOrder) -> StepMetrics: reward and loss as the first Worker reports them
///   (global figures), the longest wait of any rank at the fence.
/// - (fence_atom) -> seconds: every rank's fence (Checkpointable::fence), the longest wait.
/// - (eval_atom) -> accuracy; (export_atom, version, wait_for): weight sync
///   (each Worker's push, or its model's export_weights()).
/// - (save_atom, SaveCall) -> SaveResult: finalizes a pending save first, then saves on every
///   rank (the trainer state goes to the first Worker); a sync save has committed when the
///   answer comes (SaveResult::commit says what it wrote), an async one commits when every
///   rank's write ends.
/// - (finalize_atom) -> FinalizeResult: drains every rank and waits for the pending step's
///   commit; one finalize per save.
/// - (load_atom, LoadCall) -> LoadReport: finalizes, then loads on every rank. Each time is the
///   slowest rank's, the bytes every rank's, the missing names every rank's, the unused tensors
///   those no rank used.
dispatch_actor spawn_worker_dispatch(caf::actor_system& system, std::vector<worker_actor> workers,
                                     coordinator_actor coordinator, DispatchOptions options);

}  // namespace stagehand
