#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

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

  /// The checkpoint folder to resume from: none for resume_mode none (or latest with nothing
  /// committed yet); an error when from_path names a missing or uncommitted checkpoint.
  Result<std::optional<std::string>> resume_dir() const;

  /// Deletes the oldest committed checkpoints beyond max_ckpts_to_keep (0 keeps all). Only
  /// committed ones are touched, never the one the tracker names. Call only after a commit.
  /// @return the steps deleted.
  Result<std::vector<std::int64_t>> apply_retention() const;

  /// Fails fast, before any training, when `ckpt_path` cannot hold checkpoints: a local path
  /// that is not a folder, or whose parent folder is missing or not writable; an object store
  /// that cannot be reached, refuses the credentials or lacks the bucket.
  Status check_destination() const;

  /// Removes what interrupted saves left (at start-up, before anything is saved): `.tmp`
  /// folders; in an object store, the objects of steps without metadata and open multipart
  /// uploads below `ckpt_path`.
  Status clean_interrupted_saves() const;

 private:
  Result<std::vector<std::int64_t>> apply_cloud_retention() const;

  TrainerConfig config_;
  ObjectStoreOptions store_;
};

/// What a checkpoint's trainer_state.json holds.
struct TrainerState {
  std::int64_t step = 0;
  std::string kind;
  std::uint64_t seed = 0;
  /// Contexts consumed so far (the data cursor).
  std::int64_t data_cursor = 0;
  /// The fully-async trainer's part (generated, unconsumed batches; staleness counters) as a JSON
  /// object's text; empty for the other trainers.
  std::string fully_async;
};

std::string trainer_state_to_json(const TrainerState& state);
Result<TrainerState> read_trainer_state(const std::string& checkpoint_dir,
                                        const ObjectStoreOptions& store = ObjectStoreOptions::from_environment());

}  // namespace stagehand
