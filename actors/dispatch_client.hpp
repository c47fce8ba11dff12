#pragma once

#include <caf/fwd.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "stagehand/actors/checkpoint_coordinator.hpp"
#include "stagehand/actors/model.hpp"
#include "stagehand/actors/protocol.hpp"
#include "stagehand/actors/worker_dispatch.hpp"
#include "stagehand/checkpoint/load/loader.hpp"
#include "stagehand/core/status.hpp"
#include "stagehand/strategy/megatron_strategy.hpp"

namespace stagehand {

/// The one typed client of a WorkerDispatch, for code that is not an event-based actor: the
/// trainers, the Checkpointer, the bench, tests. Each call is one message to the dispatch and a
/// wait for its reply; the dispatch and the coordinator drive the protocol (finalize the pending
/// save, plan, fan out, gather, commit).
///
/// Thread-safety: one thread at a time.
class DispatchClient {
 public:
  /// @param timeout how long one call may take in all; the dispatch bounds each of its own waits
  ///        by its own limit, so give this a few times that.
  /// @param timeout_setting how `timeout` is set, for the message when it passes ("6 x
  ///        trainer.call_timeout_s"); may be empty.
  DispatchClient(caf::actor_system& system, dispatch_actor dispatch, std::chrono::milliseconds timeout,
                 std::string timeout_setting = {});

  /// Finalizes any pending save, then saves `step` on every rank (`trainer_state_json`, when not
  /// empty, is written as the step's trainer_state.json). A sync save has committed when this
  /// returns (SaveResult::commit says what it wrote); an async one returns after staging and
  /// commits when every rank's write ends (finalize() waits for it).
  Result<SaveResult> save(std::int64_t step, bool async, const std::string& trainer_state_json = "");

  /// Returns once no save reads any rank's state any more: every bucket of a pending async save
  /// is staged (it may still be writing). Call it before modifying a state handed to an async
  /// save with staging waves; free otherwise.
  /// @return the longest wait of any rank, in seconds.
  Result<double> fence();

  /// Drains every rank and waits for the pending step's commit.
  /// @return what the pending save committed (FinalizeResult::committed false when none was
  ///         pending), or why it did not.
  Result<FinalizeResult> finalize();

  /// Finalizes, then loads `path` into every rank's state: a checkpoint root (the step its
  /// tracker names), a `global_step_N` folder or a safetensors folder; `scope` says which parts
  /// (each rank's load_selection). After an error the ranks' tensors may be unspecified
  /// (load_checkpoint): the state must not be used as loaded.
  /// @return where the time went (total_s, read_s, verify_s and copy_s the slowest rank's, bytes
  ///         every rank's) and every rank's missing and unused names.
  Result<LoadReport> load(const std::string& path, const LoadScope& scope = {});

  // -- training (the Workers must hold Models) --

  Result<StepMetrics> train(TrainOrder order);
  Result<double> evaluate();
  /// Publishes the current weights as `version`: through each Worker's weight-sync publisher
  /// when it has one (a push in the background that first waits for `wait_for` receivers),
  /// else through the model's own export_weights().
  Status export_weights(std::int64_t version, std::int32_t wait_for = 0);

  const dispatch_actor& dispatch() const { return dispatch_; }

 private:
  caf::actor_system& system_;
  dispatch_actor dispatch_;
  std::chrono::milliseconds timeout_;
  std::string timeout_setting_;
};

struct CheckpointClusterOptions {
  /// trainer.ckpt_path and what it is on; world_size is set from the number of ranks.
  CoordinatorOptions coordinator;
  /// Every rank's strategy options; the rank is set per Worker.
  StrategyOptions strategy;
  /// Limit of every wait of the dispatch on a Worker or the coordinator.
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
  /// How `timeout` is set, for the message when it passes.
  std::string timeout_setting = "the call time limit";
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
  const dispatch_actor& dispatch() const { return client_.dispatch(); }

  /// Finalizes (always, whatever was saved), then stops the dispatch, the Workers (and with them
  /// their strategies) and the coordinator, and waits until they are gone.
  /// @return the finalize's outcome: a pending save that did not commit is an error here.
  Status shutdown();

 private:
  CheckpointCluster(caf::actor_system& system, coordinator_actor coordinator, std::vector<worker_actor> workers,
                    dispatch_actor dispatch, std::chrono::milliseconds client_timeout,
                    std::string client_timeout_setting);

  caf::actor_system& system_;
  coordinator_actor coordinator_;
  std::vector<worker_actor> workers_;
  DispatchClient client_;
  bool shut_down_ = false;
};

/// Sends every actor of `actors` an exit and waits (at most `limit`) until all are gone.
/// @return false when some did not go in time.
bool stop_actors(caf::actor_system& system, const std::vector<caf::actor>& actors, std::chrono::milliseconds limit);

}  // namespace stagehand
