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

#include "stagehand/core/status.hpp"
#include "stagehand/models/collectives.hpp"

namespace stagehand {

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

}  // namespace stagehand
