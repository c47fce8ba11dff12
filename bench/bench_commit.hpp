#pragma once

#include "bench/bench_load.hpp"

namespace stagehand::bench {

/// Adds `commit`: the coordinator's commit alone (each report decoded, then metadata built and
/// written, renames, tracker) at the rank count of a checkpoint `save` wrote, from the reports
/// its ranks would send, rebuilt from its metadata; checks the new metadata.json equals the old.
BenchCommand add_commit_command(CLI::App& app);

}  // namespace stagehand::bench
