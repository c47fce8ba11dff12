#pragma once

#include <caf/actor.hpp>
#include <caf/fwd.hpp>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "stagehand/core/status.hpp"
#include "stagehand/models/collectives.hpp"

namespace stagehand {

class GlooGroup;
class GlooProcess;

/// The collectives of one process's rank in a world of processes, on Gloo's TCP transport: one
/// Gloo context per tensor- and per data-parallel group (GlooGroup), connected (full mesh) at the
/// group's first collective. The tensor bytes travel between the ranks directly; CAF carries no
/// tensor bytes, only the rendezvous (each rank's Gloo addresses, a few hundred bytes per group)
/// through rank 0's store (spawn_rendezvous_store(): host_rendezvous() here, handed to every rank
/// with the world).
///
/// Limits: every wait ends within `timeout` (trainer.call_timeout_s), and its error names the
/// rank waited for and which limit passed: the connect limit (the rendezvous, the addresses, the
/// connections of a group), the call limit (one collective), the close limit (the goodbye). A
/// member whose process died fails the wait at once (its connection closes).
///
/// Ending: close() at the end of a run, abort() on a failure. Destroying it without close() aborts.
///
/// Thread-safety: set_rendezvous(), abort() and close() from any thread (close() may run while a
/// collective waits on another thread: it releases it); each group as Collective says.
/// @pre the process ignores SIGPIPE (a write to a peer that died must fail, not end the process).
class ProcessCollectives {
 public:
  /// @param master_addr rank 0's host: Gloo listens on this host's address on the route to it.
  /// @param timeout the connect, call and close limit (trainer.call_timeout_s).
  /// @param timeout_setting how `timeout` is set, for the messages when it passes; may be empty.
  ProcessCollectives(caf::actor_system& system, std::string master_addr,
                     std::chrono::milliseconds timeout, std::string timeout_setting = {});
  ~ProcessCollectives();
  ProcessCollectives(const ProcessCollectives&) = delete;
  ProcessCollectives& operator=(const ProcessCollectives&) = delete;

  /// Rank 0 only: spawns the rendezvous store (a second call returns the same one).
  caf::actor host_rendezvous();
  /// Where every group meets; groups wait for it at their first collective.
  void set_rendezvous(caf::actor store);

  /// Releases every waiting collective with an error at once (a group still connecting, at its
  /// connect limit); later ones fail at once. For a failure (a peer died, the trainer failed): it
  /// waits for no one. A released or failing collective resets its group's connections, so that
  /// the members waiting on this rank there fail at once too.
  void abort(const std::string& reason);

  /// Ends this rank's collectives so that no member's last one is cut short: releases a
  /// collective still waiting (as abort(); one still connecting ends within its connect limit,
  /// and close() waits for that), then says goodbye in every group that is in step
  /// (GlooGroup) and waits, within the close limit, until every other member said goodbye too,
  /// that is, finished its last collective; only then are the connections closed (a peer still
  /// reading would otherwise be reset). Every member calls it at the end of its run; a second
  /// call returns ok at once.
  /// @post no collective of this process waits or runs; its connections are closed.
  /// @returns ok when every member of every group in step said goodbye; otherwise an error
  ///          naming, in each group, the first member that did not (timeout: not within the close
  ///          limit, which it names; aborted: its process died).
  Status close(const std::string& reason);

  /// The tensor- and data-parallel groups of `rank`, with the same member order (and therefore
  /// the same sums, bit for bit) as make_host_groups().
  RankGroups groups(const ParallelLayout& layout, int rank);

 private:
  caf::actor_system& system_;
  std::shared_ptr<GlooProcess> process_;
  caf::actor store_;
  /// One close() at a time.
  std::mutex close_mutex_;
  std::mutex groups_mutex_;
  std::vector<std::weak_ptr<GlooGroup>> groups_;
};

}  // namespace stagehand
