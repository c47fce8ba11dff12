#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "stagehand/core/status.hpp"

namespace stagehand {

/// A file being written from start to end.
///
/// Thread-safety: one thread at a time, except write_at() of disjoint ranges.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  /// Appends all `bytes`; an error names the file and the errno.
  virtual Status append(const void* data, std::size_t bytes) = 0;
  /// Writes all `bytes` at `offset` (the file grows as needed). Several threads may write
  /// disjoint ranges of one file at once.
  virtual Status write_at(std::uint64_t offset, const void* data, std::size_t bytes) = 0;
  /// Starts writing bytes [offset, offset + bytes) back to the device without waiting for it
  /// (sync_file_range), so that a later sync() has less to do. A hint: durable only after
  /// sync(), which also reports any write error.
  virtual Status start_writeback(std::uint64_t offset, std::size_t bytes) {
    (void)offset;
    (void)bytes;
    return Status::ok();
  }
  /// Makes everything appended so far durable (fsync).
  virtual Status sync() = 0;
  virtual Status close() = 0;
};

/// Where checkpoint data files are written. The local file system is the default; tests wrap it
/// to slow writes down or inject errors.
///
/// Thread-safety: open_for_write may be called from several writer threads at once.
class StorageBackend {
 public:
  virtual ~StorageBackend() = default;
  /// Creates (or truncates) `path` for writing.
  virtual Result<std::unique_ptr<WritableFile>> open_for_write(const std::string& path) = 0;
};

/// The local file system backend, shared by every engine of the process.
std::shared_ptr<StorageBackend> local_storage();

/// `inner`, with every write through the returned backend paced so that all of them together
/// move at most `bytes_per_s` (megatron_config.ckpt_write_rate_limit_mib_s: background saves
/// that must not crowd shared storage). `bytes_per_s <= 0` returns `inner` itself.
std::shared_ptr<StorageBackend> rate_limited_storage(std::shared_ptr<StorageBackend> inner, double bytes_per_s);

// -- local file system helpers used by commit, load and the tools --

/// fsyncs a directory so that renames and creations inside it are durable.
Status fsync_dir(const std::string& dir);

/// Writes `content` to `path` atomically: temp file beside it, fsync, rename, fsync of the folder.
Status write_file_atomic(const std::string& path, const std::string& content);
/// The same, with the temp file's content written by `fill`. On failure the temp file is removed.
Status write_file_atomic(const std::string& path, const std::function<Status(WritableFile&)>& fill);

/// Reads a whole (small) file.
Result<std::string> read_small_file(const std::string& path);

/// Reads exactly `bytes` at `offset` from an open descriptor; a short read is corruption.
Status pread_exact(int fd, std::uint64_t offset, void* dst, std::size_t bytes,
                   const std::string& path);

/// One destination of a vectored read: `bytes` bytes into `dst`.
struct ReadSegment {
  void* dst = nullptr;
  std::size_t bytes = 0;
};

/// Reads the bytes at `offset` onwards into `segments` one after another, with as few preadv
/// calls as the system allows (one for up to IOV_MAX segments); a short read is corruption.
Status preadv_exact(int fd, std::uint64_t offset, const std::vector<ReadSegment>& segments,
                    const std::string& path);

/// Size of a file in bytes.
Result<std::uint64_t> file_size(const std::string& path);

/// An open read-only file descriptor, closed on destruction.
class ReadOnlyFile {
 public:
  static Result<ReadOnlyFile> open(const std::string& path);
  ReadOnlyFile(ReadOnlyFile&& other) noexcept;
  ReadOnlyFile& operator=(ReadOnlyFile&& other) noexcept;
  ReadOnlyFile(const ReadOnlyFile&) = delete;
  ReadOnlyFile& operator=(const ReadOnlyFile&) = delete;
  ~ReadOnlyFile();
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }

 private:
  ReadOnlyFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::string path_;
};

}  // namespace stagehand
