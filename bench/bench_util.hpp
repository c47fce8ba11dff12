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

/// The largest size parse_size accepts: 2^50 bytes (1 PiB), far beyond any host's memory and
/// well inside what a double and the synthetic state's sizes hold exactly.
inline constexpr std::uint64_t kMaxSize = 1ull << 50;

/// "64M", "1G", "512KiB", "4096": bytes, from 1 to kMaxSize.
/// @throws std::invalid_argument saying what is wrong: not a number, another unit, or a size
///         below one byte (zero, negative, NaN) or above kMaxSize (infinity included).
inline std::uint64_t parse_size(const std::string& text) {
  std::size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(text, &pos);
  } catch (const std::out_of_range&) {
    throw std::invalid_argument("out of range: must be at least 1 byte and at most " + std::to_string(kMaxSize) +
                                " bytes (2^50)");
  } catch (const std::invalid_argument&) {
    throw std::invalid_argument("not a number of bytes (e.g. 4096, 512K, 64M, 1G)");
  }
  std::string unit = text.substr(pos);
  double scale = 1;
  if (unit == "K" || unit == "KiB") scale = 1024.0;
  else if (unit == "M" || unit == "MiB") scale = 1024.0 * 1024;
  else if (unit == "G" || unit == "GiB") scale = 1024.0 * 1024 * 1024;
  else if (!unit.empty()) throw std::invalid_argument("unknown unit '" + unit + "' (K, M, G, KiB, MiB or GiB)");
  const double bytes = value * scale;
  // Written so that NaN fails too.
  if (!(bytes >= 1)) throw std::invalid_argument("must be at least 1 byte");
  if (bytes > static_cast<double>(kMaxSize)) {
    throw std::invalid_argument("must be at most " + std::to_string(kMaxSize) + " bytes (2^50)");
  }
  return static_cast<std::uint64_t>(bytes);
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
  command->add_option("--bytes-per-rank", args.bytes_per_rank, "state per rank, e.g. 256M or 1G (1 byte to 2^50)" + tail);
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
