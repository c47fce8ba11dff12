#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "stagehand/checkpoint/format.hpp"
#include "stagehand/checkpoint/report.hpp"
#include "stagehand/core/status.hpp"
#include "stagehand/storage/local_files.hpp"

namespace stagehand {

/// The step of a folder (or key segment) named `global_step_<N>` (with `.tmp` when `tmp`).
std::optional<std::int64_t> parse_step_dir_name(const std::string& name, bool tmp);

/// The step a tracker's text names; `where` names the tracker in the error.
Result<std::int64_t> parse_tracker(std::string text, const std::string& where);

/// Checks, without creating anything, that `root` is a folder or a missing one whose parent
/// folder exists. A trailing `/` is allowed.
Status check_checkpoint_root(const std::string& root);

/// The folder that holds `root`, as an absolute path (`a/b/` and `a/b` are both held by `a`).
std::string checkpoint_root_parent(const std::string& root);

/// Creates `<root>/global_step_<step>.tmp/policy/` for the ranks to write into, replacing a stale
/// one of the same step. `root` is created when missing, but its parent must exist.
/// @return the checkpoint's temporary folder.
Result<std::string> prepare_checkpoint_dir(const std::string& root, std::int64_t step);

/// Gathers the metadata of a checkpoint from every rank's report, without copying the chunks
/// (the result points into `reports`, which must outlive it); no trainer state is recorded.
/// Fails when a rank failed, is missing or reported twice, or when chunks disagree or do not
/// cover their tensors.
Result<GatheredMetadata> gather_reports(std::int64_t step, const std::vector<RankSaveReport>& reports,
                                        int world_size);
/// Reports that die with the call would leave the result pointing nowhere.
Result<GatheredMetadata> gather_reports(std::int64_t step, std::vector<RankSaveReport>&& reports,
                                        int world_size) = delete;

/// The size and XXH3 of `<checkpoint_dir>/trainer_state.json` when the file exists (the
/// coordinator wrote it when the step began); none otherwise.
Result<std::optional<FileMeta>> trainer_state_meta(const std::string& checkpoint_dir);

/// Commits a checkpoint whose ranks all reported: writes metadata.json (temp, fsync, rename),
/// renames `global_step_N.tmp` to `global_step_N` (atomically swapping out an older copy of the
/// same step), fsyncs the parent, and only then replaces the tracker (temp, fsync, rename).
/// On failure the tracker is untouched and no temporary file of it is left. Before the rename,
/// the temporary folder is removed; after it (the tracker update failed), `global_step_N` stays
/// in place, complete, and the error says so and which step the tracker still names.
/// @param storage writes the tracker; tests pass one that fails.
Status commit_checkpoint(const std::string& root, std::int64_t step,
                         const std::vector<RankSaveReport>& reports, int world_size,
                         StorageBackend& storage = *local_storage());

/// Removes the temporary folder of an uncommitted checkpoint.
Status abort_checkpoint(const std::string& root, std::int64_t step);

/// The step the tracker names; nullopt when there is no tracker.
Result<std::optional<std::int64_t>> read_tracker(const std::string& root);

/// Steps of committed checkpoints under `root` (those with metadata), ascending.
std::vector<std::int64_t> committed_steps(const std::string& root);

/// Removes leftover `global_step_*.tmp` folders of interrupted saves, logging each.
/// @return how many were removed.
Result<int> clean_stale_tmp_dirs(const std::string& root);

/// The lock file in a local checkpoint root; nothing that lists the root takes it for a step.
inline constexpr char kRootLockFile[] = ".stagehand.lock";

/// An exclusive lock on a local checkpoint root, held for the life of a run, so that a second
/// run on the same root cannot clean away or overwrite what the first is writing. It is a
/// `flock` on `<root>/.stagehand.lock`, which records the holder's host and pid. The kernel
/// releases it when the holder exits, however it exits; the file itself stays (removing it would
/// race with a run opening it).
///
/// Thread-safety: a lock is owned by one thread at a time; moving it hands it over.
class CheckpointRootLock {
 public:
  /// Takes the lock, creating `root` when missing (its parent must exist), without waiting.
  /// @return already_exists naming the holder's host and pid when another run holds it.
  static Result<CheckpointRootLock> acquire(const std::string& root);

  CheckpointRootLock(CheckpointRootLock&& other) noexcept;
  CheckpointRootLock& operator=(CheckpointRootLock&& other) noexcept;
  CheckpointRootLock(const CheckpointRootLock&) = delete;
  CheckpointRootLock& operator=(const CheckpointRootLock&) = delete;
  /// Releases the lock.
  ~CheckpointRootLock();

 private:
  explicit CheckpointRootLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace stagehand
