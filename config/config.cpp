#include "stagehand/config/config.hpp"

namespace stagehand {

const char* to_string(TrainerKind kind) {
  switch (kind) {
    case TrainerKind::sync:
      return "sync";
    case TrainerKind::fully_async:
      return "fully_async";
    case TrainerKind::sft:
      return "sft";
  }
  return "?";
}

const char* to_string(ResumeMode mode) {
  switch (mode) {
    case ResumeMode::none:
      return "none";
    case ResumeMode::latest:
      return "latest";
    case ResumeMode::from_path:
      return "from_path";
  }
  return "?";
}

const char* to_string(HostTransport transport) {
  switch (transport) {
    case HostTransport::file_system:
      return "file_system";
    case HostTransport::network:
      return "network";
  }
  return "?";
}

const char* to_string(WeightTransport transport) {
  switch (transport) {
    case WeightTransport::shm:
      return "shm";
    case WeightTransport::tcp:
      return "tcp";
    case WeightTransport::collective:
      return "collective";
  }
  return "?";
}

const char* to_string(StagingMemory memory) {
  switch (memory) {
    case StagingMemory::persistent:
      return "persistent";
    case StagingMemory::per_save:
      return "per_save";
  }
  return "?";
}

}  // namespace stagehand
