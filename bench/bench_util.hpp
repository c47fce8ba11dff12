// Small helpers of stagehand-bench's subcommands.
#pragma once

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "stagehand/core/device.hpp"

namespace stagehand::bench {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  if (v.empty()) return 0;
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

/// "64M", "1G", "512KiB", "4096": bytes. @throws std::invalid_argument on another unit.
inline std::uint64_t parse_size(const std::string& text) {
  std::size_t pos = 0;
  double value = std::stod(text, &pos);
  std::string unit = text.substr(pos);
  double scale = 1;
  if (unit == "K" || unit == "KiB") scale = 1024.0;
  else if (unit == "M" || unit == "MiB") scale = 1024.0 * 1024;
  else if (unit == "G" || unit == "GiB") scale = 1024.0 * 1024 * 1024;
  else if (!unit.empty()) throw std::invalid_argument("unknown unit '" + unit + "'");
  return static_cast<std::uint64_t>(value * scale);
}

/// Resident set size of this process now (VmRSS).
inline std::uint64_t current_rss_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

/// The largest resident set size this process had so far.
inline std::uint64_t max_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<std::uint64_t>(usage.ru_maxrss) * 1024;
}

/// The fields every JSON line of a save or load starts with.
inline nlohmann::json bench_line(const char* mode, int repeat, int ranks, int thread_count) {
  nlohmann::json line;
  line["mode"] = mode;
  line["repeat"] = repeat;
  line["device"] = default_device(0).to_string();
  line["ranks"] = ranks;
  line["thread_count"] = thread_count;
  return line;
}

}  // namespace stagehand::bench
