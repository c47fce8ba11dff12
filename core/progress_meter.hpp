#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include "stagehand/core/progress.hpp"

namespace stagehand {

/// `bytes` in B, KiB, MiB, GiB or TiB ("1.5 GiB").
std::string human_bytes(std::uint64_t bytes);

/// The progress line of stagehand-ckpt's long commands on a terminal:
///   verify: 1.2 GiB of 4.0 GiB (30%), 410 MiB/s, 7 s left
/// redrawn in place on `out` at most five times a second and once more at each phase's end,
/// then ended by a new line when the phase changes or the meter finishes.
///
/// Thread-safety: the ProgressFn it gives is called one call at a time (ProgressCounter);
/// finish() after the operation returned.
class ProgressMeter {
 public:
  enum class Mode {
    /// When `out` is a terminal, once the operation has run a second: short ones print nothing.
    automatic,
    /// From the first report on, terminal or not (tests, logs that want it).
    always,
    never,
  };

  /// `mode` as spelled on the command line: "auto", "always" or "never".
  static Mode parse_mode(const std::string& text);

  explicit ProgressMeter(Mode mode, std::FILE* out = stderr);
  ~ProgressMeter() { finish(); }
  ProgressMeter(const ProgressMeter&) = delete;
  ProgressMeter& operator=(const ProgressMeter&) = delete;

  /// What the operation reports to (ExportOptions::progress and the like); empty for never, and
  /// for automatic when `out` is not a terminal.
  ProgressFn reporter();
  /// Ends the line, when one was drawn.
  void finish();

 private:
  using Clock = std::chrono::steady_clock;

  void report(std::string_view phase, std::uint64_t done, std::uint64_t total);
  void draw(std::uint64_t done, std::uint64_t total, Clock::time_point now);

  Mode mode_;
  std::FILE* out_;
  bool enabled_ = false;
  std::string phase_;
  Clock::time_point phase_start_{};
  Clock::time_point last_draw_{};
  bool drawn_ = false;
  std::size_t width_ = 0;
};

}  // namespace stagehand
