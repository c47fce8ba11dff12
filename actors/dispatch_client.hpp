#pragma once

#include <caf/actor.hpp>
#include <caf/fwd.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "stagehand/actors/checkpoint_coordinator.hpp"
#include "stagehand/actors/model.hpp"
#include "stagehand/checkpoint/loader.hpp"
#include "stagehand/core/status.hpp"
#include "stagehand/strategy/megatron_strategy.hpp"

namespace stagehand {

/// How long the caller of a save was blocked, and whether the write went on in the background.
struct SaveTiming {
  double stall_s = 0;
  bool async = false;
};

/// A blocking client of a WorkerDispatch, for code that is not an actor (the bench, tests, a
/// trainer's own thread). Each call is one message to the dispatch and a wait for its reply: the
/// dispatch and the coordinator drive the save protocol (finalize the pending save, begin the
/// step, fan out, gather, commit), on the same path stagehand-train's trainers take.
///
/// Thread-safety: one thread at a time.
class DispatchClient {
 public:
  /// @param timeout how long one call may take in all; the dispatch bounds each of its own waits
  ///        by its own limit, so give this a few times that.
  DispatchClient(caf::actor_system& system, caf::actor dispatch, std::chrono::milliseconds timeout);

  /// Finalizes any pending save, then saves `step` on every rank (`trainer_state_json`, when not
  /// empty, is written as the step's trainer_state.json). A sync save has committed when this
  /// returns; an async one returns after staging and commits when every rank's write ends.
  Result<SaveTiming> save(std::int64_t step, const std::string& trainer_state_json = "");

  /// Returns once no save reads any rank's state any more: every bucket of a pending async save
  /// is staged (it may still be writing). Call it before modifying a state handed to an async
  /// save with staging waves; free otherwise.
  /// @return the longest wait of any rank, in seconds.
  Result<double> fence();

  /// Where the committed `step`'s save spent its time, as JSON text (see phases_atom).
  Result<std::string> save_phases(std::int64_t step);

  /// Drains every rank's queue and waits for the pending step's commit.
  /// @return the first error of any rank, or why the pending step did not commit.
  Status finalize();

  /// Finalizes, then loads `path` into every rank's state: a checkpoint root (the step its
  /// tracker names), a `global_step_N` folder or a safetensors folder; `scope` says which parts
  /// (each rank's load_selection). After an error the ranks' tensors may be unspecified
  /// (load_checkpoint): the state must not be used as loaded.
  /// @param timing when not null and the load succeeded, where its time went: total_s, read_s,
  ///        verify_s and copy_s the slowest rank's, bytes every rank's, and every rank's
  ///        missing and unused names (the other fields 0).
  Status load(const std::string& path, LoadReport* timing = nullptr, const LoadScope& scope = {});

  const caf::actor& dispatch() const { return dispatch_; }

 private:
  caf::actor_system& system_;
  caf::actor dispatch_;
  std::chrono::milliseconds timeout_;
};

struct CheckpointClusterOptions {
  /// trainer.ckpt_path and where object-store saves are written first; world_size is set from
  /// the number of ranks.
  CoordinatorOptions coordinator;
  /// Every rank's strategy options; the rank is set per Worker.
  StrategyOptions strategy;
  /// Limit of every wait of the dispatch on a Worker or the coordinator.
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
};

/// The actors a checkpointing run needs in one process: a coordinator, one Worker (owning its
/// MegatronStrategy) per rank, a WorkerDispatch over them, and a DispatchClient that drives it.
///
/// Thread-safety: one thread at a time.
class CheckpointCluster {
 public:
  /// Spawns everything; rank r is `ranks[r]`.
  /// @return an error naming the rank whose Worker or strategy could not start (nothing is left
  ///         running then).
  static Result<std::unique_ptr<CheckpointCluster>> spawn(caf::actor_system& system,
                                                         std::vector<std::unique_ptr<Checkpointable>> ranks,
                                                         CheckpointClusterOptions options);
  /// shutdown().
  ~CheckpointCluster();
  CheckpointCluster(const CheckpointCluster&) = delete;
  CheckpointCluster& operator=(const CheckpointCluster&) = delete;

  DispatchClient& client() { return client_; }
  const caf::actor& dispatch() const { return client_.dispatch(); }

  /// Finalizes (always, whatever was saved), then stops the dispatch, the Workers (and with them
  /// their strategies) and the coordinator, and waits until they are gone.
  /// @return the finalize's outcome: a pending save that did not commit is an error here.
  Status shutdown();

 private:
  CheckpointCluster(caf::actor_system& system, caf::actor coordinator, std::vector<caf::actor> workers,
                    caf::actor dispatch, std::chrono::milliseconds client_timeout);

  caf::actor_system& system_;
  caf::actor coordinator_;
  std::vector<caf::actor> workers_;
  DispatchClient client_;
  bool shut_down_ = false;
};

}  // namespace stagehand
