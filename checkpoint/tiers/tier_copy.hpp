#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "stagehand/checkpoint/store/checkpoint_store.hpp"
#include "stagehand/core/host_buffer.hpp"
#include "stagehand/core/progress.hpp"
#include "stagehand/core/status.hpp"

namespace stagehand {

/// The aligned buffers of piece_bytes that the threads of a copy read, hash and write through,
/// kept from one copy to the next: a copy takes one a thread and gives it back when it ends, so
/// that a run's repeated copies reuse the same memory instead of faulting in (and zeroing) fresh
/// pages each time, which on a virtual machine costs more than the copy of a small step.
/// Thread-safe. Holds at most as many buffers as copy threads ran at once.
class CopyBuffers {
 public:
  explicit CopyBuffers(std::size_t bytes);
  /// A kept buffer, else a new one (invalid if it cannot be allocated).
  HostBuffer take();
  /// Keeps `buffer` for the next take (one of another size is freed).
  void give_back(HostBuffer buffer);
  std::size_t buffer_bytes() const { return bytes_; }
  /// Buffers allocated so far (kept or taken).
  std::size_t allocated() const;

 private:
  const std::size_t bytes_;
  mutable std::mutex mutex_;
  std::vector<HostBuffer> kept_;
  std::size_t allocated_ = 0;
};

struct TierCopyOptions {
  /// Files copied at once.
  int threads = 2;
  /// Bytes read, hashed and written at a time by each thread (with `buffers`: their size).
  std::size_t piece_bytes = std::size_t{8} << 20;
  /// The copying threads run at lowered CPU and I/O priority (a hint: where it cannot be
  /// lowered the copy still runs).
  bool low_priority = true;
  /// Asked before each piece and before each file is made durable: true (the run is stopping)
  /// stops the copy, which fails as aborted and leaves the destination as a failure does. An
  /// object store's upload of a file, in its sync, runs to its end or its retry limit. Empty:
  /// never.
  std::function<bool()> should_stop;
  /// Where the copy takes its buffers: a pool kept by the caller across copies (of buffers of
  /// piece_bytes or more). Empty: the copy allocates its own, for its copy and read-back phases,
  /// and frees them at its end.
  std::shared_ptr<CopyBuffers> buffers;
  /// Hears phase "copy", then "read back", each with the step's file bytes done of their total
  /// (from the copying threads, one call at a time). Empty: nothing is reported.
  ProgressFn progress;
};

/// What copy_committed_step did.
struct TierCopyReport {
  /// Files written at the destination (data files, trainer_state.json, metadata.json) and
  /// their bytes.
  std::uint64_t files = 0;
  std::uint64_t bytes = 0;
  /// Seconds reading, hashing and writing the files (the upload included), then reading them
  /// back and hashing them again, then committing.
  double copy_s = 0;
  double verify_s = 0;
  double commit_s = 0;
  double total_s = 0;
  /// CPU seconds of the threads that copied and read back the files, summed.
  double cpu_s = 0;
  /// A committed step of the same number was at the destination, and was replaced.
  bool replaced = false;
  /// Copies of a source in host folders rewritten from good ones before the copy was tried
  /// again (check_host_copies).
  std::vector<std::string> repaired;
};

/// Reads the first `size` bytes of `in` a piece of `buffer.size()` bytes at a time, asking
/// `before` (when set) first each time (an error stops the read), hashing each piece and handing
/// it to `use` (when set).
/// @return the XXH3 of the bytes.
Result<std::uint64_t> read_hashed(ReadableFile& in, std::uint64_t size, std::span<char> buffer,
                                  const std::function<Status()>& before,
                                  const std::function<Status(const char*, std::size_t)>& use);

/// "N bytes, XXH3 h": what the metadata records of a file, for messages.
std::string describe_file_meta(const FileMeta& meta);

/// Copies committed step `step` of root `from` (the local tier) into root `to` (the durable
/// tier: a folder or an object store), so that it counts as committed there only once every
/// byte is in place and checked:
///   1. reads from's metadata.json and checks it (read_checkpoint_metadata: its own checksum,
///      its step);
///   2. prepares the step's write folder at `to` (CheckpointStore::prepare);
///   3. copies every data file and trainer_state.json, hashing the bytes as they are read: a
///      source whose size or XXH3 differs from what the metadata records is corruption, and
///      nothing of the step is committed (a damaged local copy is never made durable);
///   4. reads every copied file back from `to` and checks its size and XXH3 again: what the
///      store holds, not what was sent;
///   5. commits with from's metadata.json byte for byte, then (where renames exist) the rename,
///      then the tracker (CheckpointStore::commit_copy).
/// A source in host folders (host_folders_file_system) whose first copy of some file is damaged
/// is checked (check_host_copies, which rewrites it from a good copy) and copied once more; the
/// report lists what was rewritten.
/// A step of the same number committed at `to` is replaced, as a save replaces one (the trainer
/// copies a step again only when its run saved it again: after resuming from before it): where
/// renames are atomic, a committed copy exists at every instant; in an object store it is
/// removed first (CheckpointStore::remove_step). Any other failure removes what the step left at
/// `to`, whose tracker still names the step it named, and the error names the step and the file.
/// @pre nothing else writes step `step` of `to` meanwhile (the trainer's one copier).
Result<TierCopyReport> copy_committed_step(const CheckpointStore& from, const CheckpointStore& to,
                                           std::int64_t step, const TierCopyOptions& options = {});

}  // namespace stagehand
