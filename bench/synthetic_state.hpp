#pragma once

#include <cstdint>

#include "stagehand/core/device.hpp"
#include "stagehand/core/sharded_tensor.hpp"

namespace stagehand {

/// Shape of a deterministic synthetic sharded state, like a model's tensor- and data-parallel state.
struct SyntheticStateSpec {
  int ranks = 2;
  /// Bytes each rank holds (replicas included), approximately.
  std::uint64_t bytes_per_rank = 64u << 20;
  int tensors = 16;
  std::uint64_t seed = 1;
  /// Elements per row of every tensor; a tensor has at least one row, so a small value with
  /// many tensors gives small shards (the commit and metadata at many ranks, not the disk).
  std::int64_t columns = 1024;
};

/// One rank's state: three in four tensors are split along dimension 0 across ranks, every fourth
/// is replicated on every rank with its replica 0 on rank (index mod ranks). Dtypes cycle over
/// f32, bf16, f16, i64, u8. Contents depend only on the seed and the element's global position,
/// so the same spec always gives the same bytes.
Result<StateDict> make_synthetic_state(const SyntheticStateSpec& spec, int rank, Device device);

}  // namespace stagehand
