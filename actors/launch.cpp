#include "stagehand/actors/launch.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include <cerrno>

#include "stagehand/actors/protocol.hpp"
#include <cstdlib>

namespace stagehand {

namespace {


Result<int> int_setting(const std::optional<int>& flag, const char* flag_name, const char* env, int fallback,
                        bool* found = nullptr) {
  if (flag) {
    if (found != nullptr) *found = true;
    return *flag;
  }
  const char* text = std::getenv(env);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  long value = std::strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || value < 0 || value > 1000000) {
    return Status{ErrorCode::config_error, std::string(env) + "='" + text + "' is not a non-negative integer (or set " +
                                               flag_name + ")"};
  }
  if (found != nullptr) *found = true;
  return static_cast<int>(value);
}

}  // namespace

Result<LaunchInfo> read_launch_info(const LaunchFlags& flags, const char* port_variable, int default_port) {
  LaunchInfo info;
  bool has_world = false;
  SH_ASSIGN_OR_RETURN(info.world_size, int_setting(flags.world_size, "--world-size", "WORLD_SIZE", 1, &has_world));
  SH_ASSIGN_OR_RETURN(info.rank, int_setting(flags.rank, "--rank", "RANK", 0));
  SH_ASSIGN_OR_RETURN(info.local_rank, int_setting(flags.local_rank, "--local-rank", "LOCAL_RANK", info.rank));
  SH_ASSIGN_OR_RETURN(info.master_port, int_setting(flags.master_port, "--master-port", port_variable, default_port));
  if (flags.master_addr) {
    info.master_addr = *flags.master_addr;
  } else if (const char* addr = std::getenv("MASTER_ADDR"); addr != nullptr && *addr != '\0') {
    info.master_addr = addr;
  }
  if (has_world && info.world_size < 1) {
    return Status{ErrorCode::config_error, "WORLD_SIZE (--world-size) must be at least 1"};
  }
  if (info.rank >= info.world_size) {
    return Status{ErrorCode::config_error, "RANK=" + std::to_string(info.rank) + " must be below WORLD_SIZE=" +
                                               std::to_string(info.world_size)};
  }
  if (info.multi_process() && (info.master_port < 1 || info.master_port > 65535)) {
    return Status{ErrorCode::config_error,
                  std::string(port_variable) + "=" + std::to_string(info.master_port) + " is not a TCP port"};
  }
  return info;
}

void register_wire_types(caf::actor_system_config& config) {
  config.load<caf::io::middleman>();
  config.add_message_type<std::vector<std::int32_t>>("std::vector<int32_t>");
  config.add_message_type<SaveCall>("stagehand::SaveCall");
  config.add_message_type<SaveAck>("stagehand::SaveAck");
  config.add_message_type<SaveResult>("stagehand::SaveResult");
  config.add_message_type<FinalizeResult>("stagehand::FinalizeResult");
  config.add_message_type<LocalPlan>("stagehand::LocalPlan");
  config.add_message_type<WriteAssignment>("stagehand::WriteAssignment");
  config.add_message_type<RankSaveReport>("stagehand::RankSaveReport");
  config.add_message_type<CommitInfo>("stagehand::CommitInfo");
  config.add_message_type<LoadCall>("stagehand::LoadCall");
  config.add_message_type<LoadReport>("stagehand::LoadReport");
  config.add_message_type<TrainOrder>("stagehand::TrainOrder");
  config.add_message_type<StepMetrics>("stagehand::StepMetrics");
  config.add_message_type<worker_actor>("stagehand::worker_actor");
  config.add_message_type<std::vector<worker_actor>>("std::vector<stagehand::worker_actor>");
  config.add_message_type<coordinator_actor>("stagehand::coordinator_actor");
  config.add_message_type<dispatch_actor>("stagehand::dispatch_actor");
}

}  // namespace stagehand
