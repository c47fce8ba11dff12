#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/sharded_tensor.hpp"
#include "strategy/format.hpp"

namespace stagehand {

/// Turns a user's path into a checkpoint folder: a `ckpt_path` root resolves through its tracker,
/// a `global_step_N` folder is taken as it is. A `.tmp` folder or an uncommitted one is an error.
Result<std::string> resolve_checkpoint(const std::string& path);

/// Reads `policy/metadata.json` of a checkpoint folder and checks its format and version.
Result<CheckpointMetadata> read_checkpoint_metadata(const std::string& checkpoint_dir);

/// Fills every tensor of `state` from the checkpoint (replicas included), and every object that
/// `state` names (a rank's own objects, not the other ranks').
/// Only the byte ranges of chunks that overlap each local block are read, and each is verified
/// against its XXH3 first; the saved and the live sharding may differ.
/// @post on error, no tensor of `state` has been modified.
Status load_checkpoint(const std::string& checkpoint_dir, StateDict& state);

/// What `stagehand-ckpt verify` found.
struct VerifyResult {
  std::vector<std::string> problems;
  std::uint64_t files_checked = 0;
  std::uint64_t chunks_checked = 0;
  std::uint64_t bytes_checked = 0;
  bool ok() const { return problems.empty(); }
};

/// Checks every file's size, XXH3 and safetensors header, and every chunk's XXH3, against the
/// metadata. Problems are collected rather than stopping at the first.
Result<VerifyResult> verify_checkpoint(const std::string& checkpoint_dir);

}  // namespace stagehand
