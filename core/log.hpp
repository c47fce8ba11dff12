#pragma once

#include <memory>

namespace spdlog {
class logger;
}

namespace stagehand {

/// The "stagehand" logger (stderr by default). Tests and embedders may add sinks to it.
std::shared_ptr<spdlog::logger> logger();

}  // namespace stagehand
