#pragma once

#include "bench/bench_load.hpp"

namespace stagehand::bench {

/// Adds `metadata`: what each rank of a load spends reading the metadata of the checkpoint
/// `save` left under --out, as load_checkpoint reads it (its part, metadata.json read once per
/// process) and, with --whole, as every rank reading and checking all of it would.
BenchCommand add_metadata_command(CLI::App& app);

}  // namespace stagehand::bench
