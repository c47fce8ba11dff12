#pragma once

#include <cstddef>

namespace stagehand {

/// Where stream_copy() starts bypassing the caches by default: below it the destination likely
/// stays in cache for its next reader, and the fence at the end costs more than it saves.
inline constexpr std::size_t kStreamCopyMinBytes = 256u << 10;

/// Where a copy into a destination known to be cold (a load's copy of a chunk into another
/// rank's block) starts bypassing the caches: from here on the fence at the end costs less than
/// reading the destination's lines into the cache would.
inline constexpr std::size_t kColdCopyMinBytes = 16u << 10;

/// Copies `bytes` from `src` to `dst` (not overlapping), as std::memcpy does, for copies whose
/// destination is not read again soon: a staging snapshot, a file's pages. From `min_bytes` on
/// (at least 256), the stores bypass the caches (x86-64 non-temporal stores, AVX2 where the CPU
/// has it, else SSE2), so the destination's lines are not first read into the cache: about a
/// quarter faster for copies larger than the caches, and the caches keep what the trainer uses.
/// Smaller copies, and other CPUs, use std::memcpy.
void stream_copy(void* dst, const void* src, std::size_t bytes, std::size_t min_bytes = kStreamCopyMinBytes);

/// stream_copy() with AVX2 allowed or not (its SSE2 code; AVX2 only where the CPU has it), so
/// that a test reaches both on one machine.
void stream_copy_with(void* dst, const void* src, std::size_t bytes, bool avx2,
                      std::size_t min_bytes = kStreamCopyMinBytes);

}  // namespace stagehand
