#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "stagehand/checkpoint/format/format.hpp"
#include "stagehand/core/status.hpp"
#include "stagehand/storage/file_system.hpp"
#include "stagehand/storage/object_store.hpp"

namespace stagehand {

/// What a commit wrote, so that nobody reads it back to find out.
struct CommitReport {
  /// Data files of the step, and their bytes (metadata.json and trainer_state.json aside).
  std::uint64_t files = 0;
  std::uint64_t bytes = 0;
};

/// The lock file in a local checkpoint root; nothing that lists the root takes it for a step.
inline constexpr char kRootLockFile[] = ".stagehand.lock";

/// A checkpoint root (`ckpt_path`) on any FileSystem: preparing a step, its commit, the tracker,
/// the committed steps, retention and the cleaning of what interrupted saves left. The one
/// implementation serves local disks and object stores: where the file system renames
/// atomically, step N is written into `global_step_N.tmp/` and renamed into place; where it
/// cannot (an object store), it is written in place and counts once its metadata exists. Either
/// way the tracker moves last, and retention and cleaning never leave a step half-removed that
/// a loader would take for committed.
///
/// Thread-safety: the methods that change the root are called by one owner at a time (the
/// coordinator saves, the trainer's policy applies retention after the commit); the reading
/// methods may be called from any thread.
class CheckpointStore {
 public:
  /// `root` on `fs`; a trailing '/' is dropped.
  CheckpointStore(std::shared_ptr<FileSystem> fs, std::string root);
  /// `root` on default_file_system(options): a local folder or an object-store URL.
  static CheckpointStore open(const std::string& root, const ObjectStoreOptions& options =
                                                           ObjectStoreOptions::from_environment());

  // -- properties --

  FileSystem& fs() const { return *fs_; }
  const std::shared_ptr<FileSystem>& file_system() const { return fs_; }
  const std::string& root() const { return root_; }
  CheckpointLayout layout() const { return CheckpointLayout{root_}; }
  /// `<root>/global_step_<N>`, where a committed step lies.
  std::string step_dir(std::int64_t step) const;
  /// Where step N's files are written until its commit: `global_step_N.tmp` where renames are
  /// atomic, else step_dir(N).
  std::string write_dir(std::int64_t step) const;
  /// Whether saves to this root may run in the background (not where every write is an upload
  /// that must finish before the commit: FileSystemCapabilities::uploads).
  bool allows_async_saves() const;

  // -- before the first save --

  /// Fails fast when the root cannot hold checkpoints: a local path that is not a folder, or
  /// whose parent folder is missing or not writable; an object store that cannot be reached,
  /// refuses the credentials or lacks the bucket. Creates nothing.
  Status check_destination() const;
  /// Takes the exclusive lock on the root (creating the folder as prepare() does), held until
  /// the result is destroyed, so that a second job on the same root cannot clean away or
  /// overwrite what this one writes; it records this host and pid for whoever is refused. Null
  /// where the store has no locks (an object store). already_exists naming the holder when
  /// another job holds it.
  Result<std::unique_ptr<FileLock>> lock() const;
  /// Removes what interrupted saves left, saying what: `global_step_*.tmp` folders and the
  /// tracker's temporary file; where steps are written in place, the files of steps without
  /// metadata and the store's unfinished uploads. Call at start-up, before anything is saved.
  /// @return how many leftovers were removed.
  Result<int> clean_interrupted() const;

  // -- saving one step --

  /// Makes step N's write folder with its `policy/` folder, replacing a stale one of the same
  /// step, creating the root when missing (its parent folder must exist; it is synced, so that
  /// the new root outlasts a power loss as the steps below it do). Where steps are
  /// written in place, refuses a step that is already committed (an object store cannot
  /// replace it atomically).
  /// @return the `policy/` folder the ranks write their files into.
  Result<std::string> prepare(std::int64_t step) const;
  /// Writes step N's trainer_state.json (prepared) atomically.
  /// @return its size and XXH3, taken from the bytes written.
  Result<FileMeta> write_trainer_state(std::int64_t step, const std::string& text) const;
  /// Commits step N whose ranks all wrote their files: metadata.json (atomically), then (where
  /// renames are atomic) the rename of `global_step_N.tmp` to `global_step_N` (swapping out an
  /// older copy of the same step, so that a committed copy exists at every instant), a sync of
  /// the root, and only then the tracker. On failure the tracker is untouched; before the
  /// rename the write folder is removed; after it (the tracker update failed) `global_step_N`
  /// stays in place, complete, and the error says so and which step the tracker still names.
  Result<CommitReport> commit(std::int64_t step, const GatheredMetadata& metadata) const;
  /// Commits step N whose files were copied into its write folder from another root (the
  /// durable tier filled from the local one): `metadata_json`, that root's metadata.json byte
  /// for byte, is written as the step's metadata, then the rest is as commit() does it.
  Status commit_copy(std::int64_t step, const std::string& metadata_json) const;
  /// Removes what uncommitted step N left: its write folder, or (written in place) its files,
  /// unless a tracker write whose answer was lost committed it after all.
  Status abort(std::int64_t step) const;

  // -- reading --

  /// The step the tracker names; nullopt when there is no tracker.
  Result<std::optional<std::int64_t>> tracker() const;
  /// Whether step N's metadata exists (in its committed place); something else there (a folder)
  /// counts too: a damaged commit, which loading refuses as corruption.
  Result<bool> is_committed(std::int64_t step) const;
  /// Steps whose metadata exists, ascending.
  Result<std::vector<std::int64_t>> committed_steps() const;

  // -- retention --

  /// Removes committed step N without ever leaving a part of it that counts as committed: it is
  /// renamed to `.tmp` first (loaders ignore it, the next start cleans it) or, written in place,
  /// its metadata goes first.
  Status remove_step(std::int64_t step) const;
  /// Removes the oldest committed steps beyond the newest `keep` (0 keeps all), never the one
  /// the tracker names nor those in `in_use`.
  /// @return the steps removed.
  Result<std::vector<std::int64_t>> apply_retention(
      int keep, const std::set<std::int64_t>& in_use = {}) const;

 private:
  bool in_place() const;
  /// Creates the root folder when it is missing, and syncs its parent so that it lasts (an
  /// object store has no folders to sync).
  Status create_root() const;
  std::string metadata_path(const std::string& checkpoint_dir) const;
  /// commit()'s steps after the data: the metadata (written by `write_metadata`), the rename,
  /// the syncs, the tracker.
  Status publish(std::int64_t step, const std::function<Status(WritableFile&)>& write_metadata) const;
  Status write_tracker(std::int64_t step) const;

  std::shared_ptr<FileSystem> fs_;
  std::string root_;
};

/// The step of a folder (or key segment) named `global_step_<N>` (with `.tmp` when `tmp`).
std::optional<std::int64_t> parse_step_dir_name(const std::string& name, bool tmp);

/// The step a tracker's text names; `where` names the tracker in the error.
Result<std::int64_t> parse_tracker(std::string text, const std::string& where);

/// The step the tracker of checkpoint root `root` names; nullopt when there is no tracker.
Result<std::optional<std::int64_t>> read_tracker(FileSystem& fs, const std::string& root);

}  // namespace stagehand
