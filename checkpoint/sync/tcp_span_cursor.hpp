#pragma once

// Where one TCP connection is in sending a version (tcp_publisher.cpp): the next bytes of its
// spans as iovecs straight from host tensors, device tensors staged through host memory one
// bucket at a time (copy engine), and the cursor moved on by the bytes a send took.

#include <sys/uio.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "stagehand/checkpoint/sync/tcp_wire.hpp"
#include "stagehand/core/device.hpp"
#include "stagehand/core/sharded_tensor.hpp"

namespace stagehand::tcp_detail {

class SpanCursor {
 public:
  /// At the start of a version: nothing sent, nothing staged (what was is an older version's).
  void restart() {
    span_i_ = 0;
    span_off_ = 0;
    stage_span_ = SIZE_MAX;
  }
  bool done(const std::vector<Span>& spans) const { return span_i_ >= spans.size(); }
  /// Frees the staging (held only while a version is sent).
  void release() { std::vector<char>().swap(staged_); }

  /// Fills up to `max` iovecs with the next bytes of `spans` of `state`: host tensors' bytes in
  /// place; a device tensor's next bucket (at most `bucket` bytes) copied to host memory first,
  /// ending the list. Returns how many, or -1 when a device copy failed (`*error` says which).
  int next(const std::vector<Span>& spans, const StateDict& state, std::uint64_t bucket, iovec* iov, int max,
           std::string* error) {
    int n_iov = 0;
    std::uint64_t off = span_off_;
    for (std::size_t i = span_i_; i < spans.size() && n_iov < max; ++i, off = 0) {
      const Span& s = spans[i];
      const ShardedTensor& t = state.tensors[s.tensor];
      const std::size_t elem = dtype_size(t.desc.dtype);
      const char* base = static_cast<const char*>(t.tensor.data()) + static_cast<std::uint64_t>(s.first) * elem;
      if (!t.tensor.device().is_cuda()) {
        iov[n_iov].iov_base = const_cast<char*>(base) + off;
        iov[n_iov].iov_len = s.bytes(elem) - off;
        ++n_iov;
        continue;
      }
      if (n_iov > 0) break;  // the host bytes before it go first
      if (stage_span_ != i || off < stage_from_ || off >= stage_from_ + staged_.size()) {
        staged_.resize(static_cast<std::size_t>(std::min<std::uint64_t>(bucket, s.bytes(elem) - off)));
        if (!copy_to_host(t.tensor.device(), base + off, staged_.data(), staged_.size())) {
          *error = "copying '" + t.desc.name + "' from " + t.tensor.device().to_string() + " failed";
          stage_span_ = SIZE_MAX;
          return -1;
        }
        stage_span_ = i;
        stage_from_ = off;
      }
      iov[0].iov_base = staged_.data() + (off - stage_from_);
      iov[0].iov_len = staged_.size() - (off - stage_from_);
      return 1;
    }
    return n_iov;
  }

  /// Moves on by `sent` bytes.
  void advance(const std::vector<Span>& spans, const StateDict& state, std::uint64_t sent) {
    while (sent > 0 && span_i_ < spans.size()) {
      const Span& s = spans[span_i_];
      const std::uint64_t rest = s.bytes(dtype_size(state.tensors[s.tensor].desc.dtype)) - span_off_;
      if (sent >= rest) {
        sent -= rest;
        ++span_i_;
        span_off_ = 0;
      } else {
        span_off_ += sent;
        sent = 0;
      }
    }
  }

 private:
  std::size_t span_i_ = 0;
  std::uint64_t span_off_ = 0;
  // Device tensors: bytes [stage_from_, stage_from_ + staged_.size()) of span stage_span_.
  std::vector<char> staged_;
  std::size_t stage_span_ = SIZE_MAX;
  std::uint64_t stage_from_ = 0;
};

}  // namespace stagehand::tcp_detail
