#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>

namespace stagehand {

/// The XXH3 (64-bit) digest of `bytes` bytes at `data`: the checksum of every data file, chunk
/// and metadata file of a checkpoint.
std::uint64_t xxh3(const void* data, std::size_t bytes);

/// `hash` as 16 lowercase hex digits, as checkpoints write checksums.
std::string xxh3_hex(std::uint64_t hash);

/// The digest that `text` writes as xxh3_hex does; nullopt unless it is exactly 16 lowercase
/// hex digits.
std::optional<std::uint64_t> parse_xxh3_hex(const std::string& text);

/// Streaming XXH3 over a sequence of byte ranges: the digest equals xxh3() of their
/// concatenation. Not safe to share between threads without a lock.
class Xxh3Stream {
 public:
  Xxh3Stream();
  ~Xxh3Stream();
  Xxh3Stream(const Xxh3Stream&) = delete;
  Xxh3Stream& operator=(const Xxh3Stream&) = delete;

  /// Appends `bytes` bytes at `data` to the hashed sequence.
  void update(const void* data, std::size_t bytes);
  /// The digest of everything appended since construction or the last reset(); appending may go on.
  std::uint64_t digest() const;
  /// Starts over, as if newly made.
  void reset();

 private:
  void* state_;
};

/// Xxh3Stream for input that comes a few bytes at a time (text as it is formed or scanned): the
/// pieces are gathered and hashed a block at a time, since hashing a few bytes at a time costs
/// more than copying them. The digest is the same. Not safe to share between threads.
class BufferedXxh3Stream {
 public:
  BufferedXxh3Stream() : buffer_(std::make_unique<char[]>(kBufferBytes)) {}

  /// Appends `bytes` bytes at `data` to the hashed sequence.
  void update(const void* data, std::size_t bytes) {
    if (bytes > kBufferBytes - pending_) {
      flush();
      if (bytes > kBufferBytes) {
        hash_.update(data, bytes);
        return;
      }
    }
    std::memcpy(buffer_.get() + pending_, data, bytes);
    pending_ += bytes;
  }

  /// Appends one byte.
  void update(char c) {
    if (pending_ == kBufferBytes) flush();
    buffer_[pending_++] = c;
  }

  /// The digest of everything appended since construction or the last reset().
  std::uint64_t digest() {
    flush();
    return hash_.digest();
  }

  /// Starts over, as if newly made.
  void reset() {
    pending_ = 0;
    hash_.reset();
  }

 private:
  static constexpr std::size_t kBufferBytes = 64 * 1024;

  void flush() {
    hash_.update(buffer_.get(), pending_);
    pending_ = 0;
  }

  Xxh3Stream hash_;
  std::unique_ptr<char[]> buffer_;
  std::size_t pending_ = 0;
};

}  // namespace stagehand
