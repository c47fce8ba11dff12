// stagehand-xxh3-speed [MIB]: how fast stagehand::xxh3 (the hash every save and load runs, with
// the library's run-time vector dispatch where the build has it) goes on this CPU, in GB/s:
// a 256 KiB buffer hashed over and over (in the core's cache, as a load hashes each read it just
// made: loader.hpp's kCheapReadBytes) and a buffer of MIB MiB (default 1024) hashed once (from
// memory), the best of 3 each.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "stagehand/core/xxh3.hpp"

namespace {

/// Best GB/s of 3 runs of `rounds` hashes of `bytes` at `data`.
double best_gbps(const std::uint8_t* data, std::size_t bytes, int rounds, std::uint64_t& sink) {
  double best = 0;
  for (int run = 0; run < 3; ++run) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < rounds; ++i) sink ^= stagehand::xxh3(data, bytes);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, static_cast<double>(bytes) * rounds / s / 1e9);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const std::size_t mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1024;
  if (mib == 0) {
    std::fprintf(stderr, "usage: stagehand-xxh3-speed [MIB > 0]\n");
    return 2;
  }
  std::uint64_t sink = 0;
  std::vector<std::uint8_t> small(256u << 10, 7);
  std::vector<std::uint8_t> large(mib << 20, 3);  // written: its pages are there before the timing
  const double cached = best_gbps(small.data(), small.size(), 8192, sink);
  const double memory = best_gbps(large.data(), large.size(), 1, sink);
  std::printf("{\"xxh3_cached_gbps\":%.1f,\"xxh3_memory_gbps\":%.1f,\"memory_mib\":%zu,\"sink\":%llu}\n", cached,
              memory, mib, static_cast<unsigned long long>(sink & 1));
  return 0;
}
