#include "stagehand/checkpoint/save/global_plan.hpp"

#include <algorithm>
#include <map>
#include <utility>

#include "stagehand/checkpoint/format/block_bytes.hpp"
#include "stagehand/checkpoint/metadata/metadata_validation.hpp"
#include "stagehand/checkpoint/save/planner.hpp"
#include "stagehand/core/utf8.hpp"

namespace stagehand {

namespace {

/// One distinct block of a tensor and the ranks that hold it.
struct Block {
  Shape shape;
  std::uint64_t bytes = 0;
  /// (rank, index in its local plan) of the holders with replica id 0, and of the others.
  std::vector<std::pair<int, std::uint32_t>> primary;
  std::vector<std::pair<int, std::uint32_t>> replicas;
};

struct TensorBlocks {
  DType dtype = DType::f32;
  Shape global_shape;
  /// The rank that first showed the tensor, for messages.
  int first_rank = 0;
  /// By offset.
  std::map<Shape, Block> blocks;
};

std::string rank_list(const std::vector<std::pair<int, std::uint32_t>>& holders) {
  std::string out;
  for (const auto& [rank, index] : holders) out += (out.empty() ? "" : ", ") + std::to_string(rank);
  return out;
}

Status bad(const std::string& why) { return {ErrorCode::invalid_argument, "the save plan: " + why}; }

}  // namespace

Result<GlobalPlan> make_global_plan(const std::vector<const LocalPlan*>& plans) {
  if (plans.empty()) return Status{ErrorCode::internal, "a global plan needs at least one rank"};
  const int world = static_cast<int>(plans.size());
  GlobalPlan out;
  out.writes.resize(plans.size());
  const std::int64_t step = plans[0]->step;
  for (int r = 0; r < world; ++r) {
    const LocalPlan& p = *plans[static_cast<std::size_t>(r)];
    if (p.rank != r) return Status{ErrorCode::internal, "the local plan at place " + std::to_string(r) + " is rank " +
                                                            std::to_string(p.rank) + "'s"};
    if (p.step != step) {
      return bad("rank " + std::to_string(r) + " saves step " + std::to_string(p.step) + " while rank 0 saves step " +
                 std::to_string(step) + "; every rank must save the same step");
    }
    out.signatures.push_back(p.signature);
  }
  // Objects: one value each, whichever ranks name them.
  std::map<std::string, std::pair<const std::string*, int>> objects;
  for (int r = 0; r < world; ++r) {
    for (const auto& [name, value] : plans[static_cast<std::size_t>(r)]->objects) {
      if (!is_valid_utf8(name) || !is_valid_utf8(value)) {
        return bad("object '" + name + "' of rank " + std::to_string(r) +
                   ": its name and value must be UTF-8 text (JSON holds no other)");
      }
      auto [it, inserted] = objects.try_emplace(name, &value, r);
      if (!inserted && *it->second.first != value) {
        return bad("object '" + name + "' differs between rank " + std::to_string(it->second.second) + " and rank " +
                   std::to_string(r) + "; give per-rank objects per-rank names");
      }
    }
  }
  // Every block, by tensor (in name order, so that of several bad tensors the first by name is
  // named) and offset.
  std::map<std::string, TensorBlocks> tensors;
  for (int r = 0; r < world; ++r) {
    const auto& descs = plans[static_cast<std::size_t>(r)]->tensors;
    for (std::uint32_t i = 0; i < descs.size(); ++i) {
      const ShardedTensorDesc& d = descs[i];
      const std::string where = "tensor '" + d.name + "' of rank " + std::to_string(r);
      if (Status valid = d.validate(); !valid.is_ok()) return bad(where + ": " + valid.message());
      if (!is_valid_utf8(d.name)) return bad(where + ": its name must be UTF-8 text (JSON holds no other)");
      auto [t, inserted] = tensors.try_emplace(d.name);
      if (inserted) {
        if (!checked_nbytes(d.global_shape, dtype_size(d.dtype))) {
          return bad(where + ": its global shape " + d.global_shape.to_string() + " holds more than 2^63 bytes");
        }
        t->second = TensorBlocks{d.dtype, d.global_shape, r, {}};
      } else if (t->second.dtype != d.dtype || !(t->second.global_shape == d.global_shape)) {
        return bad(where + " is " + std::string(dtype_name(d.dtype)) + " " + d.global_shape.to_string() +
                   ", on rank " + std::to_string(t->second.first_rank) + " " +
                   std::string(dtype_name(t->second.dtype)) + " " + t->second.global_shape.to_string() +
                   ": ranks must agree on every tensor's dtype and global shape");
      }
      auto [b, fresh] = t->second.blocks.try_emplace(d.global_offset);
      Block& block = b->second;
      if (fresh) {
        block.shape = d.local_shape;
        block.bytes = d.nbytes();
      } else if (!(block.shape == d.local_shape)) {
        const int other = !block.primary.empty() ? block.primary.front().first : block.replicas.front().first;
        return bad(where + " holds a block of shape " + d.local_shape.to_string() + " at " +
                   d.global_offset.to_string() + ", rank " + std::to_string(other) + " one of shape " +
                   block.shape.to_string() + " there");
      }
      (d.replica_id == 0 ? block.primary : block.replicas).emplace_back(r, i);
    }
  }
  std::vector<std::uint64_t> base(plans.size(), 0);
  std::vector<ReplicatedChunk> shared;
  std::vector<const Block*> shared_blocks;
  for (const auto& [name, t] : tensors) {
    TensorMeta tiling{t.dtype, t.global_shape, {}};
    for (const auto& [offset, block] : t.blocks) tiling.chunks.push_back(ChunkMeta{offset, block.shape, "", 0, 0, 0});
    if (auto why = tiling_error(tiling)) return bad("tensor '" + name + "': " + *why);
    for (const auto& [offset, block] : t.blocks) {
      if (block.primary.empty()) {
        return bad("tensor '" + name + "': no rank holds its block at " + offset.to_string() +
                   " with replica id 0 (ranks " + rank_list(block.replicas) + " hold replicas of it)");
      }
      if (block.primary.size() + block.replicas.size() == 1) {
        const auto [rank, index] = block.primary.front();
        out.writes[static_cast<std::size_t>(rank)].push_back(index);
        base[static_cast<std::size_t>(rank)] += block.bytes;
        continue;
      }
      ReplicatedChunk chunk{chunk_key(name, offset), block.bytes, {}};
      // Every holder has the same bytes (a replica id > 0 marks a copy): any of them may write it.
      for (const auto& [rank, index] : block.primary) chunk.holders.push_back(rank);
      for (const auto& [rank, index] : block.replicas) chunk.holders.push_back(rank);
      shared.push_back(std::move(chunk));
      shared_blocks.push_back(&block);
    }
  }
  const std::vector<int> writers = balance_writers(shared, std::move(base));
  for (std::size_t c = 0; c < shared.size(); ++c) {
    for (const auto* holders : {&shared_blocks[c]->primary, &shared_blocks[c]->replicas}) {
      for (const auto& [rank, index] : *holders) {
        if (rank == writers[c]) out.writes[static_cast<std::size_t>(rank)].push_back(index);
      }
    }
  }
  for (auto& w : out.writes) std::sort(w.begin(), w.end());
  return out;
}

StateDict apply_writes(const StateDict& state, const std::vector<std::uint32_t>& writes) {
  StateDict view = state;
  for (auto& t : view.tensors) t.desc.replica_id = 1;
  for (std::uint32_t i : writes) {
    if (i < view.tensors.size()) view.tensors[i].desc.replica_id = 0;
  }
  return view;
}

bool writes_own_replicas(const StateDict& state, const std::vector<std::uint32_t>& writes) {
  std::size_t w = 0;
  for (std::size_t i = 0; i < state.tensors.size(); ++i) {
    const bool own = state.tensors[i].desc.replica_id == 0;
    const bool written = w < writes.size() && writes[w] == i;
    if (own != written) return false;
    if (written) ++w;
  }
  return w == writes.size();
}

Result<std::vector<StateDict>> planned_states(const std::vector<const StateDict*>& states, std::int64_t step) {
  std::vector<LocalPlan> locals(states.size());
  std::vector<const LocalPlan*> plans;
  for (std::size_t i = 0; i < states.size(); ++i) {
    SH_RETURN_IF_ERROR(states[i]->validate().with_context("rank " + std::to_string(i)));
    locals[i] = LocalPlan{static_cast<int>(i), step, 0, false, states[i]->descriptors(), states[i]->objects};
    plans.push_back(&locals[i]);
  }
  SH_ASSIGN_OR_RETURN(GlobalPlan global, make_global_plan(plans));
  std::vector<StateDict> out;
  for (std::size_t i = 0; i < states.size(); ++i) out.push_back(apply_writes(*states[i], global.writes[i]));
  return out;
}

}  // namespace stagehand
