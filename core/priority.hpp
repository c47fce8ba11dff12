#pragma once

#include "stagehand/core/status.hpp"

namespace stagehand {

/// The nice value and I/O priority that checkpoint writer threads take so that they disturb
/// training as little as possible.
inline constexpr int kWriterNice = 10;
/// Best-effort class, lowest level (7).
inline constexpr int kWriterIoPriorityLevel = 7;

/// Lowers the calling thread's CPU priority (nice kWriterNice) and I/O priority (best effort,
/// level kWriterIoPriorityLevel). Linux applies both per thread.
Status lower_current_thread_priority();

/// The calling thread's nice value and I/O priority (class << 13 | level), for tests.
int current_thread_nice();
int current_thread_io_priority();

/// CPU seconds the calling thread has used (CLOCK_THREAD_CPUTIME_ID): what a phase cost it,
/// without the time it waited for a core on a busy machine.
double thread_cpu_seconds();

}  // namespace stagehand
