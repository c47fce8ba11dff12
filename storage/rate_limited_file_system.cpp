// Writes paced so that all of them together move at most a given number of bytes per second.
#include <algorithm>
#include <chrono>
#include <mutex>
#include <thread>

#include "stagehand/storage/file_system.hpp"

namespace stagehand {

namespace {

/// Hands out a shared budget of bytes per second.
///
/// Thread-safety: acquire() may be called from any thread.
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
      next_ += std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(double(bytes) / bytes_per_s_));
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
    return paced(bytes, [&](std::size_t done, std::size_t n) {
      return inner_->append(static_cast<const std::uint8_t*>(data) + done, n);
    });
  }
  Status write_at(std::uint64_t offset, const void* data, std::size_t bytes) override {
    return paced(bytes, [&](std::size_t done, std::size_t n) {
      return inner_->write_at(offset + done, static_cast<const std::uint8_t*>(data) + done, n);
    });
  }
  Status start_writeback(std::uint64_t offset, std::size_t bytes) override {
    return inner_->start_writeback(offset, bytes);
  }
  // Paced in pieces of kPiece, a multiple of any such block: each piece keeps its place.
  std::size_t direct_block() const override { return inner_->direct_block(); }
  Status sync() override { return inner_->sync(); }
  Status close() override { return inner_->close(); }

 private:
  template <typename Write>
  Status paced(std::size_t bytes, Write write) {
    for (std::size_t done = 0; done < bytes;) {
      const std::size_t n = std::min(kPiece, bytes - done);
      limiter_->acquire(n);
      SH_RETURN_IF_ERROR(write(done, n));
      done += n;
    }
    return Status::ok();
  }

  static constexpr std::size_t kPiece = 256u << 10;
  std::unique_ptr<WritableFile> inner_;
  std::shared_ptr<RateLimiter> limiter_;
};

class RateLimitedFileSystem final : public FileSystemWrapper {
 public:
  RateLimitedFileSystem(std::shared_ptr<FileSystem> inner, double bytes_per_s)
      : FileSystemWrapper(std::move(inner)), limiter_(std::make_shared<RateLimiter>(bytes_per_s)) {}
  /// Its files lend no memory: every byte goes through the limiter.
  FileSystemCapabilities capabilities(const std::string& path) const override {
    FileSystemCapabilities capabilities = inner().capabilities(path);
    capabilities.in_memory = false;
    return capabilities;
  }
  Result<std::unique_ptr<WritableFile>> create_file(const std::string& path) override {
    SH_ASSIGN_OR_RETURN(auto file, inner().create_file(path));
    return std::unique_ptr<WritableFile>(
        std::make_unique<RateLimitedFile>(std::move(file), limiter_));
  }
  Result<std::unique_ptr<WritableFile>> create_file_uncached(const std::string& path) override {
    SH_ASSIGN_OR_RETURN(auto file, inner().create_file_uncached(path));
    return std::unique_ptr<WritableFile>(std::make_unique<RateLimitedFile>(std::move(file), limiter_));
  }

 private:
  std::shared_ptr<RateLimiter> limiter_;
};

}  // namespace

std::shared_ptr<FileSystem> rate_limited(std::shared_ptr<FileSystem> inner, double bytes_per_s) {
  if (bytes_per_s <= 0) return inner;
  return std::make_shared<RateLimitedFileSystem>(std::move(inner), bytes_per_s);
}

}  // namespace stagehand
