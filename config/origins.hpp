#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "stagehand/core/status.hpp"

namespace stagehand {

/// Where each key of a loaded config was given: a line of its source, or the `--set` override
/// that set it. The loader fills it in; every rule checked afterwards, in config/ or in a layer
/// above (the reference model's limits, in models/), places its error with it, so that each
/// config error names the key path and where it was given. A config built in code has an empty
/// one, and its errors name the key alone.
///
/// Thread-safety: a value; const members may be called from any thread.
class ConfigOrigins {
 public:
  // -- constructors --

  ConfigOrigins() = default;

  /// @param source what lines refer to: the file name, or "<config>" for text.
  /// @param overrides the `--set` assignment ("dotted.key=value") that set each key path, by
  ///        key path.
  ConfigOrigins(std::string source, std::map<std::string, std::string> overrides);

  // -- recording --

  /// Records that the key at `path` stands on `line` (1-based) of the source.
  void add_line(const std::string& path, int line);

  // -- properties --

  /// The file name (or "<config>") of a loaded config; empty for one built in code.
  const std::string& source() const { return source_; }

  /// Where the value at `path` was given: "--set <assignment>" for the override that set it,
  /// "<source>:<line>" for a line of the source, else the override that created a section on
  /// the way to it (`trainr` in `--set trainr.seed=1`); nothing for a default.
  std::optional<std::string> where(const std::string& path) const;

  // -- errors --

  /// A config_error about `keys.front()` in a rule that spans `keys`:
  /// "<where>: <keys.front()>: <what>", placed where the first of `keys` that was given at all
  /// was given. When each is a default it names the source alone, or nothing before the key for
  /// a config built in code.
  /// @pre !keys.empty()
  Status error(const std::vector<std::string>& keys, const std::string& what) const;

 private:
  std::string source_;
  std::map<std::string, std::string> overrides_;
  std::map<std::string, int> lines_;
};

}  // namespace stagehand
