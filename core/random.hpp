#pragma once

#include <cstdint>

namespace stagehand {

/// SplitMix64: a fast, well-mixed 64-bit hash of a counter, the base of Stagehand's counter-based
/// (stateless, reproducible) random numbers.
constexpr std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace stagehand
