#include "stagehand/config/origins.hpp"

#include <utility>

namespace stagehand {

ConfigOrigins::ConfigOrigins(std::string source, std::map<std::string, std::string> overrides)
    : source_(std::move(source)), overrides_(std::move(overrides)) {}

void ConfigOrigins::add_line(const std::string& path, int line) {
  lines_[path] = line;
}

std::optional<std::string> ConfigOrigins::where(const std::string& path) const {
  if (auto it = overrides_.find(path); it != overrides_.end()) return "--set " + it->second;
  if (auto it = lines_.find(path); it != lines_.end()) {
    return source_ + ":" + std::to_string(it->second);
  }
  const std::string inside = path + ".";
  auto below = overrides_.lower_bound(inside);
  if (below != overrides_.end() && below->first.starts_with(inside)) {
    return "--set " + below->second;
  }
  return std::nullopt;
}

Status ConfigOrigins::error(const std::vector<std::string>& keys, const std::string& what) const {
  std::string where = source_;
  for (const auto& key : keys) {
    if (auto given = this->where(key)) {
      where = *given;
      break;
    }
  }
  return {ErrorCode::config_error,
          (where.empty() ? "" : where + ": ") + keys.front() + ": " + what};
}

}  // namespace stagehand
