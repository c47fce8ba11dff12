#pragma once

// Weight sync between processes of one host, over shared memory (POSIX shm), in versions.
//
// Every trainer rank owns one segment, "/stagehand-<channel>-s<rank>": its blocks' descriptors and
// a ring of `buckets` slots of `bucket_bytes` each (the rank's extra memory: `buckets` buckets,
// whatever the model's size). A push streams the blocks that rank sends (the save's global plan:
// replicas split between their holders, never gathered to one rank) through the ring; every
// receiver that asked for a version copies the parts of each bucket its own blocks overlap
// straight into its tensors, and acknowledges the bucket. No socket and no intermediate copy on
// the receiver's side: one copy into the ring, one out of it per receiver.
//
// Versions: each push carries a step. A receiver takes part in a push only while it waits in
// receive(), so a receiver that is busy generating never slows a push, and one that joins late
// gets the next version pushed. A push waits for a receiver at most `receiver_timeout` per bucket:
// one that dies (its process is gone) or stays behind longer is dropped from that version and
// named in the push's report; the others still get the version.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "stagehand/checkpoint/sync/weight_channel.hpp"
#include "stagehand/core/sharded_tensor.hpp"
#include "stagehand/core/status.hpp"

namespace stagehand {

/// The trainer side of a channel: one per trainer rank.
class ShmWeightPublisher final : public WeightPublisher {
 public:
  /// Creates rank `rank`'s segment (one left by a process that died is replaced), waits up to
  /// `connect_timeout` for the other `world - 1` ranks' segments and plans which blocks this rank
  /// sends. `blocks` are this rank's descriptors, with the replica ids its layout gives them.
  /// Errors: a channel name that is not [A-Za-z0-9_.-]+, a rank outside [0, world), ranks missing
  /// after the timeout, what the global plan refuses (naming the rank and tensor).
  static Result<std::unique_ptr<ShmWeightPublisher>> create(const std::string& channel, int rank, int world,
                                                            std::vector<ShardedTensorDesc> blocks,
                                                            const WeightChannelOptions& options = {});
  ~ShmWeightPublisher() override;
  ShmWeightPublisher(const ShmWeightPublisher&) = delete;
  ShmWeightPublisher& operator=(const ShmWeightPublisher&) = delete;

  /// Pushes `state` as version `step` to every receiver now waiting in receive(). With `wait_for`,
  /// it first waits (at most `receiver_timeout`) until that many receivers wait, for a trainer
  /// that must not push before its inference ranks are ready (the sync trainer before the next
  /// rollout, the fully-async trainer's generators); the shortfall, if any, is in the report's
  /// `dropped`. Returns when each receiver taking part took every bucket or was dropped; it
  /// waits at most `receiver_timeout` per bucket for one receiver. `state` must have the blocks
  /// given at creation (host or device memory) and not change while this runs.
  Result<PushReport> push(std::int64_t step, const StateDict& state, int wait_for = 0) override;

  /// Bytes this rank sends per version (its share of the model).
  std::uint64_t sent_bytes() const override;

  /// Receivers waiting in receive() now: those the next push would serve.
  int waiting_receivers() const override;
  int late_receivers(std::int64_t step) const override;
  Result<PushReport> push_late(std::int64_t step, const StateDict& state) override;

  struct Impl;

 private:
  /// push(), or push_late() with `late_only`: only entries waiting for at most `step` without it.
  Result<PushReport> push_version(std::int64_t step, const StateDict& state, int wait_for, bool late_only);
  explicit ShmWeightPublisher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// The inference side: one per inference rank (or per process that wants the weights).
class ShmWeightReceiver final : public WeightReceiver {
 public:
  /// Opens every trainer rank's segment of `channel` (waiting up to `connect_timeout` for them),
  /// checks that the trainer ranks hold each of `blocks` (same dtype and global shape) and
  /// registers as `name` with each rank that sends a part of them.
  static Result<std::unique_ptr<ShmWeightReceiver>> connect(const std::string& channel, const std::string& name,
                                                            std::vector<ShardedTensorDesc> blocks,
                                                            const WeightChannelOptions& options = {});
  ~ShmWeightReceiver() override;
  ShmWeightReceiver(const ShmWeightReceiver&) = delete;
  ShmWeightReceiver& operator=(const ShmWeightReceiver&) = delete;

  /// Waits for the next version whose step is at least `min_step` and fills `state` (the blocks
  /// given at connect, host or device memory) with it in place, every rank's part of one step. Returns that
  /// step. Once a push took it in, it takes part in that version even past `timeout` (the
  /// publisher drops it when it is too slow), up to a second `timeout` (at least 1 s). Errors: nothing within `timeout` (naming the trainer ranks still awaited), a trainer
  /// rank that dropped this receiver (too slow) or whose process is gone; after an error the
  /// state's contents are a mix of versions and the next receive() starts over.
  Result<std::int64_t> receive(StateDict& state, std::int64_t min_step, std::chrono::milliseconds timeout) override;

  /// The newest step any trainer rank finished pushing (-1 before the first); for a staleness test.
  std::int64_t newest_pushed_step() const override;

  /// Ends a receive() running on another thread within 5 ms (an error: "was stopped"), and
  /// every later one. Thread-safe.
  void stop() override;

  struct Impl;

 private:
  explicit ShmWeightReceiver(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace stagehand
