#pragma once

#include <caf/actor.hpp>
#include <caf/fwd.hpp>
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "stagehand/actors/launch.hpp"
#include "stagehand/actors/protocol.hpp"
#include "stagehand/core/status.hpp"

namespace stagehand {

/// The process that holds rank 0's side of the start: publishes a world actor on
/// `info.master_port`, waits until every other process joined with the same wire version and
/// world size (or the join time limit passed), then tells every process the coordinator and
/// where the collectives meet. From then on it watches every member process: when one goes
/// away, the coordinator hears that its ranks died (rank_down_atom).
///
/// A process may hold several ranks: rank 0's holds ranks [0, local), each member the ranks it
/// names when it joins; together they must be every rank once.
///
/// Thread-safety: one thread at a time.
class WorldHost {
 public:
  /// Publishes the world actor; an error when the port cannot be bound.
  static Result<std::unique_ptr<WorldHost>> open(caf::actor_system& system, const LaunchInfo& info);
  /// shutdown(1) when not shut down yet.
  ~WorldHost();

  /// Waits for every rank; tells the members `rendezvous` (may be null) and `coordinator`.
  /// @param local the Workers of this process, ranks 0, 1, ...
  /// @return the Workers of all ranks, by rank.
  Result<std::vector<worker_actor>> gather(std::vector<worker_actor> local, caf::actor rendezvous,
                                           coordinator_actor coordinator);
  /// Waits until every member process has left (WorldMember::leave) or gone, at most `limit`.
  /// @return the ranks still there when the limit passed, as an error.
  Status await_leaves(std::chrono::milliseconds limit);
  /// Tells every joined process to exit with `code` (stagehand-train), and stops the world actor.
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

/// What a process other than rank 0's learns when it joined.
struct JoinedWorld {
  /// Rank 0's rendezvous store for the collectives between processes (may be null).
  caf::actor rendezvous;
  coordinator_actor coordinator;
};

/// A process other than rank 0's: connects to rank 0 (each attempt bounded; retried until the
/// join time limit, so that a rank 0 that is half up, or a port that accepts and never answers,
/// fails the join in time), joins with its Workers, and waits for the world to be complete.
/// Then, with serve(), waits until rank 0 says to stop (its exit code), goes away or a stop is
/// asked for (1); or, with leave(), says it is done.
///
/// Thread-safety: one thread at a time.
class WorldMember {
 public:
  WorldMember(caf::actor_system& system, LaunchInfo info);
  ~WorldMember();
  /// @param local the Workers of this process: ranks info.rank, info.rank + 1, ...
  Result<JoinedWorld> join(std::vector<worker_actor> local);
  /// @param stop when not null, polled (every 100 ms): once true (a signal asked this process to
  ///        stop), serve returns.
  /// @return the exit code rank 0 sent; or 1 with `lost` set when rank 0 went away first, or
  ///         when `stop` became true first ("stop requested").
  int serve(std::string& lost, const std::atomic<bool>* stop = nullptr);
  /// Tells rank 0 this process is done with the world.
  void leave();
  /// Rank 0's world actor, once joined (to watch for rank 0's end).
  const caf::actor& world() const { return world_; }

 private:
  caf::actor_system& system_;
  LaunchInfo info_;
  std::unique_ptr<caf::scoped_actor> self_;
  caf::actor world_;
};

/// Connects to the actor published at `host`:`port`, waiting at most `limit` (CAF 0.17's
/// remote_actor waits without one: a peer that accepts the connection and never answers would
/// block it forever).
Result<caf::actor> connect_remote_actor(caf::actor_system& system, const std::string& host, std::uint16_t port,
                                        std::chrono::milliseconds limit);

}  // namespace stagehand
