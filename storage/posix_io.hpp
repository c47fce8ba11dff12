#pragma once
// Internal to storage/: POSIX reads shared by the local file system and the object-store client
// (which uploads from local spool files). Not installed, not for other layers.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "stagehand/core/status.hpp"
#include "stagehand/storage/file_system.hpp"

namespace stagehand::posix {

/// An open file descriptor, closed on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd();
  bool valid() const { return fd_ >= 0; }
  int get() const { return fd_; }

 private:
  int fd_ = -1;
};

/// Reads exactly `bytes` at `offset`; a file that ends first is corruption naming `path`.
Status pread_exact(int fd, std::uint64_t offset, void* dst, std::size_t bytes,
                   const std::string& path);

/// Reads the bytes at `offset` onwards into `segments` in turn, with as few preadv calls as the
/// system allows (one for up to IOV_MAX segments); a file that ends first is corruption.
Status preadv_exact(int fd, std::uint64_t offset, const std::vector<ReadSegment>& segments,
                    const std::string& path);

}  // namespace stagehand::posix
