#pragma once

#include "bench/bench_load.hpp"

namespace stagehand::bench {

/// Adds `copy`: the bare copies a save and a load are measured against: one device-to-host copy
/// of --bytes from device memory (default_device(0): the GPU, or the simulated one) into pinned
/// host memory on a stream of the process's copy engine, and one host-to-device copy back, each
/// waited for on its event; --repeat times, one JSON line each (bare_d2h_s, bare_h2d_s).
BenchCommand add_copy_command(CLI::App& app);

}  // namespace stagehand::bench
