#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace stagehand::bench {

/// A subcommand of stagehand-bench and what runs it once parsed.
struct BenchCommand {
  CLI::App* command = nullptr;
  std::function<int()> run;
};

/// Adds `load`: loads the latest checkpoint `save` left under --out (the same synthetic state)
/// through the WorkerDispatch, checks the loaded values, and prints load_s beside raw_read_s
/// (the same files read plainly on as many threads), the load's phase times and host peaks.
BenchCommand add_load_command(CLI::App& app);

}  // namespace stagehand::bench
