#include "stagehand/config/load.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <map>
#include <set>
#include <sstream>
#include <utility>
#include <variant>

#include "stagehand/config/rules.hpp"
#include "stagehand/config/schema.hpp"

namespace stagehand {

namespace {

/// Config files are a few hundred bytes; the bound stops `--config /dev/zero` from filling memory.
constexpr std::size_t kMaxConfigBytes = 1 << 20;

/// The names directly under the section at `path` ("" for the top level): its keys and its
/// sections, as the schema lists them.
std::set<std::string> names_under(const std::string& path) {
  const std::string prefix = path.empty() ? "" : path + ".";
  std::set<std::string> names;
  for (const ConfigKey& key : config_keys()) {
    if (!key.path.starts_with(prefix)) continue;
    const std::string rest = key.path.substr(prefix.size());
    names.insert(rest.substr(0, rest.find('.')));
  }
  return names;
}

/// Reads one YAML document into a Config as the schema (schema.hpp) says: which keys exist and
/// what type each holds. Records in the Config's origins where each key stood: a line of the
/// source, or the override that set it. Ranges and the rules between keys are validate_config's.
class ConfigReader {
 public:
  ConfigReader(std::string source, std::map<std::string, std::string> overrides) {
    config_.origins = ConfigOrigins(std::move(source), std::move(overrides));
  }

  /// Reads every section under `root`.
  /// @post config() holds what was read, and the defaults elsewhere.
  Status read(const YAML::Node& root) {
    if (root && !root.IsNull() && !root.IsMap()) {
      return error_at(root.Mark(), "<top level>", "expected a mapping of sections");
    }
    return read_section(root, "");
  }

  Config& config() { return config_; }

 private:
  Status read_section(const YAML::Node& node, const std::string& path) {
    if (!node || node.IsNull()) return Status::ok();
    if (!node.IsMap()) return error(path, "expected a mapping of keys");
    const std::set<std::string> names = names_under(path);
    std::set<std::string> seen;
    for (auto it = node.begin(); it != node.end(); ++it) {
      // By value: `it->first` belongs to a proxy that dies with this statement.
      YAML::Node key_node = it->first;
      if (!key_node.IsScalar()) return error_at(key_node.Mark(), path, "keys must be plain names");
      const std::string name = key_node.Scalar();
      const std::string key_path = path.empty() ? name : path + "." + name;
      if (!seen.insert(name).second) {
        return error_at(key_node.Mark(), key_path, "key appears twice");
      }
      // A key that an override created has no line; the override places it.
      if (!key_node.Mark().is_null()) config_.origins.add_line(key_path, key_node.Mark().line + 1);
      if (names.count(name) == 0) {
        std::string known;
        for (const auto& known_name : names) {
          known += (known.empty() ? "" : ", ") + known_name;
        }
        return error(key_path, "unknown key (known here: " + known + ")");
      }
      const ConfigKey* key = find_config_key(key_path);
      if (key == nullptr) {
        SH_RETURN_IF_ERROR(read_section(it->second, key_path));
      } else {
        SH_RETURN_IF_ERROR(std::visit(
            [&](const auto& kind) { return read_value(kind, key_path, it->second); }, key->value));
      }
    }
    return Status::ok();
  }

  Status read_value(const IntegerKey& key, const std::string& path, const YAML::Node& node) {
    SH_ASSIGN_OR_RETURN(std::string text, scalar(node, path, "an integer"));
    std::int64_t value = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec == std::errc::invalid_argument || end != text.data() + text.size()) {
      return error(path, "expected an integer, got '" + text + "'");
    }
    // Beyond int64 is out of range whatever the bounds, and the message gives both ends.
    if (ec != std::errc()) return error(path, "must be " + key.range.both_ends() + ", got " + text);
    key.field.get(config_) = value;
    return Status::ok();
  }

  Status read_value(const UnsignedKey& key, const std::string& path, const YAML::Node& node) {
    SH_ASSIGN_OR_RETURN(std::string text, scalar(node, path, "a non-negative integer"));
    std::uint64_t value = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec == std::errc::invalid_argument || end != text.data() + text.size()) {
      return error(path, "expected a non-negative integer, got '" + text + "'");
    }
    if (ec != std::errc()) {
      return error(path, "must be at most " + std::to_string(UINT64_MAX) + ", got " + text);
    }
    key.field.get(config_) = value;
    return Status::ok();
  }

  Status read_value(const RealKey& key, const std::string& path, const YAML::Node& node) {
    SH_ASSIGN_OR_RETURN(std::string text, scalar(node, path, "a number"));
    double value = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec == std::errc::invalid_argument || end != text.data() + text.size()) {
      return error(path, "expected a number, got '" + text + "'");
    }
    // Out of range (1e999), inf and nan are no number a key holds; the message quotes the text.
    if (ec != std::errc() || !std::isfinite(value)) {
      return error(path,
                   "must be a finite number, " + key.range.to_string() + ", got '" + text + "'");
    }
    key.field.get(config_) = value;
    return Status::ok();
  }

  Status read_value(const BooleanKey& key, const std::string& path, const YAML::Node& node) {
    SH_ASSIGN_OR_RETURN(key.field.get(config_), boolean(node, path));
    return Status::ok();
  }

  Status read_value(const OptionalBooleanKey& key, const std::string& path,
                    const YAML::Node& node) {
    SH_ASSIGN_OR_RETURN(key.field.get(config_), boolean(node, path));
    return Status::ok();
  }

  Status read_value(const StringKey& key, const std::string& path, const YAML::Node& node) {
    SH_ASSIGN_OR_RETURN(key.field.get(config_), scalar(node, path, "a string"));
    return Status::ok();
  }

  Status read_value(const NameKey& key, const std::string& path, const YAML::Node& node) {
    SH_ASSIGN_OR_RETURN(std::string text, scalar(node, path, "a name"));
    std::string names;
    for (std::size_t i = 0; i < key.names.size(); ++i) {
      if (text == key.names[i]) {
        key.set(config_, key.values[i]);
        return Status::ok();
      }
      names += (names.empty() ? "" : " | ") + key.names[i];
    }
    return error(path, "expected one of " + names + ", got '" + text + "'");
  }

  Result<bool> boolean(const YAML::Node& node, const std::string& path) const {
    SH_ASSIGN_OR_RETURN(std::string text, scalar(node, path, "true or false"));
    static const std::set<std::string> kTrue{"true", "True", "TRUE"};
    static const std::set<std::string> kFalse{"false", "False", "FALSE"};
    if (kTrue.count(text) != 0) return true;
    if (kFalse.count(text) != 0) return false;
    return error(path, "expected true or false, got '" + text + "'");
  }

  Result<std::string> scalar(const YAML::Node& node, const std::string& path,
                             const std::string& expected) const {
    if (!node.IsScalar()) {
      const char* got = node.IsMap() ? "a mapping" : node.IsSequence() ? "a list" : "nothing";
      return error(path, "expected " + expected + ", got " + got);
    }
    return node.Scalar();
  }

  /// An error about the key at `path`, placed where it was given.
  Status error(const std::string& path, const std::string& what) const {
    return config_.origins.error({path}, what);
  }

  /// An error at a place in the source that is not a key's value (a key itself, the top level).
  Status error_at(const YAML::Mark& mark, const std::string& path, const std::string& what) const {
    std::string where = config_.origins.source();
    if (!mark.is_null()) where += ":" + std::to_string(mark.line + 1);
    return {ErrorCode::config_error, where + ": " + path + ": " + what};
  }

  Config config_;
};

/// Sets the key that `assignment` ("dotted.key=value") names in `root`. The value is taken as it
/// is, not as YAML: a `#` or `: ` in a path is part of the path.
/// @return the dotted key path.
Result<std::string> apply_override(YAML::Node root, const std::string& assignment) {
  auto fail = [&assignment](const std::string& what) {
    return Status{ErrorCode::config_error, "--set " + assignment + ": " + what};
  };
  auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) return fail("must look like key.path=value");
  std::string path = assignment.substr(0, eq);
  std::vector<std::string> parts;
  std::stringstream ss(path);
  for (std::string part; std::getline(ss, part, '.');) {
    if (part.empty()) return fail("has an empty key");
    parts.push_back(part);
  }
  if (path.back() == '.') return fail("has an empty key");
  // yaml-cpp nodes are handles; walk with reset() so that assignment never rebinds a parent.
  YAML::Node cursor;
  cursor.reset(root);
  std::string section;
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    if (i > 0) section += '.';
    section += parts[i];
    if (cursor[parts[i]] && !cursor[parts[i]].IsMap() && !cursor[parts[i]].IsNull()) {
      return fail(section + " is not a section");
    }
    YAML::Node next = cursor[parts[i]];
    cursor.reset(next);
  }
  cursor[parts.back()] = YAML::Node(assignment.substr(eq + 1));
  return path;
}

Result<Config> read_config(const YAML::Node& root, const std::string& source,
                           std::map<std::string, std::string> overrides) {
  ConfigReader reader(source, std::move(overrides));
  SH_RETURN_IF_ERROR(reader.read(root));
  SH_RETURN_IF_ERROR(validate_config(reader.config()));
  return std::move(reader.config());
}

}  // namespace

Result<Config> load_config_string(const std::string& text, const std::string& source,
                                  const std::vector<std::string>& overrides) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return Status{ErrorCode::config_error,
                  source + ":" + std::to_string(e.mark.line + 1) + ": invalid YAML: " + e.msg};
  }
  std::map<std::string, std::string> set_by;
  if (!overrides.empty()) {
    if (!root || root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
    if (!root.IsMap()) {
      return Status{ErrorCode::config_error, source + ": expected a mapping of sections"};
    }
    for (const auto& o : overrides) {
      SH_ASSIGN_OR_RETURN(std::string path, apply_override(root, o));
      set_by[path] = o;
    }
  }
  return read_config(root, source, std::move(set_by));
}

Result<Config> load_config_file(const std::string& path,
                                const std::vector<std::string>& overrides) {
  // open(2), not std::ifstream: an ifstream opens a directory and swallows read errors, and
  // either would then run on the defaults.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::from_errno(errno, "cannot read config file '" + path + "'");
  struct CloseOnExit {
    int fd;
    ~CloseOnExit() { ::close(fd); }
  } close_on_exit{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    return Status::from_errno(errno, "cannot read config file '" + path + "'");
  }
  if (S_ISDIR(st.st_mode)) {
    return Status{ErrorCode::invalid_argument,
                  "config file '" + path + "' is a directory, not a YAML file"};
  }
  std::string text;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::from_errno(errno, "cannot read config file '" + path + "'");
    }
    text.append(buffer, static_cast<std::size_t>(n));
    if (text.size() > kMaxConfigBytes) {
      return Status{ErrorCode::invalid_argument, "config file '" + path + "' is larger than " +
                                                     std::to_string(kMaxConfigBytes) +
                                                     " bytes, the most a config file may hold"};
    }
  }
  return load_config_string(text, path, overrides);
}

}  // namespace stagehand
