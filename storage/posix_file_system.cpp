// The local file system: POSIX calls, each error naming the path and the errno.
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/magic.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "stagehand/core/stream_copy.hpp"
#include "stagehand/storage/file_system.hpp"
#include "stagehand/storage/posix_io.hpp"

namespace stagehand {

namespace {

/// A whole regular file of a file system that keeps files in memory, mapped shared for reading
/// and writing, with the pages it holds mapped at once.
class PosixFileMapping final : public FileMapping {
 public:
  /// Maps the file open at `fd` (read-write), whose stat is `st`.
  static Result<std::shared_ptr<PosixFileMapping>> map(posix::Fd fd, const struct stat& st, const std::string& path) {
    const auto size = static_cast<std::size_t>(st.st_size);
    void* data = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd.get(), 0);
    if (data == MAP_FAILED) return Status::from_errno(errno, "cannot map '" + path + "'");
    return std::shared_ptr<PosixFileMapping>(new PosixFileMapping(std::move(fd), static_cast<std::uint8_t*>(data), st));
  }
  ~PosixFileMapping() override { ::munmap(data_, static_cast<std::size_t>(size_)); }
  PosixFileMapping(const PosixFileMapping&) = delete;
  PosixFileMapping& operator=(const PosixFileMapping&) = delete;

  std::uint8_t* data() override { return data_; }
  std::uint64_t size() const override { return size_; }
  bool linked() const override {
    struct stat st {};
    return ::fstat(fd_.get(), &st) == 0 && st.st_nlink > 0;
  }
  /// Whether this maps the file of `st`, and whole as it is now.
  bool of(const struct stat& st) const { return st.st_dev == dev_ && st.st_ino == ino_; }
  bool maps(const struct stat& st) const { return of(st) && static_cast<std::uint64_t>(st.st_size) == size_; }

 private:
  PosixFileMapping(posix::Fd fd, std::uint8_t* data, const struct stat& st)
      : fd_(std::move(fd)), data_(data), size_(static_cast<std::uint64_t>(st.st_size)), dev_(st.st_dev), ino_(st.st_ino) {}

  posix::Fd fd_;
  std::uint8_t* data_;
  std::uint64_t size_;
  dev_t dev_;
  ino_t ino_;
};

/// Whether a file system (its statfs) keeps files in memory (tmpfs, ramfs): writes through a
/// mapping of a file need no flush, and a crash loses it whatever was synced.
bool in_memory(const struct statfs& fs) {
  return static_cast<unsigned long>(fs.f_type) == TMPFS_MAGIC || static_cast<unsigned long>(fs.f_type) == RAMFS_MAGIC;
}

/// Whether a read from this file system is a request over a network (NFS, SMB, Ceph, Lustre,
/// 9p) or to a user-space server (FUSE: gcsfuse, s3fs, ...), not a system call served from the
/// page cache or a local device.
bool remote(const struct statfs& fs) {
  switch (static_cast<unsigned long>(fs.f_type)) {
    case 0x6969UL:      // NFS
    case 0x65735546UL:  // FUSE
    case 0x517BUL:      // SMB
    case 0xFF534D42UL:  // CIFS
    case 0xFE534D42UL:  // SMB2
    case 0x00C36400UL:  // Ceph
    case 0x0BD00BD0UL:  // Lustre
    case 0x01021997UL:  // 9p
      return true;
    default:
      return false;
  }
}

/// Whether the file open at `fd` lives in memory.
bool in_memory(int fd) {
  struct statfs fs {};
  return ::fstatfs(fd, &fs) == 0 && in_memory(fs);
}

/// A mapping of the whole file at `path`, whose stat is `st`, or null where it is better left
/// unmapped: empty, or with holes (a write into one would need a page that a full tmpfs cannot
/// give, a SIGBUS instead of an error). Writes then take the usual way.
std::shared_ptr<PosixFileMapping> map_whole(const std::string& path, const struct stat& st) {
  if (st.st_size <= 0 || static_cast<std::uint64_t>(st.st_blocks) * 512 < static_cast<std::uint64_t>(st.st_size)) {
    return nullptr;
  }
  posix::Fd fd(::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  struct stat now {};
  if (!fd.valid() || ::fstat(fd.get(), &now) != 0 || now.st_dev != st.st_dev || now.st_ino != st.st_ino ||
      now.st_size != st.st_size) {
    return nullptr;
  }
  auto mapping = PosixFileMapping::map(std::move(fd), st, path);
  return mapping.is_ok() ? *mapping : nullptr;
}

/// `reused`: the file held other bytes before (FileSystem::reuse_file); it is cut where the
/// bytes written end before it is synced or closed. `mapping`: the file mapped whole, at its
/// size when it was opened; bytes written within it are copied there. `direct`: the file opened
/// again with O_DIRECT (reuse_file_uncached); writes go around the page cache where they can
/// (posix::pwrite_around_cache).
class PosixWritableFile final : public WritableFile {
 public:
  PosixWritableFile(int fd, std::string path, bool reused = false, std::shared_ptr<PosixFileMapping> mapping = nullptr,
                    posix::Fd direct = posix::Fd())
      : fd_(fd), path_(std::move(path)), reused_(reused), mapping_(std::move(mapping)), direct_(std::move(direct)) {}
  ~PosixWritableFile() override {
    if (fd_ >= 0) ::close(fd_);
  }

  Status append(const void* data, std::size_t bytes) override {
    SH_RETURN_IF_ERROR(write_at(position_, data, bytes));
    position_ += bytes;
    return Status::ok();
  }

  Status write_at(std::uint64_t offset, const void* data, std::size_t bytes) override {
    const auto* p = static_cast<const std::uint8_t*>(data);
    if (mapping_ && offset < mapping_->size()) {
      const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(bytes, mapping_->size() - offset));
      // The file's pages are not read again soon: past the caches.
      stream_copy(mapping_->data() + offset, p, n);
      p += n;
      offset += n;
      bytes -= n;
    }
    SH_RETURN_IF_ERROR(direct_.valid() ? posix::pwrite_around_cache(direct_.get(), fd_, offset, p, bytes, path_)
                                       : posix::pwrite_all(fd_, offset, p, bytes, path_));
    written_to(offset + bytes);
    return Status::ok();
  }

  std::size_t direct_block() const override { return direct_.valid() ? kDirectIoBlock : 0; }

  std::uint8_t* memory_at(std::uint64_t offset, std::size_t bytes) override {
    if (!mapping_ || offset > mapping_->size() || bytes > mapping_->size() - offset) return nullptr;
    written_to(offset + bytes);
    return mapping_->data() + offset;
  }

  Status start_writeback(std::uint64_t offset, std::size_t bytes) override {
    // Only a hint: file systems without it (ENOSYS, EINVAL) are fine, and a real write error
    // is reported by the fsync that makes the file durable.
    (void)::sync_file_range(fd_, static_cast<off_t>(offset), static_cast<off_t>(bytes),
                            SYNC_FILE_RANGE_WRITE);
    return Status::ok();
  }

  Status sync() override {
    SH_RETURN_IF_ERROR(cut());
    if (::fsync(fd_) != 0) return Status::from_errno(errno, "fsync of '" + path_ + "'");
    return Status::ok();
  }

  Status close() override {
    Status cut_st = fd_ >= 0 ? cut() : Status::ok();
    if (!cut_st.is_ok()) return cut_st;
    int fd = std::exchange(fd_, -1);
    Status direct = direct_.valid() ? direct_.close(path_) : Status::ok();
    if (fd >= 0 && ::close(fd) != 0) return Status::from_errno(errno, "close of '" + path_ + "'");
    return direct;
  }

 private:
  void written_to(std::uint64_t end) {
    if (!reused_) return;
    std::uint64_t seen = end_.load();
    while (seen < end && !end_.compare_exchange_weak(seen, end)) {
    }
  }

  /// A reused file's old bytes past the written ones are cut off; one written through its
  /// mapping gets the time of the writes (a store's writes through memory do not set it).
  Status cut() {
    if (reused_ && ::ftruncate(fd_, static_cast<off_t>(end_.load())) != 0) {
      return Status::from_errno(errno, "cannot truncate '" + path_ + "'");
    }
    if (mapping_ && ::futimens(fd_, nullptr) != 0) {
      return Status::from_errno(errno, "cannot set the times of '" + path_ + "'");
    }
    return Status::ok();
  }

  int fd_;
  std::string path_;
  bool reused_;
  std::shared_ptr<PosixFileMapping> mapping_;
  posix::Fd direct_;
  /// Where append() writes next (writes at a position leave it alone).
  std::uint64_t position_ = 0;
  /// The end of the bytes written (a reused file only).
  std::atomic<std::uint64_t> end_{0};
};

class PosixReadableFile final : public ReadableFile {
 public:
  PosixReadableFile(posix::Fd fd, std::string path, std::uint64_t size)
      : fd_(std::move(fd)), path_(std::move(path)), size_(size) {}
  std::uint64_t size() const override { return size_; }
  Status read(std::uint64_t offset, void* dst, std::size_t bytes) override {
    return posix::pread_exact(fd_.get(), offset, dst, bytes, path_);
  }
  Status read_vectored(std::uint64_t offset, const std::vector<ReadSegment>& segments) override {
    return posix::preadv_exact(fd_.get(), offset, segments, path_);
  }
  void will_need(std::uint64_t offset, std::uint64_t bytes) override {
    if (bytes == 0) return;
    // Only where the range's first or last byte is not in the page cache: the advice walks
    // every page of the range, which costs a warm load more than its reads gain from it. A
    // failure of either call only means the reads go to the device as they come.
    if (cached(offset) && cached(offset + bytes - 1)) return;
    (void)::posix_fadvise(fd_.get(), static_cast<off_t>(offset), static_cast<off_t>(bytes), POSIX_FADV_WILLNEED);
  }

 private:
  /// Whether the byte at `offset` is in the page cache: a read of it that may not wait for the
  /// device (RWF_NOWAIT) succeeds.
  bool cached(std::uint64_t offset) const {
    char byte;
    iovec one{&byte, 1};
    return ::preadv2(fd_.get(), &one, 1, static_cast<off_t>(offset), RWF_NOWAIT) == 1;
  }

  posix::Fd fd_;
  std::string path_;
  std::uint64_t size_;
};

class PosixFileLock final : public FileLock {
 public:
  explicit PosixFileLock(posix::Fd fd) : fd_(std::move(fd)) {}

 private:
  posix::Fd fd_;
};

std::string file_tag(const struct stat& st) {
  auto ns = [](const timespec& t) {
    return std::to_string(static_cast<std::int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec);
  };
  return std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino) + ":" + ns(st.st_mtim) + ":" +
         ns(st.st_ctim);
}

Status not_regular(const std::string& path) {
  return {ErrorCode::invalid_argument, "'" + path + "' is not a regular file"};
}

class PosixFileSystem final : public FileSystem {
 public:
  FileSystemCapabilities capabilities(const std::string& path) const override {
    FileSystemCapabilities capabilities;
    // A path not made yet is asked of the folder it will be made in: its nearest existing
    // ancestor (a local tier's root on a network mount is remote before its first save too).
    std::filesystem::path at = path.empty() ? std::filesystem::path(".") : std::filesystem::path(path);
    struct statfs fs {};
    while (::statfs(at.c_str(), &fs) != 0) {
      const int err = errno;
      std::filesystem::path up = at.parent_path();
      if (up.empty()) up = ".";
      if (err != ENOENT || up == at) {
        capabilities.cheap_reads = true;  // as far as can be told
        return capabilities;
      }
      at = std::move(up);
    }
    capabilities.in_memory = in_memory(fs);
    capabilities.cheap_reads = !remote(fs);
    capabilities.rewrites_in_place = !remote(fs);
    return capabilities;
  }

  Result<std::unique_ptr<WritableFile>> create_file(const std::string& path) override {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return Status::from_errno(errno, "cannot create '" + path + "'");
    return std::unique_ptr<WritableFile>(std::make_unique<PosixWritableFile>(fd, path));
  }

  Result<std::unique_ptr<WritableFile>> reuse_file(const std::string& from, const std::string& to,
                                                   FileMappings* mappings) override {
    return reuse(from, to, mappings, false);
  }

  Result<std::unique_ptr<WritableFile>> reuse_file_uncached(const std::string& from, const std::string& to,
                                                            FileMappings* mappings) override {
    return reuse(from, to, mappings, true);
  }

 private:
  Result<std::unique_ptr<WritableFile>> reuse(const std::string& from, const std::string& to, FileMappings* mappings,
                                              bool uncached) {
    // Taken first under a name of this call's own beside it: another process may put another
    // file under `from` at any moment (a retention moving a retired step's file there), and the
    // file moved to `to` must be the one opened and written. Then opened and checked, and moved
    // only then: a spare that cannot be written over is dropped (its name only) and `to` is left
    // free for a new file.
    static std::atomic<std::uint64_t> takes{0};
    const std::string taken = from + ".taking-" + std::to_string(::getpid()) + "-" + std::to_string(++takes);
    if (::rename(from.c_str(), taken.c_str()) != 0) {
      return Status::from_errno(errno, "cannot take '" + from + "' to write over it");
    }
    // O_NOFOLLOW, O_NONBLOCK: a link or a FIFO is refused at once.
    posix::Fd fd(::open(taken.c_str(), O_WRONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
    if (!fd.valid()) {
      const int err = errno;
      (void)::unlink(taken.c_str());
      return Status::from_errno(err, "cannot open '" + from + "' to write over it");
    }
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_nlink != 1) {
      // A file with another name too (a hard-linked snapshot of the retired step) keeps its
      // bytes: only this name goes.
      (void)::unlink(taken.c_str());
      if (!S_ISREG(st.st_mode)) return not_regular(from);
      return Status{ErrorCode::invalid_argument,
                    "'" + from + "' has other names (hard links): not written over"};
    }
    if (::rename(taken.c_str(), to.c_str()) != 0) {
      const int err = errno;
      (void)::unlink(taken.c_str());
      return Status::from_errno(err, "cannot rename '" + from + "' to '" + to + "'");
    }
    // A file kept in memory is written through a mapping (with `mappings`), never with O_DIRECT.
    const bool memory = (mappings != nullptr || uncached) && in_memory(fd.get());
    std::shared_ptr<PosixFileMapping> mapping;
    if (mappings != nullptr && memory) {
      std::erase_if(*mappings, [&](const std::shared_ptr<FileMapping>& m) {
        const auto* posix = dynamic_cast<const PosixFileMapping*>(m.get());
        return posix == nullptr || !posix->linked() || (posix->of(st) && !posix->maps(st));
      });
      for (const auto& m : *mappings) {
        if (static_cast<const PosixFileMapping*>(m.get())->maps(st)) mapping = std::static_pointer_cast<PosixFileMapping>(m);
      }
      if (!mapping) {
        mapping = map_whole(to, st);
        if (mapping) mappings->push_back(mapping);
      }
    }
    // The same file again with O_DIRECT (by descriptor: the name may change meanwhile); where
    // the file system refuses it, or keeps it in memory, written through the cache.
    posix::Fd direct;
    if (uncached && !memory) {
      direct = posix::Fd(::open(("/proc/self/fd/" + std::to_string(fd.get())).c_str(), O_WRONLY | O_DIRECT | O_CLOEXEC));
    }
    return std::unique_ptr<WritableFile>(
        std::make_unique<PosixWritableFile>(fd.release(), to, true, std::move(mapping), std::move(direct)));
  }

 public:
  Result<std::unique_ptr<WritableFile>> create_file_uncached(const std::string& path) override {
    // A folder kept in memory (tmpfs, which takes O_DIRECT since Linux 6.6) is the page cache:
    // O_DIRECT there would only add a copy.
    if (capabilities(path).in_memory) return create_file(path);
    SH_ASSIGN_OR_RETURN(auto file, posix::create_uncached(path));
    if (file) return file;
    return create_file(path);
  }

  Result<std::unique_ptr<ReadableFile>> open_file_uncached(const std::string& path) override {
    SH_ASSIGN_OR_RETURN(auto file, posix::open_uncached(path));
    if (file) return file;
    return open_file(path);
  }

  Result<std::unique_ptr<ReadableFile>> open_file(const std::string& path) override {
    // O_NONBLOCK: opening a FIFO would otherwise wait for a writer; it is refused below.
    posix::Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
    if (!fd.valid()) return Status::from_errno(errno, "cannot open '" + path + "'");
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) return Status::from_errno(errno, "cannot stat '" + path + "'");
    if (!S_ISREG(st.st_mode)) return not_regular(path);
    return std::unique_ptr<ReadableFile>(std::make_unique<PosixReadableFile>(
        std::move(fd), path, static_cast<std::uint64_t>(st.st_size)));
  }

  Result<std::optional<FileVersion>> stat_file(const std::string& path) override {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
      if (errno == ENOENT || errno == ENOTDIR) return std::optional<FileVersion>{};
      return Status::from_errno(errno, "cannot stat '" + path + "'");
    }
    if (!S_ISREG(st.st_mode)) return not_regular(path);
    return std::optional<FileVersion>{
        FileVersion{static_cast<std::uint64_t>(st.st_size), file_tag(st)}};
  }

  Status remove_file(const std::string& path) override {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT)
      return Status::from_errno(errno, "cannot remove '" + path + "'");
    return Status::ok();
  }

  Status create_dir(const std::string& path) override {
    if (::mkdir(path.c_str(), 0755) == 0) return Status::ok();
    const int err = errno;
    struct stat st {};
    if (err == EEXIST && ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return Status::ok();
    if (err == EEXIST)
      return {ErrorCode::already_exists, "cannot create folder '" + path + "': a file is there"};
    return Status::from_errno(err, "cannot create folder '" + path + "'");
  }

  Result<bool> is_dir(const std::string& path) override {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
      if (errno == ENOENT || errno == ENOTDIR) return false;
      return Status::from_errno(errno, "cannot stat '" + path + "'");
    }
    return S_ISDIR(st.st_mode);
  }

  Result<std::vector<DirEntry>> list_dir(const std::string& path) override {
    std::vector<DirEntry> out;
    DIR* dir = ::opendir(path.c_str());
    if (dir == nullptr) {
      if (errno == ENOENT) return out;
      return Status::from_errno(errno, "cannot list folder '" + path + "'");
    }
    errno = 0;
    while (const dirent* e = ::readdir(dir)) {
      const std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      bool is_dir = e->d_type == DT_DIR;
      if (e->d_type == DT_UNKNOWN) {
        struct stat st {};
        is_dir = ::stat((path + "/" + name).c_str(), &st) == 0 && S_ISDIR(st.st_mode);
      }
      out.push_back({name, is_dir});
      errno = 0;
    }
    const int err = errno;
    ::closedir(dir);
    if (err != 0) return Status::from_errno(err, "cannot list folder '" + path + "'");
    std::sort(out.begin(), out.end(),
              [](const DirEntry& a, const DirEntry& b) { return a.name < b.name; });
    return out;
  }

  Status remove_tree(const std::string& path) override {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
    if (ec) return Status::from_errno(ec.value(), "cannot remove '" + path + "'");
    return Status::ok();
  }

  Status sync_dir(const std::string& path) override {
    posix::Fd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!fd.valid()) return Status::from_errno(errno, "cannot open folder '" + path + "'");
    if (::fsync(fd.get()) != 0) return Status::from_errno(errno, "fsync of folder '" + path + "'");
    return Status::ok();
  }

  Status rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) {
      return Status::from_errno(errno, "cannot rename '" + from + "' to '" + to + "'");
    }
    return Status::ok();
  }

  Status exchange(const std::string& a, const std::string& b) override {
    if (::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) != 0) {
      return Status::from_errno(errno, "cannot swap '" + a + "' with '" + b + "'");
    }
    return Status::ok();
  }

  Status check_access(const std::string& path) override {
    if (::access(path.c_str(), W_OK) != 0)
      return Status::from_errno(errno, "folder '" + path + "'");
    return Status::ok();
  }

  Result<std::unique_ptr<FileLock>> lock_file(const std::string& path,
                                              const std::string& holder) override {
    // 0666 before the umask: another user who may write the folder may take the lock after this
    // run; one who cannot open the file for writing (it belongs to someone else) still locks it
    // through a read-only descriptor, only without recording itself.
    posix::Fd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666));
    bool writable = fd.valid();
    if (!writable && errno == EACCES) fd = posix::Fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) return Status::from_errno(errno, "cannot open the lock file '" + path + "'");
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) return not_regular(path);
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK) return Status::from_errno(errno, "cannot lock '" + path + "'");
      std::string recorded(256, '\0');
      ssize_t n = ::pread(fd.get(), recorded.data(), recorded.size(), 0);
      recorded.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
      while (!recorded.empty() && (recorded.back() == '\n' || recorded.back() == ' '))
        recorded.pop_back();
      if (recorded.empty()) recorded = "which has not recorded itself yet";
      return Status{ErrorCode::already_exists, "'" + path + "' is locked by " + recorded};
    }
    if (writable &&
        (::ftruncate(fd.get(), 0) != 0 || ::pwrite(fd.get(), holder.data(), holder.size(), 0) !=
                                              static_cast<ssize_t>(holder.size()))) {
      return Status::from_errno(errno, "cannot record the holder in '" + path + "'");
    }
    return std::unique_ptr<FileLock>(std::make_unique<PosixFileLock>(std::move(fd)));
  }
};

}  // namespace

std::shared_ptr<FileSystem> local_file_system() {
  static const auto fs = std::make_shared<PosixFileSystem>();
  return fs;
}

}  // namespace stagehand
