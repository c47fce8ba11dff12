#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "stagehand/checkpoint/format.hpp"
#include "stagehand/checkpoint/report.hpp"
#include "stagehand/core/status.hpp"

namespace stagehand {

/// The step of a folder (or key segment) named `global_step_<N>` (with `.tmp` when `tmp`).
std::optional<std::int64_t> parse_step_dir_name(const std::string& name, bool tmp);

/// The step a tracker's text names; `where` names the tracker in the error.
Result<std::int64_t> parse_tracker(std::string text, const std::string& where);

/// Checks, without creating anything, that `root` is a folder or a missing one whose parent
/// folder exists.
Status check_checkpoint_root(const std::string& root);

/// Creates `<root>/global_step_<step>.tmp/policy/` for the ranks to write into, replacing a stale
/// one of the same step. `root` is created when missing, but its parent must exist.
/// @return the checkpoint's temporary folder.
Result<std::string> prepare_checkpoint_dir(const std::string& root, std::int64_t step);

/// Builds the metadata of a checkpoint from every rank's report.
/// Fails when a rank failed, is missing or reported twice, or when chunks disagree or do not
/// cover their tensors.
Result<CheckpointMetadata> build_metadata(std::int64_t step, const std::vector<RankSaveReport>& reports,
                                          int world_size);

/// Commits a checkpoint whose ranks all reported: writes metadata.json (temp, fsync, rename),
/// renames `global_step_N.tmp` to `global_step_N` (atomically swapping out an older copy of the
/// same step), fsyncs the parent, and only then replaces the tracker.
/// On failure nothing is committed, the tracker is untouched and the temporary folder is removed.
Status commit_checkpoint(const std::string& root, std::int64_t step,
                         const std::vector<RankSaveReport>& reports, int world_size);

/// Removes the temporary folder of an uncommitted checkpoint.
Status abort_checkpoint(const std::string& root, std::int64_t step);

/// The step the tracker names; nullopt when there is no tracker.
Result<std::optional<std::int64_t>> read_tracker(const std::string& root);

/// Steps of committed checkpoints under `root` (those with metadata), ascending.
std::vector<std::int64_t> committed_steps(const std::string& root);

/// Removes leftover `global_step_*.tmp` folders of interrupted saves.
/// @return how many were removed.
Result<int> clean_stale_tmp_dirs(const std::string& root);

}  // namespace stagehand
