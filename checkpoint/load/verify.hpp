#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "stagehand/core/progress.hpp"
#include "stagehand/core/status.hpp"
#include "stagehand/storage/file_system.hpp"
#include "stagehand/storage/object_store.hpp"

namespace stagehand {

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
/// `progress` (when set) hears phase "verify" with the data files' bytes read of their total.
Result<VerifyResult> verify_checkpoint(FileSystem& fs, const std::string& checkpoint_dir,
                                       const ProgressFn& progress = {});
/// The same on default_file_system(store).
Result<VerifyResult> verify_checkpoint(
    const std::string& checkpoint_dir,
    const ObjectStoreOptions& store = ObjectStoreOptions::from_environment());

}  // namespace stagehand
