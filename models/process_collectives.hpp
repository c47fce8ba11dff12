#pragma once

#include <caf/actor.hpp>
#include <caf/fwd.hpp>
#include <chrono>
#include <memory>
#include <string>

#include "stagehand/core/status.hpp"
#include "stagehand/models/collectives.hpp"

namespace stagehand {

/// The collectives of one process's rank in a world of processes, on Gloo's TCP transport: one
/// Gloo context per tensor- and per data-parallel group, connected (full mesh) at the group's first
/// collective. The tensor bytes travel between the ranks directly; CAF carries no tensor bytes,
/// only the rendezvous (each rank's Gloo addresses, a few hundred bytes per group).
///
/// Rendezvous: a key-value store actor on rank 0 (spawned by host_rendezvous(), handed to every
/// rank with the world). It goes through the connection every rank has already made to rank 0, so
/// it works wherever the world forms, on one host or several, and needs neither a shared file
/// system (Gloo's FileStore) nor another port or service (this Gloo has no TCP store; Redis would
/// be one more thing to run).
///
/// Reproducibility: a reduction is an all-gather of every member's whole buffer followed by a sum
/// in member order, bit-identical to HostGroup. Each rank receives (members - 1) x the buffer
/// instead of a ring all-reduce's 2 (members - 1) / members x: the same for groups of two, more for
/// larger groups; the reference model's reductions are small (logits, gradients of one shard).
///
/// Latency: Gloo's TCP transport sends a message once the receiver has posted its receive, so
/// each group keeps the receive of its next collective posted (64 KiB per member; a larger message
/// sends its floats in a second transfer), and an all-gather carries each region's bounds in front
/// of its floats: one trip per collective for the reference model's messages.
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

  struct Shared;

 private:
  caf::actor_system& system_;
  std::shared_ptr<Shared> shared_;
  caf::actor store_;
};

}  // namespace stagehand
