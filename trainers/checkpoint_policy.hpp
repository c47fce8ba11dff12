#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "stagehand/checkpoint/store/checkpoint_store.hpp"
#include "stagehand/config/config.hpp"
#include "stagehand/core/status.hpp"
#include "stagehand/storage/file_system.hpp"

namespace stagehand {

/// When to save, what resume starts from, and which committed checkpoints to keep: the policy
/// every trainer shares, over the CheckpointStore of `ckpt_path`. With a local tier
/// (trainer.local_ckpt_path) there are two: local_tier() and durable_tier().
class CheckpointPolicy {
 public:
  /// @param fs what `ckpt_path` (and `resume_path`) are on.
  CheckpointPolicy(TrainerConfig config, std::shared_ptr<FileSystem> fs)
      : config_(std::move(config)), store_(std::move(fs), config_.ckpt_path) {}

  /// The local tier's policy: trainer.local_ckpt_path with local_ckpt_interval and
  /// local_max_ckpts_to_keep, and the exports (made from the checkpoints saves commit).
  /// @pre config.local_ckpt_path is set.
  static CheckpointPolicy local_tier(TrainerConfig config, std::shared_ptr<FileSystem> fs);
  /// The durable tier's policy beside a local tier: trainer.ckpt_path with ckpt_interval and
  /// max_ckpts_to_keep, without exports.
  static CheckpointPolicy durable_tier(TrainerConfig config, std::shared_ptr<FileSystem> fs);

  /// The setting that names this policy's root, for messages ("trainer.ckpt_path").
  const std::string& root_setting() const { return root_setting_; }

  const CheckpointStore& store() const { return store_; }

  /// Every `ckpt_interval` steps (when > 0) and always at the last step.
  bool should_save(std::int64_t step) const;

  /// The checkpoint folder to resume from: none for resume_mode none; an error when from_path
  /// names a missing or uncommitted checkpoint.
  /// @pre resume_mode is not latest (resume_candidates serves it).
  Result<std::optional<std::string>> resume_dir() const;

  /// What resume_mode latest may start from, newest first: the committed steps up to the one the
  /// tracker names. `stale` says why the tracker's own step is not among them (its folder is
  /// missing or not committed); empty when it is. No steps and no `stale` without a tracker.
  struct ResumeCandidates {
    std::vector<std::int64_t> steps;
    std::string stale;
  };
  Result<ResumeCandidates> resume_candidates() const;

  /// Refuses to start from scratch (no resume_dir) over a ckpt_path that holds committed
  /// checkpoints, which the run's saves and retention would replace or delete, unless
  /// `overwrite_checkpoints` allows it. The error names the steps, the tracker and the settings.
  Status check_fresh_start() const;

  /// Refuses to resume at `step` into a ckpt_path that holds committed checkpoints of later
  /// steps (a from_path resume from elsewhere, say), which the run's saves would replace, unless
  /// `overwrite_checkpoints` allows it. The error names the steps and the settings. Steps in
  /// `rejected` (a resume found them corrupt) do not count: a save of the same step replaces them;
  /// nor, with resume_mode latest, steps beyond the tracker's (not resumable: the tracker is the
  /// truth), which the run's saves replace too.
  Status check_resume(std::int64_t step, const std::set<std::int64_t>& rejected = {}) const;

  /// The step the tracker names; none when there is no tracker.
  Result<std::optional<std::int64_t>> tracked_step() const { return store_.tracker(); }

  /// Whether the checkpoint of `step` is exported: trainer.export_interval (when > 0) divides it.
  bool should_export(std::int64_t step) const;

  /// Where the export of `step` goes: `<trainer.export_path>/global_step_<step>`.
  std::string export_dir(std::int64_t step) const;

  /// The committed steps whose export is owed: should_export, and nothing at export_dir yet (an
  /// export appears there whole, renamed into place, or not at all). A run killed between a
  /// commit and its export, or whose export failed, or that stopped with exports queued, leaves
  /// them. An export folder that cannot be read counts as owed.
  Result<std::vector<std::int64_t>> owed_exports() const;

  /// Deletes the oldest committed checkpoints beyond max_ckpts_to_keep (0 keeps all). Only
  /// committed ones are touched, never the one the tracker names, those in `in_use` (being
  /// exported) nor those whose export is owed (owed_exports). Call only after a commit.
  /// @return the steps deleted.
  Result<std::vector<std::int64_t>> apply_retention(const std::set<std::int64_t>& in_use = {}) const;

  /// Fails fast, before any training, when `ckpt_path` cannot hold checkpoints
  /// (CheckpointStore::check_destination).
  Status check_destination() const { return store_.check_destination().with_context(context()); }

  /// Takes the exclusive lock on `ckpt_path` (creating the folder), to be held until no save of
  /// the run can still commit; null where the store has no locks (an object store).
  /// @pre check_destination() passed.
  Result<std::unique_ptr<FileLock>> lock_destination() const;

  /// Removes what interrupted saves left (at start-up, before anything is saved), saying what
  /// (CheckpointStore::clean_interrupted).
  Status clean_interrupted_saves() const;

 private:
  CheckpointPolicy(TrainerConfig config, std::shared_ptr<FileSystem> fs, std::string root_setting)
      : config_(std::move(config)), store_(std::move(fs), config_.ckpt_path), root_setting_(std::move(root_setting)) {}

  /// What errors about the root start with: "trainer", or the local tier's setting.
  std::string context() const {
    return root_setting_ == "trainer.ckpt_path" ? "trainer" : root_setting_ + " (the local tier)";
  }

  TrainerConfig config_;
  CheckpointStore store_;
  std::string root_setting_ = "trainer.ckpt_path";
};

}  // namespace stagehand
