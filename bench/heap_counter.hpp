// Bytes the process holds through operator new, now and at most since a reset: the memory a
// step (for instance a rank reading metadata.json) asks for, peak included, which RSS hides.
#pragma once

#include <cstdint>

namespace stagehand::bench {

/// Bytes allocated through operator new and not yet freed.
std::int64_t heap_bytes_now();

/// The largest heap_bytes_now() since the last reset_heap_peak().
std::int64_t heap_bytes_peak();

/// Starts a new peak at heap_bytes_now().
void reset_heap_peak();

}  // namespace stagehand::bench
