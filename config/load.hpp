#pragma once

#include <string>
#include <vector>

#include "stagehand/config/config.hpp"
#include "stagehand/core/status.hpp"

namespace stagehand {

/// Parses YAML text into a Config and checks it with validate_config() (rules.hpp). The Config
/// keeps where each key was given (Config::origins). Errors name `source`, the line and the key
/// path, or, for a key that an override set, the override ("--set model.hidden=abc:
/// model.hidden: ..."). Every numeric key is bounded by what the program can run with, and its
/// error gives the bound.
/// @param overrides "dotted.key=value" pairs applied on top of the text, as `--set` does. A value
///        is taken as it is, never as YAML: `trainer.ckpt_path=/data/run #3` keeps its `#`, and an
///        empty value is the empty string.
/// @post a returned Config passes validate_config()
Result<Config> load_config_string(const std::string& text, const std::string& source = "<config>",
                                  const std::vector<std::string>& overrides = {});

/// Reads and parses a YAML file of at most 1 MiB; see load_config_string. A path that is missing,
/// unreadable or a directory is an error naming it, never a run on the defaults.
Result<Config> load_config_file(const std::string& path,
                                const std::vector<std::string>& overrides = {});

}  // namespace stagehand
