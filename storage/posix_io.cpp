#include "stagehand/storage/posix_io.hpp"

#include <limits.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace stagehand::posix {

Fd& Fd::operator=(Fd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}

Status pwrite_all(int fd, std::uint64_t offset, const void* data, std::size_t bytes, const std::string& path) {
  const auto* p = static_cast<const std::uint8_t*>(data);
  while (bytes > 0) {
    ssize_t n = ::pwrite(fd, p, bytes, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::from_errno(errno, "write to '" + path + "'");
    }
    p += n;
    offset += static_cast<std::uint64_t>(n);
    bytes -= static_cast<std::size_t>(n);
  }
  return Status::ok();
}

Status Fd::close(const std::string& path) {
  const int fd = std::exchange(fd_, -1);
  if (fd >= 0 && ::close(fd) != 0) return Status::from_errno(errno, "close of '" + path + "'");
  return Status::ok();
}

namespace {

Status ends_early(const std::string& path, std::uint64_t offset, std::size_t left) {
  return {ErrorCode::corruption, "'" + path + "' ends at byte " + std::to_string(offset) +
                                     ", before the " + std::to_string(left) +
                                     " more bytes the metadata expects (truncated?)"};
}

}  // namespace

Status pread_exact(int fd, std::uint64_t offset, void* dst, std::size_t bytes,
                   const std::string& path) {
  auto* p = static_cast<std::uint8_t*>(dst);
  while (bytes > 0) {
    ssize_t n = ::pread(fd, p, bytes, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::from_errno(errno, "read of '" + path + "'");
    }
    if (n == 0) return ends_early(path, offset, bytes);
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
      for (std::size_t i = next; i < iov.size(); ++i)
        left += iov[i].iov_len;
      return ends_early(path, offset, left);
    }
    offset += static_cast<std::uint64_t>(n);
    // Skip what was filled; a segment filled in part continues where the read stopped.
    auto done = static_cast<std::size_t>(n);
    while (done > 0 && done >= iov[next].iov_len)
      done -= iov[next++].iov_len;
    if (done > 0) {
      iov[next].iov_base = static_cast<std::uint8_t*>(iov[next].iov_base) + done;
      iov[next].iov_len -= done;
    }
  }
  return Status::ok();
}

}  // namespace stagehand::posix
