#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

namespace stagehand {

/// Where a long operation (verify, export, a tier copy) says how far it is: the phase it is in
/// ("verify", "export", "copy", "read back"), the bytes of that phase done and its total.
/// Within a phase `done` never decreases and the last call has done == total once the phase
/// completes; calls never overlap (ProgressCounter serializes them). It runs on the operation's
/// threads: it must be quick and must not throw.
using ProgressFn = std::function<void(std::string_view phase, std::uint64_t done, std::uint64_t total)>;

/// Counts one phase's bytes for a ProgressFn, from any number of threads.
///
/// Thread-safety: add() may be called from any thread; the ProgressFn is called with the
/// counter's lock held, so never from two threads at once, and with totals in order.
class ProgressCounter {
 public:
  /// Reports (phase, 0, total) at once; an empty `report` makes every call a no-op.
  ProgressCounter(ProgressFn report, std::string phase, std::uint64_t total)
      : report_(std::move(report)), phase_(std::move(phase)), total_(total) {
    if (report_) report_(phase_, 0, total_);
  }

  /// Adds `bytes` done and reports the new total.
  void add(std::uint64_t bytes) {
    if (!report_) return;
    std::lock_guard<std::mutex> lock(mutex_);
    done_ += bytes;
    report_(phase_, done_, total_);
  }

  std::uint64_t total() const { return total_; }

 private:
  ProgressFn report_;
  std::string phase_;
  std::uint64_t total_;
  std::mutex mutex_;
  std::uint64_t done_ = 0;
};

}  // namespace stagehand
