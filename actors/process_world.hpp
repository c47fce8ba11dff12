#pragma once

#include <caf/actor.hpp>
#include <caf/fwd.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "core/status.hpp"
#include "models/bandit_mlp.hpp"

namespace stagehand {

/// What every process of a multi-process world must agree on before any message crosses:
/// bumped whenever a message between processes changes.
inline constexpr const char* kWireVersion = "stagehand-wire/1";

/// Where this process sits in a launch of one process per rank, as cluster launchers describe it
/// (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT).
struct LaunchInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  /// How long rank 0 waits for every rank to join, and a rank for rank 0 to answer.
  std::chrono::milliseconds join_timeout = std::chrono::seconds(60);
  /// Sent when joining; a different one is refused.
  std::string wire_version = kWireVersion;

  bool multi_process() const { return world_size > 1; }
  std::string master() const { return master_addr + ":" + std::to_string(master_port); }
};

/// Flags that override the environment; unset ones fall back to it.
struct LaunchFlags {
  std::optional<int> rank;
  std::optional<int> world_size;
  std::optional<int> local_rank;
  std::optional<std::string> master_addr;
  std::optional<int> master_port;
};

/// The launch from `flags` and the environment. No WORLD_SIZE anywhere: one process (world size 1).
/// Errors name the variable or flag: non-numbers, RANK outside [0, WORLD_SIZE), bad ports.
Result<LaunchInfo> read_launch_info(const LaunchFlags& flags);

/// Loads CAF's middleman and registers every type that crosses a process: call on the config of
/// every process before its actor system is created.
void register_wire_types(caf::actor_system_config& config);

/// Collective contributions that arrived from other processes, waited for by the rank's model
/// thread (condition variable, no polling).
///
/// Thread-safety: all methods may be called from any thread.
class CollectiveInbox {
 public:
  using Key = std::tuple<std::int32_t, std::int64_t, std::int32_t>;  // group, sequence, sender
  struct Part {
    std::uint64_t offset = 0;
    std::vector<float> data;
  };

  void deliver(Key key, Part part);
  /// Waits until the parts of (group, seq) from every sender in `senders` arrived, and takes them.
  /// @return an error when closed, or when `timeout` passed (naming the senders missing).
  Result<std::map<std::int32_t, Part>> take(std::int32_t group, std::int64_t seq, const std::vector<int>& senders,
                                            std::chrono::milliseconds timeout);
  /// Wakes every waiter with `reason`; later takes fail at once.
  void close(const std::string& reason);

  /// Every rank's endpoint, by rank; set once the world is complete.
  void set_peers(std::vector<caf::actor> endpoints);
  /// The endpoints, waiting for set_peers() (a Worker may be asked to train before this
  /// process has heard that the world is complete).
  Result<std::vector<caf::actor>> peers(std::chrono::milliseconds timeout);

 private:
  std::mutex mutex_;
  std::condition_variable arrived_;
  std::map<Key, Part> parts_;
  std::optional<std::vector<caf::actor>> peers_;
  std::optional<std::string> closed_;
};

/// The collectives of one process's rank in a world of processes: an endpoint actor that receives
/// other ranks' contributions over CAF's links, and groups that send to the peers' endpoints.
///
/// Thread-safety: set_peers() once, before the first collective; the rest from any thread.
class ProcessCollectives {
 public:
  /// @param timeout limit of one collective (trainer.call_timeout_s).
  ProcessCollectives(caf::actor_system& system, std::chrono::milliseconds timeout);
  ~ProcessCollectives();
  ProcessCollectives(const ProcessCollectives&) = delete;
  ProcessCollectives& operator=(const ProcessCollectives&) = delete;

  /// The actor other processes send this rank's contributions to.
  const caf::actor& endpoint() const { return endpoint_; }
  /// Every rank's endpoint, indexed by rank.
  void set_peers(std::vector<caf::actor> endpoints);
  /// Releases every waiting collective with an error (shutdown, a peer died).
  void close(const std::string& reason);

  /// The tensor- and data-parallel groups of `rank`, with the same member order (and therefore
  /// the same sums, bit for bit) as make_host_groups().
  RankGroups groups(const ParallelLayout& layout, int rank);

 private:
  class Group;
  caf::actor_system& system_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<CollectiveInbox> inbox_;
  caf::actor endpoint_;
};

/// Rank 0's side of the start: publishes a world actor on MASTER_PORT, waits until every other
/// rank joined with the same wire version and WORLD_SIZE (or the join time limit passed), then
/// tells every rank its peers' endpoints and the checkpoint coordinator.
class WorldHost {
 public:
  /// Publishes the world actor; an error when the port cannot be bound.
  static Result<std::unique_ptr<WorldHost>> open(caf::actor_system& system, const LaunchInfo& info);
  ~WorldHost();

  /// Waits for every rank. @return the Workers and collective endpoints of all ranks, by rank.
  Result<std::pair<std::vector<caf::actor>, std::vector<caf::actor>>> gather(caf::actor worker0, caf::actor endpoint0,
                                                                              caf::actor coordinator);
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
  std::vector<caf::actor> endpoints;
  caf::actor coordinator;
};

/// A rank other than 0: connects to rank 0 (retrying until the join time limit), joins with its
/// Worker and endpoint, and waits for the world to be complete. Then, with serve(), waits until
/// rank 0 says to stop (its exit code) or goes away (1).
class WorldMember {
 public:
  WorldMember(caf::actor_system& system, LaunchInfo info);
  ~WorldMember();
  Result<JoinedWorld> join(caf::actor worker, caf::actor endpoint);
  /// @return the exit code rank 0 sent, or 1 with `lost` set when rank 0 went away first.
  int serve(std::string& lost);

 private:
  caf::actor_system& system_;
  LaunchInfo info_;
  std::unique_ptr<caf::scoped_actor> self_;
  caf::actor world_;
};

}  // namespace stagehand
