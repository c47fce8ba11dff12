#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "stagehand/config/config.hpp"
#include "stagehand/config/origins.hpp"
#include "stagehand/core/status.hpp"

namespace stagehand {

/// The values an integer key accepts: [lowest, highest].
struct IntegerRange {
  std::int64_t lowest = INT64_MIN;
  std::int64_t highest = INT64_MAX;

  bool contains(std::int64_t value) const { return value >= lowest && value <= highest; }
  /// "at least 1" when there is no upper bound, else "between 1 and 256".
  std::string to_string() const;
  /// "between 1 and 9223372036854775807", for a value beyond int64 (whose upper bound matters).
  std::string both_ends() const;
};

/// The values a real-valued key accepts: [lowest, highest] or (lowest, highest], and 0 besides
/// where 0 turns the feature off. Never inf or nan.
struct RealRange {
  double lowest = 0;
  double highest = 0;
  bool lowest_excluded = false;
  bool zero_turns_off = false;

  bool contains(double value) const;
  /// "greater than 0 and at most 1", "0 or between 0.001 and 1048576".
  std::string to_string() const;
};

/// A field of Config, reached from the Config (the table's rows are plain data).
template <class T>
struct ConfigField {
  T& (*get)(Config&);
  const T& (*read)(const Config&);
};

// -- the kinds of key --

struct IntegerKey {
  ConfigField<std::int64_t> field;
  IntegerRange range;
};

/// Any uint64 (the seed).
struct UnsignedKey {
  ConfigField<std::uint64_t> field;
};

struct RealKey {
  ConfigField<double> field;
  RealRange range;
};

struct BooleanKey {
  ConfigField<bool> field;
};

/// A boolean that may also be left unset (its default then depends on other keys).
struct OptionalBooleanKey {
  ConfigField<std::optional<bool>> field;
};

struct StringKey {
  ConfigField<std::string> field;
  bool allow_empty = true;
};

/// One of a few names: an enum, written as its to_string().
struct NameKey {
  std::vector<std::string> names;
  /// The enum value of each name, as an int.
  std::vector<int> values;
  /// Sets the field to the enum value `value` (one of `values`).
  void (*set)(Config&, int value);
};

/// One key of the YAML config: its dotted path ("trainer.total_steps") and what it holds.
struct ConfigKey {
  std::string path;
  std::variant<IntegerKey, UnsignedKey, RealKey, BooleanKey, OptionalBooleanKey, StringKey, NameKey>
      value;
};

/// Every key of the YAML config, section by section (DESIGN.md "Config keys", and `model:` of
/// the reference workload): the one table of which keys exist, their types and their ranges.
/// A section is a path prefix of its keys (`storage.s3`).
const std::vector<ConfigKey>& config_keys();

/// The key at `path`, or null when `path` is a section or no key.
const ConfigKey* find_config_key(std::string_view path);

/// Checks each key's value in `config` against its range, and that strings that must not be
/// empty are not. Errors name the key and where config.origins says it was given.
Status check_key_ranges(const Config& config);

/// Checks `value` against the range of the integer key at `path`, as check_key_ranges() does.
/// @pre find_config_key(path) is an IntegerKey
Status check_integer_key(const std::string& path, std::int64_t value, const ConfigOrigins& origins);

}  // namespace stagehand
