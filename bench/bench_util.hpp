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

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench/synthetic_state.hpp"
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

/// The synthetic state's options, shared by every subcommand that saves or loads it.
struct StateArgs {
  int ranks = 2;
  std::string bytes_per_rank = "64M";
  int tensors = 16;
  std::uint64_t seed = 1;
  std::int64_t columns = 1024;

  /// @throws std::invalid_argument on a bad --bytes-per-rank.
  SyntheticStateSpec spec() const { return {ranks, parse_size(bytes_per_rank), tensors, seed, columns}; }
};

/// Adds --ranks, --bytes-per-rank, --tensors, --seed and --columns; `as` says what they must
/// match (for instance "as the save's"), or is empty.
inline void add_state_options(CLI::App* command, StateArgs& args, const std::string& as) {
  const std::string tail = as.empty() ? "" : " (" + as + ")";
  command->add_option("--ranks", args.ranks, "in-process ranks" + tail)->check(CLI::Range(1, 1024));
  command->add_option("--bytes-per-rank", args.bytes_per_rank, "state per rank, e.g. 256M or 1G" + tail);
  command->add_option("--tensors", args.tensors, "tensors per rank" + tail)->check(CLI::Range(1, 100000));
  command->add_option("--seed", args.seed, "state seed" + tail);
  command->add_option("--columns", args.columns,
                      "elements per tensor row; small values give small shards at many tensors" + tail)
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 30));
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
