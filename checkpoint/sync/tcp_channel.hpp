#pragma once

// Weight sync between processes and hosts over TCP, in versions (weight_channel.hpp).
//
// Trainer rank 0 listens on the channel's address ("HOST:PORT"); every other rank listens on a
// port of its own choosing and registers it, with its blocks' descriptors, with rank 0. Once all
// `world` ranks registered, each makes the save's global plan over them and sends only the
// blocks it gives it (replicas split between their holders, never gathered to one rank). A
// receiver asks rank 0 for the directory (every rank's address and descriptors), checks that its
// blocks are held and wholly covered, and connects to each rank that holds a part of them, giving
// its own blocks: that rank then streams exactly the byte ranges of its blocks the receiver's
// overlap (in the common row-split and whole-tensor layouts exactly the receiver's elements),
// straight from its tensors (no staging buffer on the trainer's side). A receiver reads each
// range straight into its tensor where it lands in one contiguous run there, and otherwise
// through one bucket of `bucket_bytes`.
//
// Versions and faults as over shared memory: a receiver takes part in a push only while it waits
// in receive(); a push waits for one receiver at most `receiver_timeout` per bucket of bytes;
// a receiver whose connection breaks (its process died) or that stays behind is dropped and
// named in the report ("'gen-1' (pid 4242 on 10.0.0.7) closed its connection mid-version"), the
// others still get the version, and the dropped one connects again at its next receive(). Each
// receiver acknowledges a version once it holds all of it: `delivered` names only those.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "stagehand/checkpoint/sync/weight_channel.hpp"
#include "stagehand/core/sharded_tensor.hpp"
#include "stagehand/core/status.hpp"

namespace stagehand {

/// The trainer side of a TCP channel: one per trainer rank.
class TcpWeightPublisher final : public WeightPublisher {
 public:
  /// `address` is trainer rank 0's "HOST:PORT" (an IPv4 address or a host name; rank 0 binds it,
  /// "0.0.0.0:PORT" for every interface). Rank 0 waits up to `connect_timeout` for the other
  /// ranks to register; the others wait as long for rank 0. Errors: an address that is not
  /// HOST:PORT, a port rank 0 cannot bind (naming it), a rank outside [0, world), ranks missing
  /// after the timeout (named), what the global plan refuses.
  static Result<std::unique_ptr<TcpWeightPublisher>> create(const std::string& address, int rank, int world,
                                                            std::vector<ShardedTensorDesc> blocks,
                                                            const WeightChannelOptions& options = {});
  ~TcpWeightPublisher() override;
  TcpWeightPublisher(const TcpWeightPublisher&) = delete;
  TcpWeightPublisher& operator=(const TcpWeightPublisher&) = delete;

  Result<PushReport> push(std::int64_t step, const StateDict& state, int wait_for = 0) override;
  std::uint64_t sent_bytes() const override;
  int waiting_receivers() const override;
  int late_receivers(std::int64_t step) const override;
  Result<PushReport> push_late(std::int64_t step, const StateDict& state) override;
  /// The port this rank listens on (rank 0: the address's; the others: their own).
  int port() const;

  struct Impl;

 private:
  /// push(), or push_late() with `late_only`: only receivers waiting for at most `step` without it.
  Result<PushReport> push_version(std::int64_t step, const StateDict& state, int wait_for, bool late_only);
  explicit TcpWeightPublisher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// The inference side of a TCP channel: one per inference rank (or per process that wants the weights).
class TcpWeightReceiver final : public WeightReceiver {
 public:
  /// Asks trainer rank 0 at `address` ("HOST:PORT") for the directory (waiting up to
  /// `connect_timeout` for it to be complete), checks that the trainer ranks hold each of
  /// `blocks` (same dtype and global shape, wholly covered) and registers as `name` with each
  /// rank that sends a part of them.
  static Result<std::unique_ptr<TcpWeightReceiver>> connect(const std::string& address, const std::string& name,
                                                            std::vector<ShardedTensorDesc> blocks,
                                                            const WeightChannelOptions& options = {});
  ~TcpWeightReceiver() override;
  TcpWeightReceiver(const TcpWeightReceiver&) = delete;
  TcpWeightReceiver& operator=(const TcpWeightReceiver&) = delete;

  /// As WeightReceiver::receive. Errors also: a trainer rank that cannot be reached (gone), one
  /// that dropped this receiver or whose connection broke mid-version; the next call connects again.
  Result<std::int64_t> receive(StateDict& state, std::int64_t min_step, std::chrono::milliseconds timeout) override;
  /// Asks every trainer rank (at most 1 s each); -1 when none answers.
  std::int64_t newest_pushed_step() const override;
  void stop() override;

  struct Impl;

 private:
  explicit TcpWeightReceiver(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace stagehand
