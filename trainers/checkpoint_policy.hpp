#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "stagehand/checkpoint/commit.hpp"
#include "stagehand/config/config.hpp"
#include "stagehand/core/status.hpp"
#include "stagehand/storage/object_store.hpp"

namespace stagehand {

/// When to save, what resume starts from, and which committed checkpoints to keep: the policy
/// every trainer shares.
class CheckpointPolicy {
 public:
  /// @param store how to reach an object-store `ckpt_path`.
  explicit CheckpointPolicy(TrainerConfig config, ObjectStoreOptions store = ObjectStoreOptions::from_environment())
      : config_(std::move(config)), store_(std::move(store)) {}

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
  /// committed ones are touched, never the one the tracker names. Call only after a commit.
  /// @return the steps deleted.
  Result<std::vector<std::int64_t>> apply_retention() const;

  /// Fails fast, before any training, when `ckpt_path` cannot hold checkpoints: a local path
  /// that is not a folder, or whose parent folder is missing or not writable; an object store
  /// that cannot be reached, refuses the credentials or lacks the bucket.
  Status check_destination() const;

  /// Takes the exclusive lock on a local `ckpt_path` (creating the folder), to be held until no
  /// save of the run can still commit; none for an object store, where nothing is locked.
  /// @pre check_destination() passed.
  Result<std::optional<CheckpointRootLock>> lock_destination() const;

  /// Removes what interrupted saves left (at start-up, before anything is saved): `.tmp`
  /// folders; in an object store, the objects of steps without metadata and open multipart
  /// uploads below `ckpt_path`.
  Status clean_interrupted_saves() const;

 private:
  Result<std::vector<std::int64_t>> apply_cloud_retention() const;

  TrainerConfig config_;
  ObjectStoreOptions store_;
};

/// A batch the fully-async trainer had generated but not trained when it saved.
struct PendingBatch {
  std::int64_t step = 0;
  /// The weights version its actions were sampled with.
  std::int64_t version = 0;
  std::vector<std::int32_t> actions;
};

/// The fully-async trainer's part of the trainer state.
struct FullyAsyncState {
  std::int64_t max_staleness_steps = 0;
  std::int64_t num_generators = 0;
  std::int64_t next_generation_step = 0;
  std::int64_t max_staleness_seen = 0;
  std::vector<PendingBatch> pending_batches;
};

/// What a checkpoint's trainer_state.json holds.
struct TrainerState {
  std::int64_t step = 0;
  std::string kind;
  std::uint64_t seed = 0;
  /// Contexts consumed so far (the data cursor).
  std::int64_t data_cursor = 0;
  /// Only for the fully-async trainer.
  std::optional<FullyAsyncState> fully_async;
};

std::string trainer_state_to_json(const TrainerState& state);

/// Reads `<checkpoint_dir>/trainer_state.json`. `step` is required; the other fields may be
/// missing (then they keep their defaults), but a field of the wrong type or out of range is an
/// error naming the file and the field (`fully_async.pending_batches[0].actions`).
Result<TrainerState> read_trainer_state(const std::string& checkpoint_dir,
                                        const ObjectStoreOptions& store = ObjectStoreOptions::from_environment());

}  // namespace stagehand
