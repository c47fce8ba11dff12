#pragma once

#include <caf/actor.hpp>
#include <caf/fwd.hpp>
#include <chrono>
#include <string>

#include "stagehand/core/status.hpp"

namespace stagehand {

/// Spawns the rendezvous store of a world of processes (on rank 0): a key-value actor where the
/// members of each Gloo group publish their addresses and read each other's.
///
/// It answers over the connection every rank has already made to rank 0 (CAF's middleman), so it
/// works wherever the world forms, on one host or several, and needs neither a shared file system
/// (Gloo's FileStore) nor another port or service (this Gloo has no TCP store; Redis would be one
/// more thing to run).
///
/// Protocol (actors/messages.hpp): `rdv_set_atom, key, value` stores a value (a later set of the
/// same key replaces it); `rdv_get_atom, key` is answered with the value once some rank has set it,
/// without polling: the asker's own time limit ends its wait. Values live as long as the actor, a
/// few hundred bytes per group member.
caf::actor spawn_rendezvous_store(caf::actor_system& system);

/// What is left until `deadline`, at least 1 ms: the limit of one wait of a call that must end
/// by it (the rendezvous client's requests, a Gloo mesh's connects, a Gloo group's waits).
std::chrono::milliseconds left_until(std::chrono::steady_clock::time_point deadline);

/// A blocking client of a rendezvous store, for threads that are not actors (a Gloo group
/// connecting at its first collective). Every call ends at its deadline; an answer that comes
/// later counts as none (timeout).
///
/// Thread-safety: any thread may call any member; each call uses its own scoped actor.
class RendezvousClient {
 public:
  using Clock = std::chrono::steady_clock;

  RendezvousClient(caf::actor_system& system, caf::actor store);

  /// Publishes `value` under `key`.
  /// @returns timeout when the store did not confirm by `deadline`; aborted when it cannot be
  ///          reached (rank 0's process is gone).
  Status set(const std::string& key, std::string value, Clock::time_point deadline);

  /// The value of `key`, once some rank has published it.
  /// @returns timeout when no rank published it by `deadline`; aborted when the store cannot be
  ///          reached.
  Result<std::string> get(const std::string& key, Clock::time_point deadline);

 private:
  caf::actor_system& system_;
  caf::actor store_;
};

}  // namespace stagehand
