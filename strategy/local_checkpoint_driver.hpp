#pragma once

#include <caf/actor.hpp>
#include <caf/fwd.hpp>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/status.hpp"

namespace stagehand {

/// How long the caller of a save was blocked, and whether the write went on in the background.
struct SaveTiming {
  double stall_s = 0;
  bool async = false;
};

/// Drives the checkpoint protocol over a coordinator and one strategy per rank from ordinary
/// (non-actor) code, blocking each call: finalize before every save and load, begin, fan out,
/// gather. The embedded default's building block and what the Worker dispatch builds on.
///
/// Thread-safety: one thread at a time.
class LocalCheckpointDriver {
 public:
  LocalCheckpointDriver(caf::actor_system& system, std::string destination, caf::actor coordinator,
                        std::vector<caf::actor> strategies,
                        std::chrono::milliseconds timeout = std::chrono::minutes(30));
  ~LocalCheckpointDriver();

  /// Finalizes any pending save, then saves `step` on every rank. A sync save has committed when
  /// this returns; an async one returns after staging and commits when every rank's write ends.
  Result<SaveTiming> save(std::int64_t step, const std::string& trainer_state_json = "");

  /// Drains every rank's queue and waits for the pending step's commit.
  /// @return the first error of any rank, or why the pending step did not commit.
  Status finalize();

  /// Finalizes, then loads `checkpoint_dir` into every rank's live state.
  Status load(const std::string& checkpoint_dir);

  /// Finalizes (always, whatever was saved), then stops the strategies and the coordinator.
  Status shutdown();

 private:
  /// Sends `msg` to every strategy at once and hands each reply to `on_reply`.
  template <class OnReply>
  Status fan_out(const caf::message& msg, OnReply on_reply);

  caf::actor_system& system_;
  std::string destination_;
  caf::actor coordinator_;
  std::vector<caf::actor> strategies_;
  std::chrono::milliseconds timeout_;
  std::optional<std::int64_t> pending_step_;
  bool shut_down_ = false;
};

}  // namespace stagehand
