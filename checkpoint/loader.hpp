#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "stagehand/checkpoint/format.hpp"
#include "stagehand/core/sharded_tensor.hpp"
#include "stagehand/storage/object_store.hpp"

namespace stagehand {

// Every function here takes a local path or an object-store URL (s3://, gs://); `store` says how
// to reach the object store (by default, the AWS environment variables).

/// Turns a user's path into a checkpoint folder: a `ckpt_path` root resolves through its tracker,
/// a `global_step_N` folder is taken as it is. A `.tmp` folder or an uncommitted one is an error.
Result<std::string> resolve_checkpoint(const std::string& path,
                                       const ObjectStoreOptions& store = ObjectStoreOptions::from_environment());

/// Reads `policy/metadata.json` of a checkpoint folder: metadata_from_json, so its format,
/// version, fields, checksum and validate_metadata are checked, and a folder named
/// `global_step_N` must hold step N.
Result<CheckpointMetadata> read_checkpoint_metadata(
    const std::string& checkpoint_dir, const ObjectStoreOptions& store = ObjectStoreOptions::from_environment());

/// Reads the trainer_state.json of a checkpoint folder, proven to be the one committed with its
/// metadata: recorded in metadata.json with its size and XXH3, its field "step" equal to the
/// metadata's step, which equals the step in the folder's name (`global_step_N`, which is what
/// the tracker names). not_found when the checkpoint was saved without one; corruption otherwise.
Result<std::string> read_trainer_state_text(
    const std::string& checkpoint_dir, const ObjectStoreOptions& store = ObjectStoreOptions::from_environment());

/// Fills every tensor of `state` from the checkpoint (replicas included), and every object that
/// `state` names (a rank's own objects, not the other ranks').
/// Only the byte ranges of chunks that overlap each local block are read (ranged GETs from an
/// object store); each chunk is checked against its file's safetensors header entry and its
/// XXH3 first. The saved and the live sharding may differ: the saved chunks are proven to tile
/// each tensor (validate_metadata), so every element of every local block is filled from
/// exactly one chunk.
/// @post on error, no tensor of `state` has been modified.
Status load_checkpoint(const std::string& checkpoint_dir, StateDict& state,
                       const ObjectStoreOptions& store = ObjectStoreOptions::from_environment());

/// What `stagehand-ckpt verify` found.
struct VerifyResult {
  std::vector<std::string> problems;
  std::uint64_t files_checked = 0;
  std::uint64_t chunks_checked = 0;
  std::uint64_t bytes_checked = 0;
  bool ok() const { return problems.empty(); }
};

/// Checks what load_checkpoint and a trainer's resume rely on: the metadata (as
/// read_checkpoint_metadata does), the trainer state (as read_trainer_state_text does), every
/// file's size, XXH3 and safetensors header, every chunk's header entry (check_chunk_in_header)
/// and XXH3. A checkpoint that verifies loads under any layout that matches its tensors.
/// Problems in the files are collected rather than stopping at the first; metadata that does not
/// validate is the one problem reported. Errors are left for what stops the check itself
/// (metadata that cannot be read, an unreachable object store).
Result<VerifyResult> verify_checkpoint(const std::string& checkpoint_dir,
                                       const ObjectStoreOptions& store = ObjectStoreOptions::from_environment());

}  // namespace stagehand
