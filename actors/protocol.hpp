#pragma once

// The protocols between trainers, the WorkerDispatch, the Workers and the checkpoint
// coordinator: one typed actor interface each, so that a wrong message does not compile, and
// the structs their messages carry. Every struct has an inspect() overload: the same messages
// cross processes (CAF's middleman), where register_wire_types() makes them known; within a
// process they pass as they are, never as text.
//
// A save, in the shape of DCP's (plan, global plan, write, finish):
//   dispatch --(save_atom, SaveCall)--> every Worker
//   Worker --(plan_atom, LocalPlan, trainer state)--> coordinator, which answers every rank once
//     all local plans are in and agree: WriteAssignment (the folder and the blocks it writes)
//   Worker --(save_atom, SaveOrder)--> its strategy, which writes (or stages and returns)
//   strategy --(rank_saved_atom, RankSaveReport)--> Worker --> coordinator, which commits when
//     the last report is in
//   dispatch --(await_atom, step)--> coordinator: CommitInfo once committed, or why not.

#include <caf/fwd.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "stagehand/actors/messages.hpp"
#include "stagehand/actors/model.hpp"
#include "stagehand/checkpoint/save/global_plan.hpp"
#include "stagehand/checkpoint/load/loader.hpp"
#include "stagehand/checkpoint/save/report.hpp"
#include "stagehand/strategy/protocol.hpp"

namespace stagehand {

// -- message payloads --

/// A save of one step as the caller asks it of every rank.
struct SaveCall {
  std::int64_t step = 0;
  /// Write in the background after staging (else return once written; the caller then awaits
  /// the commit).
  bool async = false;
  /// Written as the step's trainer_state.json when not empty (the dispatch sends it to rank 0).
  std::string trainer_state;
};

/// The coordinator's answer to a rank's local plan: where its bucket files go, and which of its
/// blocks it writes (global_plan.hpp).
struct WriteAssignment {
  std::string policy_dir;
  std::vector<std::uint32_t> writes;
};

/// What a committed step wrote and where its save spent its time, so that nobody reads the
/// checkpoint back to find out.
struct CommitInfo {
  std::int64_t step = 0;
  /// Data files and their bytes.
  std::uint64_t files = 0;
  std::uint64_t bytes = 0;
  /// Each phase the slowest rank's.
  SavePhases phases;
  /// The coordinator's commit (metadata, renames, tracker), and its thread's CPU seconds in it
  /// (on a busy machine commit_s also counts waiting for a core).
  double commit_s = 0;
  double commit_cpu_s = 0;
  /// CPU seconds every rank's writer threads spent on the save (RankSaveReport::cpu_s), summed.
  double ranks_cpu_s = 0;
};

/// The dispatch's answer to a save.
struct SaveResult {
  /// How long the caller was blocked: until committed for a sync save, until staged for async.
  double stall_s = 0;
  bool async = false;
  /// Set when the save committed before the answer (a sync save).
  bool committed = false;
  CommitInfo commit;
};

/// The dispatch's answer to a finalize.
struct FinalizeResult {
  /// Whether a pending save was committed by it.
  bool committed = false;
  CommitInfo commit;
};

/// A load of every rank.
struct LoadCall {
  /// A checkpoint root (the step its tracker names), a `global_step_N` folder or a safetensors
  /// folder.
  std::string path;
  LoadScope scope;
};

/// One training step of every rank.
struct TrainOrder {
  std::int64_t step = 0;
  Objective objective = Objective::rl;
  /// The actions generators sampled for the whole global batch; empty: sample on-policy.
  std::vector<std::int32_t> behaviour_actions;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SaveCall& x) {
  return f(x.step, x.async, x.trainer_state);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, WriteAssignment& x) {
  return f(x.policy_dir, x.writes);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, CommitInfo& x) {
  return f(x.step, x.files, x.bytes, x.phases, x.commit_s, x.commit_cpu_s, x.ranks_cpu_s);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SaveResult& x) {
  return f(x.stall_s, x.async, x.committed, x.commit);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, FinalizeResult& x) {
  return f(x.committed, x.commit);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, LoadCall& x) {
  return f(x.path, x.scope);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, TrainOrder& x) {
  return f(x.step, x.objective, x.behaviour_actions);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StepMetrics& x) {
  return f(x.reward, x.loss, x.fence_wait_s);
}

// -- interfaces --

/// The checkpoint coordinator (actors/checkpoint_coordinator.hpp), one per job, on rank 0.
using coordinator_actor = caf::typed_actor<
    /// A rank's local plan of a step, with the trainer state to write (or empty): answered once
    /// every rank's plan of that step is in and the global plan holds, with where and what this
    /// rank writes; an error naming the rank or the disagreement otherwise, on every rank.
    caf::replies_to<plan_atom, LocalPlan, std::string>::with<WriteAssignment>,
    /// A rank's write of the open step ended: the last one commits.
    caf::reacts_to<rank_saved_atom, RankSaveReport>,
    /// Answered once `step` committed, or with why it did not.
    caf::replies_to<await_atom, std::int64_t>::with<CommitInfo>,
    /// Whether the outcome of `step` is known (committed or failed), at once.
    caf::replies_to<poll_atom, std::int64_t>::with<bool>,
    /// Gives up `step` (nothing is committed), with the reason every waiter is told; from the
    /// dispatch whose first rank is given (an abort of a failed save that a rank already began
    /// again without it leaves the new save alone).
    caf::reacts_to<abort_atom, std::int64_t, std::int32_t, std::string>,
    /// A rank is gone (its process died): what waits on it fails now, naming it, and so does
    /// every later save.
    caf::reacts_to<rank_down_atom, std::int32_t, std::string>,
    /// Internal: the limit for the local plans of the step formed as (step, forming) passed.
    caf::reacts_to<timeout_atom, std::int64_t, std::uint64_t>,
    /// Internal: the write limit of the step opened as (step, opening) passed.
    caf::reacts_to<write_timeout_atom, std::int64_t, std::uint64_t>,
    /// Internal: the limit for the ranks of a failed (step, opening) to stop writing passed.
    caf::reacts_to<drained_atom, std::int64_t, std::uint64_t>>;

/// The Worker of one rank (actors/worker.hpp).
using worker_actor = caf::typed_actor<
    caf::replies_to<train_atom, TrainOrder>::with<StepMetrics>,
    caf::replies_to<eval_atom>::with<double>,
    caf::reacts_to<export_atom, std::int64_t, std::int32_t>,
    caf::replies_to<fence_atom>::with<double>,
    caf::replies_to<save_atom, SaveCall>::with<SaveAck>,
    caf::replies_to<finalize_atom>::with<bool>,
    caf::replies_to<load_atom, LoadCall>::with<LoadReport>,
    caf::reacts_to<rank_saved_atom, RankSaveReport>,
    /// Where its reports and plans go, for a Worker that learns it late (another process).
    caf::reacts_to<report_to_atom, coordinator_actor>,
    /// Internal: the strategy the Worker owns.
    caf::reacts_to<attach_atom, strategy_actor>>;

/// The WorkerDispatch (actors/worker_dispatch.hpp): one call of every rank, one answer.
using dispatch_actor = caf::typed_actor<
    caf::replies_to<train_atom, TrainOrder>::with<StepMetrics>,
    caf::replies_to<eval_atom>::with<double>,
    caf::reacts_to<export_atom, std::int64_t, std::int32_t>,
    caf::replies_to<fence_atom>::with<double>,
    caf::replies_to<save_atom, SaveCall>::with<SaveResult>,
    caf::replies_to<finalize_atom>::with<FinalizeResult>,
    caf::replies_to<load_atom, LoadCall>::with<LoadReport>>;

}  // namespace stagehand
