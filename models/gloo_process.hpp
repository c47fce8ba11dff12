#pragma once

#include <caf/actor.hpp>
#include <caf/fwd.hpp>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include "stagehand/core/status.hpp"

namespace gloo::transport {
class Device;
class UnboundBuffer;
}  // namespace gloo::transport

namespace stagehand {

/// This host's address on the route to `master_addr` (a connected UDP socket sends nothing): the
/// address the other ranks reach this one at, on one host (127.0.0.1) or several; `master_addr`
/// itself when there is no route.
std::string local_address_towards(const std::string& master_addr);

/// What the Gloo groups of one process share: the actor system and the call limit, rank 0's
/// rendezvous store (once the world announces it), the process's one Gloo device, and the stop.
///
/// The stop: stop() records the first reason given and aborts the wait of every transfer a group
/// registered with track(); from then on track() refuses and await_rendezvous() fails, so a
/// collective started after the stop fails at once instead of waiting.
///
/// Thread-safety: every member may be called from any thread.
class GlooProcess {
 public:
  using Clock = std::chrono::steady_clock;

  /// @param master_addr rank 0's host: the device listens on this host's address on the route to
  ///        it.
  /// @param limit the limit of connecting a group, of one collective and of closing
  ///        (trainer.call_timeout_s).
  /// @param limit_setting how `limit` is set, for the messages when it passes; may be empty.
  GlooProcess(caf::actor_system& system, std::string master_addr, std::chrono::milliseconds limit,
              std::string limit_setting = {});

  // -- properties --

  caf::actor_system& system() const { return system_; }
  std::chrono::milliseconds limit() const { return limit_; }
  /// "the <which> limit of 2 s (trainer.call_timeout_s)": errors say which limit passed.
  std::string limit_text(const std::string& which) const;

  // -- rendezvous --

  /// Announces the store where the groups meet; wakes groups waiting for it.
  void set_rendezvous(caf::actor store);
  /// The store, once announced.
  /// @returns timeout when it was not announced by `deadline`; aborted once stopped.
  Result<caf::actor> await_rendezvous(Clock::time_point deadline);

  // -- device --

  /// The process's Gloo device, made at the first call: it listens on this host's address on the
  /// route to rank 0, or on the interface GLOO_SOCKET_IFNAME names (as in PyTorch).
  /// @returns io_error when Gloo cannot make it (an unknown interface, no address).
  Result<std::shared_ptr<gloo::transport::Device>> device();

  // -- stop --

  /// Records `reason` (the first reason given is kept) and aborts the wait of every tracked
  /// transfer.
  void stop(const std::string& reason);
  /// The reason, once stopped.
  std::optional<std::string> stopped() const;
  /// aborted, "collectives stopped: <reason>".
  Status stopped_status() const;
  /// Registers a transfer for stop() to abort.
  /// @returns false, registering nothing, once stopped.
  bool track(gloo::transport::UnboundBuffer* transfer);
  void untrack(gloo::transport::UnboundBuffer* transfer);

 private:
  caf::actor_system& system_;
  const std::string master_addr_;
  const std::chrono::milliseconds limit_;
  const std::string limit_setting_;

  mutable std::mutex mutex_;
  std::condition_variable announced_;
  caf::actor store_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::optional<std::string> stopped_;
  std::set<gloo::transport::UnboundBuffer*> tracked_;
};

}  // namespace stagehand
