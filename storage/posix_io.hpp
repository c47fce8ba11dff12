#pragma once
// Internal to storage/: POSIX reads shared by the local file system and the object-store client
// (which uploads from local spool files). Not installed, not for other layers.

#include <cstdint>
#include <memory>
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
  /// Hands the descriptor over: it is no longer closed here.
  int release() { return std::exchange(fd_, -1); }
  /// Closes it now, naming `path` in the error (close can report a write that failed).
  Status close(const std::string& path);

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

/// Writes all `bytes` at `offset`, again after a short write or EINTR; an error names `path`.
Status pwrite_all(int fd, std::uint64_t offset, const void* data, std::size_t bytes, const std::string& path);

/// Writes all `bytes` at `offset` of one file, open twice: through `direct` (O_DIRECT) the whole
/// blocks, when `data` lies at the same offset within a kDirectIoBlock block as `offset` does;
/// through `cached` the partial blocks at the ends, and everything when it does not lie so (the
/// kernel keeps the two descriptors coherent).
Status pwrite_around_cache(int direct, int cached, std::uint64_t offset, const void* data, std::size_t bytes,
                           const std::string& path);

/// The local file `path` created for writing around the page cache (O_DIRECT): whole blocks of
/// memory at its file offset's place within a block with no copy (pwrite_around_cache), the rest
/// through the page cache. Null (no error) where the file system refuses O_DIRECT.
Result<std::unique_ptr<WritableFile>> create_uncached(const std::string& path);

/// The local regular file `path` opened for reading around the page cache (O_DIRECT): every byte
/// from the device. Null (no error) where the file system refuses O_DIRECT.
Result<std::unique_ptr<ReadableFile>> open_uncached(const std::string& path);

}  // namespace stagehand::posix
