#pragma once

// Weight sync between processes, in versions: what every transport offers. A publisher on each
// trainer rank pushes its share of the weights (the save's global plan: replicas split between
// holders, never gathered to one rank); a receiver on each inference rank gets exactly its
// blocks, in its own layout, filled in place. Transports: shared memory on one host
// (shm_channel.hpp) and TCP between processes and hosts (tcp_channel.hpp);
// open_weight_publisher / connect_weight_receiver pick one by the channel's name.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "stagehand/core/sharded_tensor.hpp"
#include "stagehand/core/staging_fence.hpp"
#include "stagehand/core/status.hpp"

namespace stagehand {

struct WeightChannelOptions {
  /// Bytes of one bucket (rounded up to 64).
  std::uint64_t bucket_bytes = 64ull << 20;
  /// Slots of the ring: pushes pipeline that many buckets ahead of the slowest receiver.
  int buckets = 2;
  /// Receivers one trainer rank serves at most.
  int max_receivers = 64;
  /// How long a push waits for one receiver to take one bucket before it drops it from the version.
  std::chrono::milliseconds receiver_timeout{10000};
  /// How long creating a publisher waits for the other trainer ranks' segments, and connecting a
  /// receiver for all of them.
  std::chrono::milliseconds connect_timeout{30000};
};

/// What one push did.
struct PushReport {
  std::uint64_t version = 0;
  std::int64_t step = 0;
  /// Bytes this rank pushed through its ring.
  std::uint64_t bytes = 0;
  /// Receivers (by name) that got the whole version from this rank.
  std::vector<std::string> delivered;
  /// Receivers dropped from this version, each with why ("'gen-1' (pid 123) died", "... took no
  /// bucket for 10000 ms").
  std::vector<std::string> dropped;
};

/// A trainer rank's side of a channel (any transport).
class WeightPublisher {
 public:
  virtual ~WeightPublisher() = default;
  /// Pushes `state` as version `step` to every receiver now waiting in receive(). With `wait_for`,
  /// it first waits (at most `receiver_timeout`) until that many receivers wait; the shortfall,
  /// if any, is in the report's `dropped`. Returns when each receiver taking part took the
  /// version or was dropped (waiting at most `receiver_timeout` per bucket for one receiver).
  /// `state` must have the blocks given at creation and not change while this runs. Tensors in
  /// device memory are copied to host memory through the copy engine (copy_engine.hpp) on their
  /// way out: into the ring (shared memory) or one bucket per receiver being sent to (TCP).
  virtual Result<PushReport> push(std::int64_t step, const StateDict& state, int wait_for = 0) = 0;
  /// Bytes this rank sends per version and receiver (its share of the model).
  virtual std::uint64_t sent_bytes() const = 0;
  /// Receivers waiting in receive() now: those the next push would serve.
  virtual int waiting_receivers() const = 0;
  /// Late receivers of `step`: those waiting now for a step of at most `step` (their receive()'s
  /// min_step) that have not got `step` from this rank (they joined after its push, or lost it).
  virtual int late_receivers(std::int64_t step) const = 0;
  /// Pushes `state` as `step` again to the late receivers of `step` only (none of the others
  /// takes part); at once with nobody when there is none. Bounded as push() is.
  virtual Result<PushReport> push_late(std::int64_t step, const StateDict& state) = 0;
};

/// An inference rank's side of a channel (any transport).
class WeightReceiver {
 public:
  virtual ~WeightReceiver() = default;
  /// Waits for the next version whose step is at least `min_step` and fills `state` (the blocks
  /// given at connect; device tensors through the copy engine) with it in place, every trainer rank's part of one step;
  /// returns that step. Once a push took it in, it takes part in that version even past
  /// `timeout`, up to a second `timeout` (at least 1 s). After an error the state's contents are
  /// a mix of versions and the next receive() starts over.
  virtual Result<std::int64_t> receive(StateDict& state, std::int64_t min_step, std::chrono::milliseconds timeout) = 0;
  /// The newest step any trainer rank finished pushing (-1 before the first or when none answers).
  virtual std::int64_t newest_pushed_step() const = 0;
  /// Ends a receive() running on another thread at once (an error: "was stopped"), and every later one.
  virtual void stop() = 0;
};

/// Serves receivers that join late the newest version: until someone waits at `fence` (about to
/// modify `state`) or `stop` is set, each time late receivers of `step` wait (late_receivers()),
/// pushes `state` as `step` to them (push_late(): receivers that have it or wait for a later step
/// take no part). The caller
/// pushed `state` as `step` and holds `fence` closed, so `state` is still that version. Each push's
/// report goes to `on_report`. Returns within `poll` of a waiter or of `stop`, or once a push
/// under way ends (bounded as push() is); the first push error, if any.
Status serve_late_receivers(WeightPublisher& publisher, std::int64_t step, const StateDict& state, StagingFence& fence,
                            const std::atomic<bool>& stop, const std::function<void(const PushReport&)>& on_report,
                            std::chrono::milliseconds poll = std::chrono::milliseconds(5));

/// True when `channel` names a TCP channel: "tcp://HOST:PORT" (trainer rank 0's address).
bool is_tcp_channel(const std::string& channel);

/// The publisher of trainer rank `rank` of `world` on `channel`: TCP for "tcp://HOST:PORT" (rank 0
/// listens there, the others register with it), shared memory for any other name.
Result<std::unique_ptr<WeightPublisher>> open_weight_publisher(const std::string& channel, int rank, int world,
                                                               std::vector<ShardedTensorDesc> blocks,
                                                               const WeightChannelOptions& options = {});

/// A receiver named `name` of `blocks` on `channel` (chosen as open_weight_publisher chooses).
Result<std::unique_ptr<WeightReceiver>> connect_weight_receiver(const std::string& channel, const std::string& name,
                                                                std::vector<ShardedTensorDesc> blocks,
                                                                const WeightChannelOptions& options = {});

}  // namespace stagehand
