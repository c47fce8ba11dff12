#pragma once

// Weight sync from trainer ranks to inference ranks in another layout, planned with the
// checkpoints' vocabulary: each side describes its blocks as ShardedTensorDescs; the global plan
// of a save (make_global_plan) chooses which trainer rank sends each distinct block (replicas
// split between their holders, balanced by bytes, never gathered to one rank); the resharding
// geometry of loads (reshard.hpp) cuts each sent block into the parts every receiver block
// overlaps.
//
// This is the planning and the in-process transport (every receiver in the senders' process:
// a copy from each sent block straight into each receiver's tensor, no intermediate buffer).
// Between processes of one host, in versions: shm_channel.hpp. TCP and the device path are not
// built yet (docs/weight_sync.md).

#include <cstdint>
#include <vector>

#include "stagehand/core/sharded_tensor.hpp"
#include "stagehand/core/status.hpp"

namespace stagehand {

/// One part of a weight sync: the block `sender_tensor` of sender `sender` overlaps the block
/// `receiver_tensor` of receiver `receiver` in `bytes` bytes, which that sender sends.
struct SyncTransfer {
  int sender = 0;
  std::uint32_t sender_tensor = 0;
  int receiver = 0;
  std::uint32_t receiver_tensor = 0;
  std::uint64_t bytes = 0;
};

/// Who sends what to whom, for one structure of each side; reused while neither changes.
struct WeightSyncPlan {
  /// By sender, then receiver, then receiver tensor.
  std::vector<SyncTransfer> transfers;
  /// Bytes each sender sends, all receivers together.
  std::vector<std::uint64_t> sent_bytes;
  /// Bytes each receiver gets (the sum of its blocks').
  std::vector<std::uint64_t> received_bytes;
  /// structure_signature() of each side's descriptors, by rank: a state of another structure is
  /// refused by sync_in_process().
  std::vector<std::uint64_t> sender_signatures;
  std::vector<std::uint64_t> receiver_signatures;
};

/// Plans a weight sync from `senders[r]` (trainer rank r's blocks, with the replica ids its owner
/// gave them) to `receivers[q]` (inference rank q's blocks; their replica ids are ignored: each
/// receiver gets all of its blocks).
///
/// Errors, each naming the rank and tensor: what make_global_plan() refuses among the senders (a
/// tensor of two dtypes or shapes, blocks that overlap or leave elements out, a replica no holder
/// has with replica id 0, an invalid block); an invalid receiver block; a receiver tensor that no
/// sender holds, or of another dtype or global shape than the senders'.
Result<WeightSyncPlan> plan_weight_sync(const std::vector<std::vector<ShardedTensorDesc>>& senders,
                                        const std::vector<std::vector<ShardedTensorDesc>>& receivers);

/// Runs `plan` between states of one process: copies every transfer from its sender's tensor
/// into its receiver's, in place, on up to `threads` threads (the receivers split between them).
/// Every receiver block is wholly written. Host memory on both sides; a device tensor is refused
/// (the device path is not built yet).
/// @pre nothing else writes the receivers' tensors or modifies the senders' while it runs.
/// @return an error, naming the rank, when a state's count differs from the plan's or its
///         structure is not the one planned.
Status sync_in_process(const WeightSyncPlan& plan, const std::vector<const StateDict*>& senders,
                       const std::vector<StateDict*>& receivers, int threads = 1);

}  // namespace stagehand
