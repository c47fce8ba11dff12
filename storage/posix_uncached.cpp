// Local files written and read around the page cache (O_DIRECT), for FileSystem's
// create_file_uncached() and open_file_uncached().
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "stagehand/storage/posix_io.hpp"

namespace stagehand::posix {

namespace {

bool aligned(std::uint64_t v) { return v % kDirectIoBlock == 0; }
bool aligned(const void* p) { return aligned(reinterpret_cast<std::uintptr_t>(p)); }

/// Writes through two descriptors of the file (pwrite_around_cache): `direct_` (O_DIRECT) and
/// `cached_`; fsync syncs the file. A writer that wants its bytes to go direct places its memory
/// at its file offset's place within a block (SaveEngineOptions::uncached_writes).
class UncachedWritableFile final : public WritableFile {
 public:
  UncachedWritableFile(Fd direct, Fd cached, std::string path)
      : direct_(std::move(direct)), cached_(std::move(cached)), path_(std::move(path)) {}

  Status append(const void* data, std::size_t bytes) override {
    SH_RETURN_IF_ERROR(write_at(position_, data, bytes));
    position_ += bytes;
    return Status::ok();
  }

  Status write_at(std::uint64_t offset, const void* data, std::size_t bytes) override {
    return pwrite_around_cache(direct_.get(), cached_.get(), offset, data, bytes, path_);
  }

  std::size_t direct_block() const override { return kDirectIoBlock; }

  Status sync() override {
    if (::fsync(direct_.get()) != 0) return Status::from_errno(errno, "fsync of '" + path_ + "'");
    return Status::ok();
  }

  Status close() override {
    Status direct = direct_.close(path_);
    Status cached = cached_.close(path_);
    return direct.is_ok() ? cached : direct;
  }

 private:
  Fd direct_;
  Fd cached_;
  std::string path_;
  std::uint64_t position_ = 0;
};

/// Reads through O_DIRECT: whole blocks into aligned memory at aligned offsets with no copy,
/// everything else through one aligned block of its own, so that every byte comes from the
/// device (after the kernel wrote back what was cached), never from the page cache.
class UncachedReadableFile final : public ReadableFile {
 public:
  UncachedReadableFile(Fd fd, std::string path, std::uint64_t size)
      : fd_(std::move(fd)), path_(std::move(path)), size_(size) {}
  std::uint64_t size() const override { return size_; }

  Status read(std::uint64_t offset, void* dst, std::size_t bytes) override {
    auto* p = static_cast<std::uint8_t*>(dst);
    if (aligned(offset) && aligned(p)) {
      const std::size_t whole = bytes - bytes % kDirectIoBlock;
      SH_RETURN_IF_ERROR(pread_exact(fd_.get(), offset, p, whole, path_));
      p += whole;
      offset += whole;
      bytes -= whole;
    }
    if (bytes == 0) return Status::ok();
    std::unique_ptr<std::uint8_t, decltype(&std::free)> block(
        static_cast<std::uint8_t*>(std::aligned_alloc(kDirectIoBlock, kDirectIoBlock)), &std::free);
    if (!block) return Status{ErrorCode::no_space, "cannot allocate a block to read '" + path_ + "'"};
    while (bytes > 0) {
      const std::uint64_t start = offset - offset % kDirectIoBlock;
      const auto skip = static_cast<std::size_t>(offset - start);
      const std::size_t n = std::min<std::size_t>(bytes, kDirectIoBlock - skip);
      // A block that holds the file's end reads short: only the bytes asked for must be there.
      ssize_t got;
      do {
        got = ::pread(fd_.get(), block.get(), kDirectIoBlock, static_cast<off_t>(start));
      } while (got < 0 && errno == EINTR);
      if (got < 0) return Status::from_errno(errno, "read of '" + path_ + "'");
      if (static_cast<std::size_t>(got) < skip + n) {
        return Status{ErrorCode::corruption, "'" + path_ + "' ends at byte " +
                                                 std::to_string(start + static_cast<std::uint64_t>(got)) +
                                                 ", before byte " + std::to_string(offset + n)};
      }
      std::memcpy(p, block.get() + skip, n);
      p += n;
      offset += n;
      bytes -= n;
    }
    return Status::ok();
  }

 private:
  Fd fd_;
  std::string path_;
  std::uint64_t size_;
};

}  // namespace

Status pwrite_around_cache(int direct, int cached, std::uint64_t offset, const void* data, std::size_t bytes,
                           const std::string& path) {
  const auto* p = static_cast<const std::uint8_t*>(data);
  // Unsigned arithmetic: the difference is taken modulo 2^64, which kDirectIoBlock divides.
  if ((offset - reinterpret_cast<std::uintptr_t>(p)) % kDirectIoBlock == 0) {
    // Cached up to the first block boundary: that block's other bytes (a header, the previous
    // write's tail) are in the page cache.
    const auto head = static_cast<std::size_t>(std::min<std::uint64_t>(bytes, (kDirectIoBlock - offset % kDirectIoBlock) % kDirectIoBlock));
    SH_RETURN_IF_ERROR(pwrite_all(cached, offset, p, head, path));
    p += head;
    offset += head;
    bytes -= head;
    // A file system that asks more alignment of O_DIRECT than it refuses at open (a larger
    // logical block or page) refuses the write (EINVAL): those bytes go through the cache.
    for (std::size_t whole = bytes - bytes % kDirectIoBlock; whole > 0;) {
      const ssize_t n = ::pwrite(direct, p, whole, static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) continue;
      // Refused, or nothing written (which a regular file does not do): through the cache.
      if ((n < 0 && errno == EINVAL) || n == 0) break;
      if (n < 0) return Status::from_errno(errno, "write to '" + path + "'");
      p += n;
      offset += static_cast<std::uint64_t>(n);
      bytes -= static_cast<std::size_t>(n);
      whole -= static_cast<std::size_t>(n);
    }
  }
  return pwrite_all(cached, offset, p, bytes, path);
}

Result<std::unique_ptr<WritableFile>> create_uncached(const std::string& path) {
  Fd direct(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0644));
  if (!direct.valid()) {
    if (errno == EINVAL) return std::unique_ptr<WritableFile>();
    return Status::from_errno(errno, "cannot create '" + path + "'");
  }
  Fd cached(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  if (!cached.valid()) return Status::from_errno(errno, "cannot open '" + path + "'");
  return std::unique_ptr<WritableFile>(std::make_unique<UncachedWritableFile>(std::move(direct), std::move(cached), path));
}

Result<std::unique_ptr<ReadableFile>> open_uncached(const std::string& path) {
  // O_NONBLOCK: opening a FIFO would otherwise wait for a writer.
  Fd fd(::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC | O_NONBLOCK));
  if (!fd.valid()) {
    if (errno == EINVAL) return std::unique_ptr<ReadableFile>();
    return Status::from_errno(errno, "cannot open '" + path + "'");
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return Status::from_errno(errno, "cannot stat '" + path + "'");
  if (!S_ISREG(st.st_mode)) return Status{ErrorCode::invalid_argument, "'" + path + "' is not a regular file"};
  return std::unique_ptr<ReadableFile>(
      std::make_unique<UncachedReadableFile>(std::move(fd), path, static_cast<std::uint64_t>(st.st_size)));
}

}  // namespace stagehand::posix
