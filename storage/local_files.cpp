#include "stagehand/storage/local_files.hpp"

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <thread>
#include <utility>

namespace stagehand {

namespace {

class LocalWritableFile final : public WritableFile {
 public:
  LocalWritableFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~LocalWritableFile() override {
    if (fd_ >= 0) ::close(fd_);
  }

  Status append(const void* data, std::size_t bytes) override {
    const auto* p = static_cast<const std::uint8_t*>(data);
    while (bytes > 0) {
      ssize_t n = ::write(fd_, p, bytes);
      if (n < 0) {
        if (errno == EINTR) continue;
        return Status::from_errno(errno, "write to '" + path_ + "'");
      }
      p += n;
      bytes -= static_cast<std::size_t>(n);
    }
    return Status::ok();
  }

  Status write_at(std::uint64_t offset, const void* data, std::size_t bytes) override {
    const auto* p = static_cast<const std::uint8_t*>(data);
    while (bytes > 0) {
      ssize_t n = ::pwrite(fd_, p, bytes, static_cast<off_t>(offset));
      if (n < 0) {
        if (errno == EINTR) continue;
        return Status::from_errno(errno, "write to '" + path_ + "'");
      }
      p += n;
      offset += static_cast<std::uint64_t>(n);
      bytes -= static_cast<std::size_t>(n);
    }
    return Status::ok();
  }

  Status start_writeback(std::uint64_t offset, std::size_t bytes) override {
    // Only a hint: file systems without it (ENOSYS, EINVAL) are fine, and a real write error
    // is reported by the fsync that makes the file durable.
    (void)::sync_file_range(fd_, static_cast<off_t>(offset), static_cast<off_t>(bytes), SYNC_FILE_RANGE_WRITE);
    return Status::ok();
  }

  Status sync() override {
    if (::fsync(fd_) != 0) return Status::from_errno(errno, "fsync of '" + path_ + "'");
    return Status::ok();
  }

  Status close() override {
    int fd = std::exchange(fd_, -1);
    if (fd >= 0 && ::close(fd) != 0) return Status::from_errno(errno, "close of '" + path_ + "'");
    return Status::ok();
  }

 private:
  int fd_;
  std::string path_;
};

class LocalStorage final : public StorageBackend {
 public:
  Result<std::unique_ptr<WritableFile>> open_for_write(const std::string& path) override {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return Status::from_errno(errno, "cannot create '" + path + "'");
    return std::unique_ptr<WritableFile>(std::make_unique<LocalWritableFile>(fd, path));
  }
};

/// Paces every write through it so that all of them together move at most `bytes_per_s`.
class RateLimiter {
 public:
  explicit RateLimiter(double bytes_per_s) : bytes_per_s_(bytes_per_s) {}

  /// Blocks until `bytes` more fit in the budget.
  void acquire(std::size_t bytes) {
    using Clock = std::chrono::steady_clock;
    Clock::time_point done;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto now = Clock::now();
      if (next_ < now) next_ = now;
      next_ += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(double(bytes) / bytes_per_s_));
      done = next_;
    }
    std::this_thread::sleep_until(done);
  }

 private:
  double bytes_per_s_;
  std::mutex mutex_;
  std::chrono::steady_clock::time_point next_{};
};

class RateLimitedFile final : public WritableFile {
 public:
  RateLimitedFile(std::unique_ptr<WritableFile> inner, std::shared_ptr<RateLimiter> limiter)
      : inner_(std::move(inner)), limiter_(std::move(limiter)) {}
  Status append(const void* data, std::size_t bytes) override {
    const auto* p = static_cast<const std::uint8_t*>(data);
    for (std::size_t done = 0; done < bytes;) {
      std::size_t n = std::min(kPiece, bytes - done);
      limiter_->acquire(n);
      SH_RETURN_IF_ERROR(inner_->append(p + done, n));
      done += n;
    }
    return Status::ok();
  }
  Status write_at(std::uint64_t offset, const void* data, std::size_t bytes) override {
    const auto* p = static_cast<const std::uint8_t*>(data);
    for (std::size_t done = 0; done < bytes;) {
      std::size_t n = std::min(kPiece, bytes - done);
      limiter_->acquire(n);
      SH_RETURN_IF_ERROR(inner_->write_at(offset + done, p + done, n));
      done += n;
    }
    return Status::ok();
  }
  Status start_writeback(std::uint64_t offset, std::size_t bytes) override {
    return inner_->start_writeback(offset, bytes);
  }
  Status sync() override { return inner_->sync(); }
  Status close() override { return inner_->close(); }

 private:
  static constexpr std::size_t kPiece = 256u << 10;
  std::unique_ptr<WritableFile> inner_;
  std::shared_ptr<RateLimiter> limiter_;
};

class RateLimitedStorage final : public StorageBackend {
 public:
  RateLimitedStorage(std::shared_ptr<StorageBackend> inner, double bytes_per_s)
      : inner_(std::move(inner)), limiter_(std::make_shared<RateLimiter>(bytes_per_s)) {}
  Result<std::unique_ptr<WritableFile>> open_for_write(const std::string& path) override {
    SH_ASSIGN_OR_RETURN(auto file, inner_->open_for_write(path));
    return std::unique_ptr<WritableFile>(std::make_unique<RateLimitedFile>(std::move(file), limiter_));
  }

 private:
  std::shared_ptr<StorageBackend> inner_;
  std::shared_ptr<RateLimiter> limiter_;
};

}  // namespace

std::shared_ptr<StorageBackend> local_storage() {
  static const auto backend = std::make_shared<LocalStorage>();
  return backend;
}

std::shared_ptr<StorageBackend> rate_limited_storage(std::shared_ptr<StorageBackend> inner, double bytes_per_s) {
  if (bytes_per_s <= 0) return inner;
  return std::make_shared<RateLimitedStorage>(std::move(inner), bytes_per_s);
}

Status fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::from_errno(errno, "cannot open folder '" + dir + "'");
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) return Status::from_errno(err, "fsync of folder '" + dir + "'");
  return Status::ok();
}

Status write_file_atomic(const std::string& path, const std::string& content) {
  return write_file_atomic(path, [&](WritableFile& file) { return file.append(content.data(), content.size()); });
}

Status write_file_atomic(const std::string& path, const std::function<Status(WritableFile&)>& fill) {
  std::string tmp = path + ".tmp";
  Status st = [&]() -> Status {
    SH_ASSIGN_OR_RETURN(auto file, local_storage()->open_for_write(tmp));
    SH_RETURN_IF_ERROR(fill(*file));
    SH_RETURN_IF_ERROR(file->sync());
    SH_RETURN_IF_ERROR(file->close());
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      return Status::from_errno(errno, "cannot rename '" + tmp + "' to '" + path + "'");
    }
    return Status::ok();
  }();
  if (!st.is_ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  std::string parent = std::filesystem::path(path).parent_path().string();
  return fsync_dir(parent.empty() ? "." : parent);
}

Result<std::string> read_small_file(const std::string& path) {
  SH_ASSIGN_OR_RETURN(ReadOnlyFile file, ReadOnlyFile::open(path));
  SH_ASSIGN_OR_RETURN(std::uint64_t size, file_size(path));
  std::string out(size, '\0');
  SH_RETURN_IF_ERROR(pread_exact(file.fd(), 0, out.data(), out.size(), path));
  return out;
}

Status pread_exact(int fd, std::uint64_t offset, void* dst, std::size_t bytes,
                   const std::string& path) {
  auto* p = static_cast<std::uint8_t*>(dst);
  while (bytes > 0) {
    ssize_t n = ::pread(fd, p, bytes, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::from_errno(errno, "read of '" + path + "'");
    }
    if (n == 0) {
      return {ErrorCode::corruption, "'" + path + "' ends at byte " + std::to_string(offset) +
                                         ", before the " + std::to_string(bytes) +
                                         " more bytes the metadata expects (truncated?)"};
    }
    p += n;
    offset += static_cast<std::uint64_t>(n);
    bytes -= static_cast<std::size_t>(n);
  }
  return Status::ok();
}

Status preadv_exact(int fd, std::uint64_t offset, const std::vector<ReadSegment>& segments,
                    const std::string& path) {
  std::vector<iovec> iov;
  iov.reserve(segments.size());
  for (const auto& s : segments) {
    if (s.bytes > 0) iov.push_back({s.dst, s.bytes});
  }
  std::size_t next = 0;
  const auto max_iov = static_cast<std::size_t>(IOV_MAX);
  while (next < iov.size()) {
    const int count = static_cast<int>(std::min(max_iov, iov.size() - next));
    ssize_t n = ::preadv(fd, iov.data() + next, count, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::from_errno(errno, "read of '" + path + "'");
    }
    if (n == 0) {
      std::size_t left = 0;
      for (std::size_t i = next; i < iov.size(); ++i) left += iov[i].iov_len;
      return {ErrorCode::corruption, "'" + path + "' ends at byte " + std::to_string(offset) +
                                         ", before the " + std::to_string(left) +
                                         " more bytes the metadata expects (truncated?)"};
    }
    offset += static_cast<std::uint64_t>(n);
    // Skip what was filled; a segment filled in part continues where the read stopped.
    auto done = static_cast<std::size_t>(n);
    while (done > 0 && done >= iov[next].iov_len) done -= iov[next++].iov_len;
    if (done > 0) {
      iov[next].iov_base = static_cast<std::uint8_t*>(iov[next].iov_base) + done;
      iov[next].iov_len -= done;
    }
  }
  return Status::ok();
}

Result<std::uint64_t> file_size(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return Status::from_errno(errno, "cannot stat '" + path + "'");
  return static_cast<std::uint64_t>(st.st_size);
}

Result<ReadOnlyFile> ReadOnlyFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::from_errno(errno, "cannot open '" + path + "'");
  return ReadOnlyFile(fd, path);
}

ReadOnlyFile::ReadOnlyFile(ReadOnlyFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)) {}

ReadOnlyFile& ReadOnlyFile::operator=(ReadOnlyFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
  }
  return *this;
}

ReadOnlyFile::~ReadOnlyFile() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace stagehand
