#pragma once

#include <caf/actor.hpp>
#include <caf/fwd.hpp>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "stagehand/actors/launch.hpp"
#include "stagehand/core/status.hpp"

namespace stagehand {

/// Rank 0's side of the start: publishes a world actor on MASTER_PORT, waits until every other
/// rank joined with the same wire version and WORLD_SIZE (or the join time limit passed), then
/// tells every rank where the collectives meet (rank 0's rendezvous store) and the checkpoint
/// coordinator.
class WorldHost {
 public:
  /// Publishes the world actor; an error when the port cannot be bound.
  static Result<std::unique_ptr<WorldHost>> open(caf::actor_system& system, const LaunchInfo& info);
  ~WorldHost();

  /// Waits for every rank; tells them `rendezvous` and `coordinator`.
  /// @return the Workers of all ranks, by rank.
  Result<std::vector<caf::actor>> gather(caf::actor worker0, caf::actor rendezvous, caf::actor coordinator);
  /// Tells every joined rank to exit with `code`.
  void shutdown(int code);
  std::uint16_t port() const { return port_; }

 private:
  WorldHost(caf::actor_system& system, LaunchInfo info, caf::actor world, std::uint16_t port)
      : system_(system), info_(std::move(info)), world_(std::move(world)), port_(port) {}
  caf::actor_system& system_;
  LaunchInfo info_;
  caf::actor world_;
  std::uint16_t port_;
};

/// What a rank other than 0 learns when it joined.
struct JoinedWorld {
  /// Rank 0's rendezvous store for the collectives between processes.
  caf::actor rendezvous;
  caf::actor coordinator;
};

/// A rank other than 0: connects to rank 0 (retrying until the join time limit), joins with its
/// Worker, and waits for the world to be complete. Then, with serve(), waits until
/// rank 0 says to stop (its exit code) or goes away (1).
class WorldMember {
 public:
  WorldMember(caf::actor_system& system, LaunchInfo info);
  ~WorldMember();
  Result<JoinedWorld> join(caf::actor worker);
  /// @return the exit code rank 0 sent, or 1 with `lost` set when rank 0 went away first.
  int serve(std::string& lost);

 private:
  caf::actor_system& system_;
  LaunchInfo info_;
  std::unique_ptr<caf::scoped_actor> self_;
  caf::actor world_;
};

}  // namespace stagehand
