#pragma once

#include <caf/fwd.hpp>
#include <chrono>
#include <optional>
#include <string>

#include "stagehand/core/status.hpp"

namespace stagehand {

/// What every process of a multi-process world must agree on before any message crosses:
/// bumped whenever a message between processes changes.
inline constexpr const char* kWireVersion = "stagehand-wire/4";

/// The variable that sets the port of Stagehand's own control connections when it is embedded
/// in a trainer of one process per rank (the Checkpointer): not MASTER_PORT, which the trainer's
/// torch.distributed or NCCL rendezvous uses.
inline constexpr const char* kControlPortVariable = "STAGEHAND_PORT";
/// Its default.
inline constexpr int kDefaultControlPort = 29577;

/// Where this process sits in a launch of one process per rank, as cluster launchers describe it
/// (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT).
struct LaunchInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  /// How long rank 0 waits for every rank to join, and a rank for rank 0 to answer.
  std::chrono::milliseconds join_timeout = std::chrono::seconds(60);
  /// Sent when joining; a different one is refused.
  std::string wire_version = kWireVersion;
  /// What names the job (the Checkpointer's root, stagehand-train's checkpoint path), sent when
  /// joining: a process of another job that reaches this port (two jobs on one host, both on the
  /// default port) is refused, named, and does not fail this job's start.
  std::string job;

  bool multi_process() const { return world_size > 1; }
  std::string master() const { return master_addr + ":" + std::to_string(master_port); }
};

/// Flags that override the environment; unset ones fall back to it.
struct LaunchFlags {
  std::optional<int> rank;
  std::optional<int> world_size;
  std::optional<int> local_rank;
  std::optional<std::string> master_addr;
  std::optional<int> master_port;
};

/// The launch from `flags` and the environment. No WORLD_SIZE anywhere: one process (world size 1).
/// Errors name the variable or flag: non-numbers, RANK outside [0, WORLD_SIZE), bad ports.
/// @param port_variable where the port comes from: MASTER_PORT for stagehand-train, which is
///        the trainer itself; kControlPortVariable for an embedded Checkpointer.
Result<LaunchInfo> read_launch_info(const LaunchFlags& flags, const char* port_variable = "MASTER_PORT",
                                    int default_port = 29500);

/// Loads CAF's middleman and registers every type that crosses a process: call on the config of
/// every process before its actor system is created.
void register_wire_types(caf::actor_system_config& config);

}  // namespace stagehand
