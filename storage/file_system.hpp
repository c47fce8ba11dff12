#pragma once

// One interface for everything checkpoints do with bytes, in the manner of RocksDB's FileSystem
// and DCP's FileSystemBase: files written at positions and made durable, files read at
// positions, folders, renames, locks. A local disk and an object store both implement it; where
// a store cannot do something (an object store has no rename) its capabilities say so and the
// checkpoint store takes the other path in one place. Tests wrap it (FileSystemWrapper) to count
// calls, fail chosen ones or lose what was not synced.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "stagehand/core/status.hpp"

namespace stagehand {

/// One destination of a vectored read: `bytes` bytes into `dst`.
struct ReadSegment {
  void* dst = nullptr;
  std::size_t bytes = 0;
};

/// The block of O_DIRECT here: memory, file offsets and lengths that go around the page cache
/// are multiples of it (WritableFile::direct_block), and writers place memory by it.
inline constexpr std::size_t kDirectIoBlock = 4096;

/// A file being written.
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
  /// Memory that is the file's bytes [offset, offset + bytes) (a mapping of a file kept in
  /// memory: FileSystemCapabilities::in_memory), to copy into instead of calling write_at; the
  /// bytes count as written (sync and close keep them). Null where the file has no such memory
  /// for the whole range: write_at then. Valid until the file is closed or destroyed.
  virtual std::uint8_t* memory_at(std::uint64_t offset, std::size_t bytes) {
    (void)offset;
    (void)bytes;
    return nullptr;
  }
  /// The block size (kDirectIoBlock) at which this file's writes go around the page cache: whole
  /// blocks of memory that lies at the same offset within a block as the file bytes it is written to
  /// (create_file_uncached where the store takes O_DIRECT); 0 when every write goes through the
  /// cache or the store's own buffers.
  virtual std::size_t direct_block() const { return 0; }
  /// Makes everything written so far durable: fsync, or the upload of an object.
  /// @post on an object store the object exists whole; nothing may be written after it.
  virtual Status sync() = 0;
  /// Releases the file. A file closed without sync() may be lost (an object is never stored).
  virtual Status close() = 0;
};

/// A regular file opened for reading.
///
/// Thread-safety: read() and read_vectored() may be called from several threads at once.
class ReadableFile {
 public:
  virtual ~ReadableFile() = default;
  /// Its size when it was opened.
  virtual std::uint64_t size() const = 0;
  /// Reads exactly `bytes` at `offset` into `dst`; a file that ends first is corruption naming it.
  virtual Status read(std::uint64_t offset, void* dst, std::size_t bytes) = 0;
  /// Reads the bytes at `offset` onwards into `segments` one after another, in as few reads as
  /// the store allows (one preadv, one ranged GET).
  virtual Status read_vectored(std::uint64_t offset, const std::vector<ReadSegment>& segments);
  /// A hint that [offset, offset + bytes) is read next, in reads smaller than the range: a local
  /// file starts bringing it into the page cache at once (POSIX_FADV_WILLNEED), so that the
  /// device still gets large requests. Costs nothing, and does nothing, elsewhere.
  virtual void will_need(std::uint64_t offset, std::uint64_t bytes) {
    (void)offset;
    (void)bytes;
  }
};

/// What identifies one version of a file without reading it: its size and a tag that changes
/// when it is rewritten (device, inode and times of a local file; the ETag of an object).
struct FileVersion {
  std::uint64_t size = 0;
  std::string tag;

  friend bool operator==(const FileVersion&, const FileVersion&) = default;
};

/// One entry directly below a folder.
struct DirEntry {
  std::string name;
  bool is_dir = false;
};

/// Where a file system differs from a local POSIX one.
struct FileSystemCapabilities {
  /// rename() and exchange() exist and are atomic: a checkpoint is written under a temporary
  /// name and renamed into place. False (object stores): it is written in place and counts once
  /// its metadata exists.
  bool atomic_rename = true;
  /// Folders exist on their own: create_dir() makes one and a root's parent must exist. False
  /// (object stores): a folder is a key prefix that exists once something is below it.
  bool directories = true;
  /// lock_file() works.
  bool locks = true;
  /// Bytes travel to a remote store when a file is synced (object stores): saves there run
  /// synchronously (async_dist_ckpt_save falls back, as DESIGN asks: the upload must finish
  /// before the commit), and a save reports its sync time as upload time.
  bool uploads = false;
  /// Files live in memory (tmpfs, ramfs) and a file written over (reuse_file) may lend its
  /// memory (WritableFile::memory_at): a save may open its files early and copy into them.
  /// False where files cannot lend it (written to several places at once, or paced).
  bool in_memory = false;
  /// A read is a system call served from the page cache or a local device (a local file
  /// system), so a small one costs little more than a large one: a load then reads in pieces
  /// that stay in the core's cache while it hashes them. False (object stores, a file server's
  /// clients): each read is a request, as large as the load's max_read_bytes allows.
  bool cheap_reads = false;
  /// A file written over in place costs no more than a new one: a rename moves a name and a
  /// write into a file does not read it first (a local file system, or a host's own disk through
  /// its file server). False on FUSE and network mounts, where a rename may be a copy, and in
  /// object stores: saves there do not write over retired files (reuses_files_at).
  bool rewrites_in_place = true;
};

/// A regular file's bytes mapped into memory and shared with it, where a file system keeps
/// files in memory (tmpfs): what is written there is the file's at once, with no call and no
/// copy through the kernel, and nothing to flush. Kept across reuses of the file
/// (FileSystem::reuse_file), so that its pages are mapped once.
///
/// Thread-safety: disjoint ranges of data() may be written from several threads at once.
class FileMapping {
 public:
  virtual ~FileMapping() = default;
  virtual std::uint8_t* data() = 0;
  /// The file's size when it was mapped: the bytes of data().
  virtual std::uint64_t size() const = 0;
  /// False once the file has no name left: its memory is then held by this mapping alone.
  virtual bool linked() const = 0;
};

/// Mappings of the files that FileSystem::reuse_file() wrote over, to hand it again.
using FileMappings = std::vector<std::shared_ptr<FileMapping>>;

/// A lock on a file, released when destroyed.
class FileLock {
 public:
  virtual ~FileLock() = default;
};

/// The operations a checkpoint performs on a store. Paths are local paths or object-store URLs
/// (`s3://bucket/key`, `gs://bucket/key`); a folder's children are `folder + "/" + name`.
/// Every error names the path and, where the system gave one, the errno.
///
/// Thread-safety: every method may be called from several threads at once.
class FileSystem {
 public:
  virtual ~FileSystem() = default;

  // -- properties --

  /// What the store that holds `path` can do.
  virtual FileSystemCapabilities capabilities(const std::string& path) const = 0;

  // -- files --

  /// Creates `path` for writing, replacing what was there. Its folder must exist where folders
  /// are real.
  virtual Result<std::unique_ptr<WritableFile>> create_file(const std::string& path) = 0;
  /// Opens the regular file `path` for reading: not_found when there is none; invalid_argument
  /// for a folder, a FIFO or a device (opening one never blocks).
  virtual Result<std::unique_ptr<ReadableFile>> open_file(const std::string& path) = 0;
  /// The version of the regular file `path`; nullopt when nothing is there; invalid_argument
  /// for anything but a regular file.
  virtual Result<std::optional<FileVersion>> stat_file(const std::string& path) = 0;
  /// Removes the file `path`; one that is not there is no error.
  virtual Status remove_file(const std::string& path) = 0;
  /// As create_file(), but writing around the page cache where the store can (O_DIRECT on a
  /// local file system), for bytes that are not read again soon (a checkpoint's data files, a
  /// copy into a durable tier): they then take no page-cache memory and cost no copy into it.
  /// Writes of any size, offset and alignment work; the whole blocks of memory that lies at its
  /// file offset's place within a block (WritableFile::direct_block) go to the device with no
  /// copy. Where the store cannot (the default, and every FileSystemWrapper unless it
  /// says otherwise), and in a folder kept in memory (FileSystemCapabilities::in_memory), it is
  /// create_file().
  virtual Result<std::unique_ptr<WritableFile>> create_file_uncached(const std::string& path) {
    return create_file(path);
  }
  /// As open_file(), but reading around the page cache where the store can: what the device
  /// holds, not what was last written into memory. Reads of 4096-aligned memory at
  /// 4096-aligned offsets take no copy. Where the store cannot, it is open_file().
  virtual Result<std::unique_ptr<ReadableFile>> open_file_uncached(const std::string& path) {
    return open_file(path);
  }
  /// Renames the regular file `from` to `to` (replacing a file there) and opens it for writing
  /// over its old bytes, keeping the pages or blocks it holds instead of freeing them and
  /// allocating new ones; once synced or closed it ends where what was written ends.
  /// With `mappings`, where the store keeps files in memory (tmpfs), writes within the file's
  /// old size go through a FileMapping of it: the one in `*mappings` that maps this file at
  /// this size, else a new one added there (its pages mapped at once); mappings in `*mappings`
  /// of files no longer linked, or of this file at another size, are dropped.
  /// not_found when `from` is not there; unsupported where a store cannot (the default, and
  /// every FileSystemWrapper unless it says otherwise, since it would not see the writes). A
  /// `from` that cannot be written over (not a regular file, not writable, or with other names:
  /// hard links, whose bytes must stay) is dropped, that name only, and an error returned; `to`
  /// is then untouched, free for a new file. The file opened is the file moved to `to`, even
  /// when another process puts another file under `from` meanwhile.
  virtual Result<std::unique_ptr<WritableFile>> reuse_file(const std::string& from, const std::string& to,
                                                           FileMappings* mappings) {
    (void)to;
    (void)mappings;
    return Status{ErrorCode::unsupported, "cannot reuse '" + from + "' here"};
  }
  /// As reuse_file(), but writing around the page cache where the store can, as a file of
  /// create_file_uncached() does (a file kept in memory is written as reuse_file() writes it).
  /// Where the store cannot (the default, and every FileSystemWrapper unless it says
  /// otherwise), it is reuse_file().
  virtual Result<std::unique_ptr<WritableFile>> reuse_file_uncached(const std::string& from, const std::string& to,
                                                                    FileMappings* mappings) {
    return reuse_file(from, to, mappings);
  }

  // -- folders --

  /// Creates the folder `path`, whose parent exists; an existing folder is no error. Where
  /// folders are only key prefixes (object stores) this does nothing.
  virtual Status create_dir(const std::string& path) = 0;
  /// Whether `path` is a folder (for an object store: whether any object lies below it).
  virtual Result<bool> is_dir(const std::string& path) = 0;
  /// The entries directly below `path`, sorted by name; a missing folder lists nothing.
  virtual Result<std::vector<DirEntry>> list_dir(const std::string& path) = 0;
  /// Removes `path` and everything below it; a missing one is no error.
  virtual Status remove_tree(const std::string& path) = 0;
  /// Makes the creations, renames and removals in folder `path` durable (fsync of the folder);
  /// nothing to do on an object store.
  virtual Status sync_dir(const std::string& path) = 0;

  // -- names --

  /// Renames `from` to `to`, atomically replacing a file or an empty folder at `to`.
  /// unsupported where capabilities().atomic_rename is false.
  virtual Status rename(const std::string& from, const std::string& to) = 0;
  /// Swaps `a` and `b` atomically, both of which exist. unsupported without atomic_rename.
  virtual Status exchange(const std::string& a, const std::string& b) = 0;

  /// Whether this process can reach and write the folder `path`: for a local folder, that it
  /// exists and may be written; for an object store, that the endpoint answers, the credentials
  /// are accepted and the bucket exists (each failure with its own error).
  virtual Status check_access(const std::string& path) = 0;

  // -- locks and leftovers --

  /// Takes an exclusive lock on the file `path` (created when missing) without waiting, and
  /// records `holder` in it for whoever is refused. already_exists naming the recorded holder
  /// when someone else holds it; unsupported without capabilities().locks.
  virtual Result<std::unique_ptr<FileLock>> lock_file(const std::string& path,
                                                      const std::string& holder) = 0;
  /// Removes the unfinished writes a store keeps below `path` (open multipart uploads), which no
  /// listing shows; nothing to do for a local file system.
  /// @return how many were removed.
  virtual Result<int> abort_unfinished_writes(const std::string& path) {
    (void)path;
    return 0;
  }
};

/// A FileSystem that passes every call to another: the base of decorators (rate limits, call
/// counts, injected faults) that override only what they change.
class FileSystemWrapper : public FileSystem {
 public:
  explicit FileSystemWrapper(std::shared_ptr<FileSystem> inner) : inner_(std::move(inner)) {}

  FileSystem& inner() const { return *inner_; }

  FileSystemCapabilities capabilities(const std::string& path) const override {
    return inner_->capabilities(path);
  }
  Result<std::unique_ptr<WritableFile>> create_file(const std::string& path) override {
    return inner_->create_file(path);
  }
  Result<std::unique_ptr<ReadableFile>> open_file(const std::string& path) override {
    return inner_->open_file(path);
  }
  Result<std::optional<FileVersion>> stat_file(const std::string& path) override {
    return inner_->stat_file(path);
  }
  Status remove_file(const std::string& path) override { return inner_->remove_file(path); }
  Status create_dir(const std::string& path) override { return inner_->create_dir(path); }
  Result<bool> is_dir(const std::string& path) override { return inner_->is_dir(path); }
  Result<std::vector<DirEntry>> list_dir(const std::string& path) override {
    return inner_->list_dir(path);
  }
  Status remove_tree(const std::string& path) override { return inner_->remove_tree(path); }
  Status sync_dir(const std::string& path) override { return inner_->sync_dir(path); }
  Status rename(const std::string& from, const std::string& to) override {
    return inner_->rename(from, to);
  }
  Status exchange(const std::string& a, const std::string& b) override {
    return inner_->exchange(a, b);
  }
  Status check_access(const std::string& path) override { return inner_->check_access(path); }
  Result<std::unique_ptr<FileLock>> lock_file(const std::string& path,
                                              const std::string& holder) override {
    return inner_->lock_file(path, holder);
  }
  Result<int> abort_unfinished_writes(const std::string& path) override {
    return inner_->abort_unfinished_writes(path);
  }

 private:
  std::shared_ptr<FileSystem> inner_;
};

// -- the file systems --

/// The local POSIX file system, shared by the whole process.
std::shared_ptr<FileSystem> local_file_system();

/// `inner` with every write through it paced so that all of them together move at most
/// `bytes_per_s` (megatron_config.ckpt_write_rate_limit_mib_s: background saves that must not
/// crowd shared storage). `bytes_per_s <= 0` returns `inner` itself.
std::shared_ptr<FileSystem> rate_limited(std::shared_ptr<FileSystem> inner, double bytes_per_s);

// -- helpers over any file system --

/// The parent of `path` (`a/b/c` -> `a/b`, `s3://b/k/x` -> `s3://b/k`); "." for a bare name.
std::string parent_path(const std::string& path);

/// Whether `path` is `folder` or lies below it ("/a/b" is within "/a", "/ab" is not); `folder`
/// without a trailing slash, or "/".
bool path_within(const std::string& path, const std::string& folder);

/// Creates the folder `path` and every missing folder above it.
Status create_dirs(FileSystem& fs, const std::string& path);

/// Whether a regular file is at `path`.
Result<bool> file_exists(FileSystem& fs, const std::string& path);

/// Reads a whole (small) regular file; nullopt when there is none.
Result<std::optional<std::string>> read_small_file(FileSystem& fs, const std::string& path);

/// Writes `path` so that it holds either its old content or all of the new, whatever happens:
/// a temporary file beside it filled by `fill`, synced and renamed over it, then the folder
/// synced; where there is no rename, one upload of the whole file. The temporary file never
/// outlives a failure.
Status write_file_atomic(FileSystem& fs, const std::string& path,
                         const std::function<Status(WritableFile&)>& fill);
/// The same with `content` as the new bytes.
Status write_file_atomic(FileSystem& fs, const std::string& path, const std::string& content);

}  // namespace stagehand
