#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "stagehand/checkpoint/commit.hpp"
#include "stagehand/checkpoint/trainer_state.hpp"
#include "stagehand/config/config.hpp"
#include "stagehand/core/status.hpp"
#include "stagehand/storage/object_store.hpp"

namespace stagehand {

/// When to save, what resume starts from, and which committed checkpoints to keep: the policy
/// every trainer shares.
class CheckpointPolicy {
 public:
  /// @param local_work_dir megatron_config.local_work_dir: where saves to an object-store
  ///        `ckpt_path` are written before upload.
  /// @param store how to reach an object-store `ckpt_path`.
  CheckpointPolicy(TrainerConfig config, std::string local_work_dir,
                   ObjectStoreOptions store = ObjectStoreOptions::from_environment())
      : config_(std::move(config)), local_work_dir_(std::move(local_work_dir)), store_(std::move(store)) {}

  /// Every `ckpt_interval` steps (when > 0) and always at the last step.
  bool should_save(std::int64_t step) const;

  /// The checkpoint folder to resume from: none for resume_mode none (or latest without a
  /// tracker); an error when from_path names a missing or uncommitted checkpoint.
  Result<std::optional<std::string>> resume_dir() const;

  /// Refuses to start from scratch (no resume_dir) over a ckpt_path that holds committed
  /// checkpoints, which the run's saves and retention would replace or delete, unless
  /// `overwrite_checkpoints` allows it. The error names the steps, the tracker and the settings.
  Status check_fresh_start() const;

  /// The step the tracker names; none when there is no tracker.
  Result<std::optional<std::int64_t>> tracked_step() const;

  /// Deletes the oldest committed checkpoints beyond max_ckpts_to_keep (0 keeps all). Only
  /// committed ones are touched, never the one the tracker names nor those in `in_use` (being
  /// exported). Call only after a commit.
  /// @return the steps deleted.
  Result<std::vector<std::int64_t>> apply_retention(const std::set<std::int64_t>& in_use = {}) const;

  /// Fails fast, before any training, when `ckpt_path` cannot hold checkpoints: a local path
  /// that is not a folder, or whose parent folder is missing or not writable; an object store
  /// that cannot be reached, refuses the credentials or lacks the bucket.
  Status check_destination() const;

  /// Takes the exclusive lock on a local `ckpt_path` (creating the folder), to be held until no
  /// save of the run can still commit; none for an object store, where nothing is locked.
  /// @pre check_destination() passed.
  Result<std::optional<CheckpointRootLock>> lock_destination() const;

  /// Removes what interrupted saves left (at start-up, before anything is saved), saying what:
  /// `.tmp` folders; for an object store, the objects of steps without metadata and open
  /// multipart uploads below `ckpt_path`, and the `.tmp` folders in its local work folder.
  Status clean_interrupted_saves() const;

 private:
  Result<std::vector<std::int64_t>> apply_cloud_retention(const std::set<std::int64_t>& in_use) const;

  TrainerConfig config_;
  std::string local_work_dir_;
  ObjectStoreOptions store_;
};

}  // namespace stagehand
