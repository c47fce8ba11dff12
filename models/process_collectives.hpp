#pragma once

#include <caf/actor.hpp>
#include <caf/fwd.hpp>
#include <chrono>
#include <memory>
#include <string>

#include "stagehand/core/status.hpp"
#include "stagehand/models/collectives.hpp"

namespace stagehand {

class GlooProcess;

/// The collectives of one process's rank in a world of processes, on Gloo's TCP transport: one
/// Gloo context per tensor- and per data-parallel group (GlooGroup: its reproducibility, wire
/// protocol and failures), connected (full mesh) at the group's first collective. The tensor bytes
/// travel between the ranks directly; CAF carries no tensor bytes, only the rendezvous (each
/// rank's Gloo addresses, a few hundred bytes per group) through rank 0's store
/// (spawn_rendezvous_store(): host_rendezvous() here, handed to every rank with the world).
///
/// Failures: every wait ends within `timeout` (trainer.call_timeout_s). A member whose process
/// died fails the collective at once (its TCP connection closes), a member that does not take part
/// when the limit passes; both errors name the member's rank.
///
/// Thread-safety: set_rendezvous() and close() from any thread; each group as Collective says.
/// @pre the process ignores SIGPIPE (a write to a peer that died must fail, not end the process).
class ProcessCollectives {
 public:
  /// @param master_addr rank 0's host: Gloo listens on this host's address on the route to it.
  /// @param timeout limit of one collective (trainer.call_timeout_s), and of connecting a group.
  ProcessCollectives(caf::actor_system& system, std::string master_addr,
                     std::chrono::milliseconds timeout);
  ~ProcessCollectives();
  ProcessCollectives(const ProcessCollectives&) = delete;
  ProcessCollectives& operator=(const ProcessCollectives&) = delete;

  /// Rank 0 only: spawns the rendezvous store (a second call returns the same one).
  caf::actor host_rendezvous();
  /// Where every group meets; groups wait for it at their first collective.
  void set_rendezvous(caf::actor store);
  /// Releases every waiting collective with an error (shutdown, a peer died); later ones fail.
  void close(const std::string& reason);

  /// The tensor- and data-parallel groups of `rank`, with the same member order (and therefore
  /// the same sums, bit for bit) as make_host_groups().
  RankGroups groups(const ParallelLayout& layout, int rank);

 private:
  caf::actor_system& system_;
  std::shared_ptr<GlooProcess> process_;
  caf::actor store_;
};

}  // namespace stagehand
