#pragma once

// A FileSystem for crash and error tests, in the manner of RocksDB's FaultInjectionTestFS: it
// wraps the local file system, numbers every call that changes the disk, fails chosen calls the
// way the local file system fails them, and simulates a power loss.
//
// The crash model. A power loss may leave any state that POSIX allows, and POSIX promises little:
// only what fsync made durable. The model takes the weakest reading; common file systems are
// stronger (ext4 with data=ordered writes a file's data before the metadata that exposes it and
// commits folder changes in the order of its journal), and none of that is assumed here:
// - a file's bytes are those of its last successful sync(); everything written after it, and a
//   truncation by create_file() of an existing file, is lost (a file never synced is empty);
// - a folder's entries are those of its last successful sync_dir(); each create_file() of a new
//   file, create_dir(), remove_file(), remove_tree(), rename() and exchange() since then may be
//   lost or kept, independently of the others, except that a change is only kept together with
//   the earlier unsynced changes it builds on (those of the same name in the same folder, and
//   those that made the folder it happens in reachable);
// - a sync of a file does not make its folder entry durable, nor a sync of a folder its own entry
//   in its parent;
// - remove_tree() is one change of its parent folder: the whole tree is removed or stays as it
//   was last made durable;
// - a call either happened whole before the power loss or not at all.
// crash_outcomes() lists, for the present state, the outcome that loses every unsynced folder
// change, the one that keeps them all, and for each unsynced change the one that keeps only it
// and what it builds on (not every subset: with n unsynced changes that is n + 2 outcomes, not
// 2^n). Every outcome loses all unsynced data, whole: unsynced bytes that partly reached the disk
// (a write torn by the power loss itself) are not enumerated; FsFault::torn injects such a write
// instead. crash_image() is the content of the modelled folder after an outcome, which
// write_image() puts on disk for the code to restart from.
//
// What is not modelled: paths outside the modelled folder (passed through, numbered, but not
// part of any crash image), lock_file() (passed through; the lock file carries no state), and
// EINTR: the local file system retries interrupted reads and writes itself (posix_file_system.cpp,
// posix_io.cpp), so no caller of a FileSystem ever sees one, and WritableFile has no way to
// report a short count.

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "stagehand/core/status.hpp"
#include "stagehand/storage/file_system.hpp"

namespace stagehand::test {

/// The calls a FaultFileSystem can fail. Those up to `exchange` change the disk: they are
/// numbered and recorded, and a power loss stops them.
enum class FsOp : std::uint8_t {
  create_file,
  append,
  write_at,
  /// WritableFile::sync.
  sync,
  /// WritableFile::close.
  close,
  remove_file,
  create_dir,
  remove_tree,
  sync_dir,
  rename,
  exchange,
  open_file,
  /// ReadableFile::read and read_vectored.
  read,
};

/// The call's name, as the FileSystem spells it.
const char* to_string(FsOp op);

/// Whether calls of `op` change the disk (and so are recorded).
bool changes_disk(FsOp op);

/// One recorded call that changes the disk.
struct FsCall {
  /// Its number, from 0, in the order the calls were made.
  std::size_t index = 0;
  FsOp op = FsOp::create_file;
  std::string path;
  /// The second path of rename() and exchange().
  std::string other;
  /// append and write_at: where the bytes went, and how many were asked for.
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
  /// What the call returned (an injected error, or the local file system's answer).
  Status status;

  /// "12 rename 'a' -> 'b'", with the error when it failed.
  std::string to_string() const;
};

/// A call to fail: the `nth` call of `op` on a matching path fails with `error`, its message
/// exactly the local file system's for that errno (the path, the errno's text and number).
struct FsFault {
  FsOp op = FsOp::sync;
  /// Only calls whose path (either one for rename and exchange) ends with this; empty: every
  /// call of `op`.
  std::string path_suffix;
  /// Which of the matching calls fails, from 1.
  int nth = 1;
  int error = EIO;
  /// append and write_at: this many bytes of the call reach the file before it fails (a short
  /// write); nullopt: none do. Other calls fail before doing anything.
  std::optional<std::uint64_t> written_bytes;
  /// With written_bytes: the call reports success although the rest of its bytes were lost (they
  /// read as zeros): a torn write that only a checksum can find.
  bool torn = false;
};

/// One legal state after a power loss (see the crash model above).
struct CrashOutcome {
  /// What it keeps, in words.
  std::string name;
  /// The calls whose unsynced folder changes it keeps.
  std::set<std::size_t> kept;
};

/// The files and folders below a folder, by path relative to it: a file's bytes, nullopt for a
/// folder.
using DiskImage = std::map<std::string, std::optional<std::string>>;

/// The image of everything below the folder `root`; an error for anything that is neither a
/// file nor a folder.
Result<DiskImage> read_image(const std::string& root);

/// Makes everything below the folder `root` what `image` says, changing only what differs.
Status write_image(const std::string& root, const DiskImage& image);

/// The local file system with recorded calls, injected faults and simulated power losses for
/// everything below one folder (see the crash model above).
///
/// Thread-safety: every method may be called from several threads at once; calls are carried
/// out one at a time, so that their numbers are the order in which they happened.
class FaultFileSystem final : public FileSystemWrapper {
 public:
  /// Models the existing folder `root`, whose present content counts as durable.
  /// @param real_syncs false: sync() and sync_dir() change only the model and never reach the
  ///        disk, for tests that look at the disk only after putting a crash image on it (the
  ///        real fsyncs would only cost time).
  /// @pre outlives every file it opens.
  static Result<std::shared_ptr<FaultFileSystem>> create(std::string root, bool real_syncs = true);

  // -- recording --

  /// The calls that changed (or were to change) the disk, in order.
  std::vector<FsCall> calls() const;
  /// How many calls were recorded.
  std::size_t call_count() const;

  // -- faults --

  /// Arms `fault`; it fires once.
  void inject(FsFault fault);

  // -- power loss --

  /// The power goes once `calls` calls have been recorded: every later call that changes the
  /// disk fails with EIO and does nothing (calls that read still answer from the disk as it is).
  void power_loss_after(std::size_t calls);
  /// Whether the power went.
  bool powered_off() const;
  /// The outcomes a power loss now may have, each once.
  std::vector<CrashOutcome> crash_outcomes() const;
  /// The content of the modelled folder after `outcome`.
  DiskImage crash_image(const CrashOutcome& outcome) const;

  /// Starts afresh from what is on disk now, all of it durable: no calls, faults or power loss.
  /// Files opened before still work but are no longer modelled.
  Status reset();

  // -- the FileSystem --

  Result<std::unique_ptr<WritableFile>> create_file(const std::string& path) override;
  Result<std::unique_ptr<ReadableFile>> open_file(const std::string& path) override;
  Status remove_file(const std::string& path) override;
  Status create_dir(const std::string& path) override;
  Status remove_tree(const std::string& path) override;
  Status sync_dir(const std::string& path) override;
  Status rename(const std::string& from, const std::string& to) override;
  Status exchange(const std::string& a, const std::string& b) override;

 private:
  class File;
  class ReadFile;

  /// A file or folder of the model.
  struct Inode {
    bool is_dir = false;
    /// A file's bytes now, and as of its last sync.
    std::string data;
    std::string synced_data;
    /// A folder's entries now, and as of its last sync.
    std::map<std::string, std::size_t> entries;
    std::map<std::string, std::size_t> synced_entries;
  };

  /// The changes one call made to one folder's entries that no sync_dir() made durable yet:
  /// each name set to an inode, or removed.
  struct DirChange {
    std::size_t call = 0;
    std::size_t dir = 0;
    std::vector<std::pair<std::string, std::optional<std::size_t>>> names;
  };

  /// Where a path is in the model: its folder's inode and its name (none for the root).
  struct Place {
    std::size_t dir = 0;
    std::string name;
  };

  FaultFileSystem(std::string root, bool real_syncs);

  /// The error that refuses a call that changes the disk once the power is gone (its message
  /// begins with `what`, as the local file system's would); nullopt while there is power.
  /// @pre mutex_ held
  std::optional<Status> refuse_without_power(const std::string& what);
  /// The fault that fires for this call of `op` on these paths, counting the call for every
  /// armed fault.
  /// @pre mutex_ held
  std::optional<FsFault> take_fault(FsOp op, const std::string& path, const std::string& other);
  /// Numbers and records `call` with what it returned, and returns that.
  /// @pre mutex_ held
  Status record(FsCall call, Status status);

  /// `path` below root_: its components; nullopt outside.
  std::optional<std::vector<std::string>> components(const std::string& path) const;
  /// The inode at `path` now; nullopt when nothing is there or it is outside.
  std::optional<std::size_t> find(const std::string& path) const;
  /// The folder and name of `path`, whose folder exists in the model; nullopt outside (or the
  /// root itself); an internal error when the model lacks the folder.
  Result<std::optional<Place>> place_of(const std::string& path) const;
  /// Applies one call's changes to folder `dir` and journals them.
  void change_dir(std::size_t call, std::size_t dir,
                  std::vector<std::pair<std::string, std::optional<std::size_t>>> names);
  std::size_t new_inode(bool is_dir);
  /// Loads the disk below root_ as the durable state.
  Status load_from_disk();

  /// Writes through `file` with the fault and power checks, updating the model.
  Status write(File& file, FsOp op, std::uint64_t offset, const void* data, std::size_t bytes);
  Status sync_file(File& file);
  Status close_file(File& file);
  /// The fault check of a read of `path`.
  Status check_read(const std::string& path);
  /// Whether `file` belongs to the model as it is now (it was opened since the last reset()).
  /// @pre mutex_ held
  bool modelled(const File& file) const;

  std::string root_;
  bool real_syncs_;
  mutable std::mutex mutex_;
  std::vector<FsCall> calls_;
  struct ArmedFault {
    FsFault fault;
    int seen = 0;
  };
  std::vector<ArmedFault> faults_;
  std::optional<std::size_t> power_loss_after_;
  bool powered_off_ = false;
  /// Inode 0 is root_.
  std::vector<Inode> inodes_;
  std::vector<DirChange> journal_;
  /// Counts reset()s: files opened before the last one are no longer modelled.
  std::uint64_t epoch_ = 0;
};

}  // namespace stagehand::test
