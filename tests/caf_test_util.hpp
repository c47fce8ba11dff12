#pragma once

#include <caf/all.hpp>

#include "stagehand/strategy/messages.hpp"

namespace stagehand::test {

/// One actor system configuration for a test executable, with Stagehand's error category.
inline caf::actor_system_config& system_config() {
  static caf::actor_system_config cfg = [] {
    caf::actor_system_config c;
    register_stagehand_errors(c);
    return c;
  }();
  return cfg;
}

}  // namespace stagehand::test
