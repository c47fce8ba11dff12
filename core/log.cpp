#include "stagehand/core/log.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace stagehand {

std::shared_ptr<spdlog::logger> logger() {
  static const std::shared_ptr<spdlog::logger> instance = [] {
    auto existing = spdlog::get("stagehand");
    return existing ? existing : spdlog::stderr_color_mt("stagehand");
  }();
  return instance;
}

}  // namespace stagehand
