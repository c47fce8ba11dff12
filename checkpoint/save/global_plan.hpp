#pragma once

// The first two steps of a save, in the shape of DCP's: every rank makes a local plan of what
// it holds, and the coordinator makes the global plan from all of them before any byte is
// written: it checks that the ranks agree, deduplicates replicas and chooses who writes what.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "stagehand/core/sharded_tensor.hpp"
#include "stagehand/core/status.hpp"

namespace stagehand {

/// What one rank holds for one save: its blocks (with the replica ids its owner gave them) and
/// its small objects.
struct LocalPlan {
  int rank = 0;
  std::int64_t step = 0;
  /// structure_signature() of `tensors`: while it does not change, the global plan is reused.
  std::uint64_t signature = 0;
  /// `tensors` left out: they are the same as in this rank's last plan with this signature
  /// (the coordinator keeps it), so that an unchanged structure does not travel at every save.
  bool cached = false;
  std::vector<ShardedTensorDesc> tensors;
  std::map<std::string, std::string> objects;
};

/// For CAF's serialization: local plans travel from every rank to the coordinator.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, LocalPlan& x) {
  return f(x.rank, x.step, x.signature, x.cached, x.tensors, x.objects);
}

/// Which of its blocks each rank writes, by index into its local plan's tensors, ascending.
struct GlobalPlan {
  std::vector<std::vector<std::uint32_t>> writes;
  /// The signature of every rank's local plan, by rank: the plan holds while they do not change.
  std::vector<std::uint64_t> signatures;
};

/// Makes the global plan of one save from every rank's local plan (`plans[r]` is rank r's).
///
/// Checks, each failure naming the tensor, object or rank: every rank planned the same step;
/// every block is valid (validate()); a tensor has one dtype and global shape on every rank;
/// the distinct blocks of a tensor tile its global shape (none overlap, together they hold
/// every element); an object has one value on every rank; names and values are UTF-8.
///
/// Blocks that several ranks hold (the same tensor, offsets and shape) are replicas, written
/// once: some holder must have it with replica id 0 (else an error), and the writer is chosen
/// among all its holders (the bytes of a replica are the same) by balance_writers(), largest
/// blocks first, so that every rank writes about its share.
/// @pre plans.size() == world size, plans[r].rank == r.
Result<GlobalPlan> make_global_plan(const std::vector<const LocalPlan*>& plans);

/// A copy of `state` in which the blocks `writes` names (by index) have replica id 0 and every
/// other block replica id 1: what a rank's SaveEngine writes for the global plan. Tensor data is
/// shared, not copied.
StateDict apply_writes(const StateDict& state, const std::vector<std::uint32_t>& writes);
/// Whether `writes` (sorted indices) names exactly the blocks of `state` with replica id 0: then
/// `state` saves as the global plan says as it is, and apply_writes' copy is not needed.
bool writes_own_replicas(const StateDict& state, const std::vector<std::uint32_t>& writes);

/// The global plan of `states` (rank r's is states[r], all in one process) applied to each:
/// what each rank's SaveEngine writes. Errors as make_global_plan's, each state's validate()
/// first.
Result<std::vector<StateDict>> planned_states(const std::vector<const StateDict*>& states, std::int64_t step);

}  // namespace stagehand
