#include "stagehand/core/progress_meter.hpp"

#include <unistd.h>


namespace stagehand {

namespace {

/// Shown once an operation has run this long (automatic mode).
constexpr auto kShowAfter = std::chrono::seconds(1);
/// At most this often a redraw, but for a phase's end.
constexpr auto kRedrawEvery = std::chrono::milliseconds(200);

}  // namespace

std::string human_bytes(std::uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), unit == 0 ? "%.0f %s" : "%.1f %s", value, units[unit]);
  return buf;
}

ProgressMeter::Mode ProgressMeter::parse_mode(const std::string& text) {
  if (text == "always") return Mode::always;
  if (text == "never") return Mode::never;
  return Mode::automatic;
}

ProgressMeter::ProgressMeter(Mode mode, std::FILE* out) : mode_(mode), out_(out) {
  enabled_ = mode == Mode::always || (mode == Mode::automatic && ::isatty(::fileno(out)) == 1);
}

ProgressFn ProgressMeter::reporter() {
  if (!enabled_) return {};
  return [this](std::string_view phase, std::uint64_t done, std::uint64_t total) { report(phase, done, total); };
}

void ProgressMeter::report(std::string_view phase, std::uint64_t done, std::uint64_t total) {
  const Clock::time_point now = Clock::now();
  if (phase != phase_) {
    finish();
    phase_ = phase;
    phase_start_ = now;
    last_draw_ = {};
  }
  const bool ended = done >= total;
  if (mode_ == Mode::automatic && !drawn_ && now - phase_start_ < kShowAfter) return;
  if (!ended && drawn_ && now - last_draw_ < kRedrawEvery) return;
  draw(done, total, now);
}

void ProgressMeter::draw(std::uint64_t done, std::uint64_t total, Clock::time_point now) {
  const double seconds = std::chrono::duration<double>(now - phase_start_).count();
  const double rate = seconds > 0 ? static_cast<double>(done) / seconds : 0;
  std::string line = phase_ + ": " + human_bytes(done) + " of " + human_bytes(total);
  char tail[96];
  const int percent = total == 0 ? 100 : static_cast<int>(100.0 * static_cast<double>(done) / static_cast<double>(total));
  std::snprintf(tail, sizeof(tail), " (%d%%)", percent);
  line += tail;
  if (rate > 0) {
    line += ", " + human_bytes(static_cast<std::uint64_t>(rate)) + "/s";
    if (done < total) {
      std::snprintf(tail, sizeof(tail), ", %.0f s left", static_cast<double>(total - done) / rate);
      line += tail;
    }
  }
  // Spaces over what a longer line before left.
  const std::size_t drawn_width = line.size();
  if (line.size() < width_) line.append(width_ - line.size(), ' ');
  width_ = drawn_width;
  std::fprintf(out_, "\r%s", line.c_str());
  std::fflush(out_);
  drawn_ = true;
  last_draw_ = now;
}

void ProgressMeter::finish() {
  if (drawn_) {
    std::fputc('\n', out_);
    std::fflush(out_);
  }
  drawn_ = false;
  width_ = 0;
}

}  // namespace stagehand
