#include "stagehand/config/config.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <charconv>
#include <climits>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>

namespace stagehand {

const char* to_string(TrainerKind kind) {
  switch (kind) {
    case TrainerKind::sync: return "sync";
    case TrainerKind::fully_async: return "fully_async";
    case TrainerKind::sft: return "sft";
  }
  return "?";
}

const char* to_string(ResumeMode mode) {
  switch (mode) {
    case ResumeMode::none: return "none";
    case ResumeMode::latest: return "latest";
    case ResumeMode::from_path: return "from_path";
  }
  return "?";
}

const char* to_string(StagingMemory memory) {
  switch (memory) {
    case StagingMemory::persistent: return "persistent";
    case StagingMemory::per_save: return "per_save";
  }
  return "?";
}

namespace {

// Each limit below is what the program can run with; the error that refuses a value names it.

/// Every wait's deadline is now() plus the timeout in steady_clock nanoseconds, which overflow
/// past about 9.2e9 s; 1e6 s (11.5 days) is beyond any call that still makes progress.
constexpr std::int64_t kMaxCallTimeoutS = 1'000'000;
/// Matrix products take int sizes and leading dimensions (OpenBLAS, cuBLAS), so no matrix of the
/// model, its activations or its sampled actions may hold more elements than an int counts; the
/// bound also keeps each one below 8 GiB of floats.
constexpr std::int64_t kMaxMatrixElements = INT_MAX;
/// Each rank is a Worker with its own writer threads, and in-process ranks share one process.
constexpr std::int64_t kMaxWorldSize = 1024;
/// The fully-async trainer keeps this many batches generated ahead and stores them in each
/// checkpoint.
constexpr std::int64_t kMaxStalenessSteps = 1024;
/// BanditTask::kEvalContextBase (models/, a layer above): training step s uses the contexts
/// [s * batch_size, (s + 1) * batch_size), which must end before the evaluation contexts begin.
constexpr std::int64_t kEvalContextBase = std::int64_t{1} << 40;
/// Adam moves each weight by about learning_rate per step, and the weights start below 1.
constexpr double kMaxLearningRate = 1.0;
/// The rate limiter schedules each write bytes / rate later on the steady_clock (int64
/// nanoseconds): near 0 one write overflows it, while at 1 KiB/s that takes 292 years of writes.
/// 1 TiB/s is beyond any storage.
constexpr double kMinWriteRateMiBs = 0.001;
constexpr double kMaxWriteRateMiBs = 1 << 20;
/// Config files are a few hundred bytes; the bound stops `--config /dev/zero` from filling memory.
constexpr std::size_t kMaxConfigBytes = 1 << 20;

/// The shortest text that reads back as `value` ("1", "0.005", "1048576").
std::string number_text(double value) {
  char buffer[32];  // the longest double, -2.2250738585072014e-308, takes 24
  return std::string(buffer, std::to_chars(buffer, buffer + sizeof buffer, value).ptr);
}

/// The values a real-valued key accepts: [lowest, highest] or (lowest, highest], and 0 besides
/// where 0 turns the feature off.
struct RealRange {
  double lowest = 0;
  double highest = 0;
  bool lowest_excluded = false;
  bool zero_turns_off = false;

  bool contains(double value) const {
    if (zero_turns_off && value == 0) return true;
    return (lowest_excluded ? value > lowest : value >= lowest) && value <= highest;
  }

  std::string to_string() const {
    std::string range =
        lowest_excluded
            ? "greater than " + number_text(lowest) + " and at most " + number_text(highest)
            : "between " + number_text(lowest) + " and " + number_text(highest);
    return zero_turns_off ? "0 or " + range : range;
  }
};

/// The override (`--set` assignment) that set each key path, by key path.
using Overrides = std::map<std::string, std::string>;

/// Reads one YAML document into a Config, remembering where each key stood: a line of `source`,
/// or the override that set it.
class ConfigReader {
 public:
  ConfigReader(std::string source, Overrides overrides)
      : source_(std::move(source)), overrides_(std::move(overrides)) {}

  using Field = std::function<Status(const YAML::Node&, const std::string& path)>;
  using Fields = std::map<std::string, Field>;

  Status error_at(const YAML::Mark& mark, const std::string& path, const std::string& what) const {
    return {ErrorCode::config_error,
            given_at(path, mark).value_or(source_) + ": " + path + ": " + what};
  }

  /// An error about `keys.front()` in a rule that spans `keys`, placed where the first of them
  /// that was given at all was given (a default has no place).
  Status error_at_keys(const std::vector<std::string>& keys, const std::string& what) const {
    for (const auto& key : keys) {
      auto mark = marks_.find(key);
      auto where = given_at(key, mark == marks_.end() ? YAML::Mark::null_mark() : mark->second);
      if (where) return {ErrorCode::config_error, *where + ": " + keys.front() + ": " + what};
    }
    return {ErrorCode::config_error, source_ + ": " + keys.front() + ": " + what};
  }

  Status read_section(const YAML::Node& node, const std::string& path, const Fields& fields) {
    if (!node || node.IsNull()) return Status::ok();
    if (!node.IsMap()) return error_at(node.Mark(), path, "expected a mapping of keys");
    std::set<std::string> seen;
    for (auto it = node.begin(); it != node.end(); ++it) {
      // By value: `it->first` belongs to a proxy that dies with this statement.
      YAML::Node key_node = it->first;
      if (!key_node.IsScalar()) return error_at(key_node.Mark(), path, "keys must be plain names");
      std::string key = key_node.Scalar();
      std::string key_path = path.empty() ? key : path + "." + key;
      if (!seen.insert(key).second) return error_at(key_node.Mark(), key_path, "key appears twice");
      auto field = fields.find(key);
      if (field == fields.end()) {
        std::string known;
        for (const auto& [name, unused] : fields) known += (known.empty() ? "" : ", ") + name;
        return error_at(key_node.Mark(), key_path, "unknown key (known here: " + known + ")");
      }
      marks_[key_path] = key_node.Mark();
      SH_RETURN_IF_ERROR(field->second(it->second, key_path));
    }
    return Status::ok();
  }

  Field integer(std::int64_t* out, std::int64_t min, std::int64_t max = INT64_MAX) {
    return [this, out, min, max](const YAML::Node& node, const std::string& path) -> Status {
      SH_ASSIGN_OR_RETURN(std::string text, scalar(node, path, "an integer"));
      std::int64_t value = 0;
      auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
      if (ec == std::errc::invalid_argument || end != text.data() + text.size()) {
        return error_at(node.Mark(), path, "expected an integer, got '" + text + "'");
      }
      // Beyond int64 (ec) is out of range too, and its message gives both ends.
      if (ec != std::errc() || value < min || value > max) {
        std::string range = max == INT64_MAX && ec == std::errc()
                                ? "at least " + std::to_string(min)
                                : "between " + std::to_string(min) + " and " + std::to_string(max);
        return error_at(node.Mark(), path, "must be " + range + ", got " + text);
      }
      *out = value;
      return Status::ok();
    };
  }

  Field real(double* out, RealRange range) {
    return [this, out, range](const YAML::Node& node, const std::string& path) -> Status {
      SH_ASSIGN_OR_RETURN(std::string text, scalar(node, path, "a number"));
      double value = 0;
      auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
      if (ec == std::errc::invalid_argument || end != text.data() + text.size()) {
        return error_at(node.Mark(), path, "expected a number, got '" + text + "'");
      }
      // Out of range (1e999) and inf or nan never reach a use that could hold them.
      if (ec != std::errc() || !std::isfinite(value) || !range.contains(value)) {
        return error_at(node.Mark(), path,
                        "must be a finite number, " + range.to_string() + ", got '" + text + "'");
      }
      *out = value;
      return Status::ok();
    };
  }

  Field unsigned_integer(std::uint64_t* out) {
    return [this, out](const YAML::Node& node, const std::string& path) -> Status {
      SH_ASSIGN_OR_RETURN(std::string text, scalar(node, path, "a non-negative integer"));
      std::uint64_t value = 0;
      auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
      if (ec == std::errc::invalid_argument || end != text.data() + text.size()) {
        return error_at(node.Mark(), path, "expected a non-negative integer, got '" + text + "'");
      }
      if (ec != std::errc()) {
        return error_at(node.Mark(), path,
                        "must be at most " + std::to_string(UINT64_MAX) + ", got " + text);
      }
      *out = value;
      return Status::ok();
    };
  }

  Field boolean(bool* out) {
    return [this, out](const YAML::Node& node, const std::string& path) -> Status {
      SH_ASSIGN_OR_RETURN(std::string text, scalar(node, path, "true or false"));
      static const std::set<std::string> kTrue{"true", "True", "TRUE"};
      static const std::set<std::string> kFalse{"false", "False", "FALSE"};
      if (kTrue.count(text) != 0) {
        *out = true;
      } else if (kFalse.count(text) != 0) {
        *out = false;
      } else {
        return error_at(node.Mark(), path, "expected true or false, got '" + text + "'");
      }
      return Status::ok();
    };
  }

  /// A boolean that may also be left unset (its default then depends on other keys).
  Field optional_boolean(std::optional<bool>* out) {
    return [this, out](const YAML::Node& node, const std::string& path) -> Status {
      bool value = false;
      SH_RETURN_IF_ERROR(boolean(&value)(node, path));
      *out = value;
      return Status::ok();
    };
  }

  Field string(std::string* out, bool allow_empty) {
    return [this, out, allow_empty](const YAML::Node& node, const std::string& path) -> Status {
      SH_ASSIGN_OR_RETURN(std::string text, scalar(node, path, "a string"));
      if (!allow_empty && text.empty()) return error_at(node.Mark(), path, "must not be empty");
      *out = text;
      return Status::ok();
    };
  }

  template <class E>
  Field enumeration(E* out, std::vector<E> values) {
    return [this, out, values](const YAML::Node& node, const std::string& path) -> Status {
      SH_ASSIGN_OR_RETURN(std::string text, scalar(node, path, "a name"));
      std::string names;
      for (E v : values) {
        if (text == to_string(v)) {
          *out = v;
          return Status::ok();
        }
        names += (names.empty() ? "" : " | ") + std::string(to_string(v));
      }
      return error_at(node.Mark(), path, "expected one of " + names + ", got '" + text + "'");
    };
  }

 private:
  Result<std::string> scalar(const YAML::Node& node, const std::string& path,
                             const std::string& expected) const {
    if (!node.IsScalar()) {
      const char* got = node.IsMap() ? "a mapping" : node.IsSequence() ? "a list" : "nothing";
      return error_at(node.Mark(), path, "expected " + expected + ", got " + got);
    }
    return node.Scalar();
  }

  /// Where the value at `path` was given: the override that set it, else its line in the source,
  /// else the override that created it as a section on the way to its own key (`trainr` in
  /// `--set trainr.seed=1`); nothing for a default.
  std::optional<std::string> given_at(const std::string& path, const YAML::Mark& mark) const {
    if (auto it = overrides_.find(path); it != overrides_.end()) return "--set " + it->second;
    if (!mark.is_null()) {
      std::string where = source_;
      where += ':';
      where += std::to_string(mark.line + 1);
      return where;
    }
    const std::string inside = path + ".";
    auto below = overrides_.lower_bound(inside);
    if (below != overrides_.end() && below->first.starts_with(inside)) {
      return "--set " + below->second;
    }
    return std::nullopt;
  }

  std::string source_;
  Overrides overrides_;
  std::map<std::string, YAML::Mark> marks_;
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

Result<Config> read_config(const YAML::Node& root, const std::string& source, Overrides overrides) {
  Config c;
  ConfigReader r(source, std::move(overrides));
  if (root && !root.IsNull() && !root.IsMap()) {
    return r.error_at(root.Mark(), "<top level>", "expected a mapping of sections");
  }
  auto section = [&r](auto fields) {
    return [&r, fields](const YAML::Node& node, const std::string& path) {
      return r.read_section(node, path, fields);
    };
  };
  ConfigReader::Fields trainer{
      {"kind", r.enumeration(&c.trainer.kind, {TrainerKind::sync, TrainerKind::fully_async,
                                               TrainerKind::sft})},
      {"total_steps", r.integer(&c.trainer.total_steps, 1)},
      {"ckpt_path", r.string(&c.trainer.ckpt_path, false)},
      {"ckpt_interval", r.integer(&c.trainer.ckpt_interval, 0)},
      {"max_ckpts_to_keep", r.integer(&c.trainer.max_ckpts_to_keep, 0)},
      {"resume_mode", r.enumeration(&c.trainer.resume_mode, {ResumeMode::none, ResumeMode::latest,
                                                             ResumeMode::from_path})},
      {"resume_path", r.string(&c.trainer.resume_path, true)},
      {"seed", r.unsigned_integer(&c.trainer.seed)},
      {"call_timeout_s", r.integer(&c.trainer.call_timeout_s, 1, kMaxCallTimeoutS)},
      {"overwrite_checkpoints", r.boolean(&c.trainer.overwrite_checkpoints)},
      {"init_from", r.string(&c.trainer.init_from, true)},
      {"load_optimizer", r.optional_boolean(&c.trainer.load_optimizer)},
      {"load_rng", r.optional_boolean(&c.trainer.load_rng)},
      {"load_strict", r.boolean(&c.trainer.load_strict)},
      {"export_interval", r.integer(&c.trainer.export_interval, 0)},
      {"export_path", r.string(&c.trainer.export_path, true)},
  };
  ConfigReader::Fields megatron{
      {"async_dist_ckpt_save", r.boolean(&c.megatron_config.async_dist_ckpt_save)},
      {"ckpt_save_staging_buckets", r.integer(&c.megatron_config.ckpt_save_staging_buckets, 0)},
      {"ckpt_staging_memory",
       r.enumeration(&c.megatron_config.ckpt_staging_memory, {StagingMemory::persistent, StagingMemory::per_save})},
      {"ckpt_save_thread_count", r.integer(&c.megatron_config.ckpt_save_thread_count, 1, 256)},
      {"ckpt_load_thread_count", r.integer(&c.megatron_config.ckpt_load_thread_count, 1, 256)},
      {"ckpt_writer_low_priority", r.boolean(&c.megatron_config.ckpt_writer_low_priority)},
      {"local_work_dir", r.string(&c.megatron_config.local_work_dir, false)},
      {"ckpt_write_rate_limit_mib_s",
       r.real(&c.megatron_config.ckpt_write_rate_limit_mib_s,
              {.lowest = kMinWriteRateMiBs, .highest = kMaxWriteRateMiBs, .zero_turns_off = true})},
  };
  ConfigReader::Fields parallel{
      {"tensor_parallel", r.integer(&c.parallel.tensor_parallel, 1, 1024)},
      {"data_parallel", r.integer(&c.parallel.data_parallel, 1, 1024)},
  };
  ConfigReader::Fields fully_async{
      {"max_staleness_steps", r.integer(&c.fully_async.max_staleness_steps, 0, kMaxStalenessSteps)},
      {"num_generators", r.integer(&c.fully_async.num_generators, 1, 1024)},
  };
  ConfigReader::Fields s3{
      {"endpoint", r.string(&c.storage.s3.endpoint, true)},
      {"region", r.string(&c.storage.s3.region, true)},
      {"path_style", r.boolean(&c.storage.s3.path_style)},
      {"multipart_threshold_mib", r.integer(&c.storage.s3.multipart_threshold_mib, 5, 1 << 20)},
      {"part_size_mib", r.integer(&c.storage.s3.part_size_mib, 5, 5 << 10)},
      {"upload_threads", r.integer(&c.storage.s3.upload_threads, 1, 256)},
      {"max_attempts", r.integer(&c.storage.s3.max_attempts, 1, 100)},
  };
  ConfigReader::Fields storage{{"s3", section(s3)}};
  ConfigReader::Fields model{
      {"context_dim", r.integer(&c.model.context_dim, 1, 1 << 20)},
      {"num_arms", r.integer(&c.model.num_arms, 2, 1 << 20)},
      {"hidden", r.integer(&c.model.hidden, 1, 1 << 24)},
      {"batch_size", r.integer(&c.model.batch_size, 1, 1 << 24)},
      {"group_size", r.integer(&c.model.group_size, 1, 1 << 16)},
      {"learning_rate",
       r.real(&c.model.learning_rate, {.highest = kMaxLearningRate, .lowest_excluded = true})},
      {"eval_contexts", r.integer(&c.model.eval_contexts, 1, 1 << 24)},
  };
  ConfigReader::Fields top{
      {"trainer", section(trainer)},           {"megatron_config", section(megatron)},
      {"parallel", section(parallel)},         {"fully_async", section(fully_async)},
      {"storage", section(storage)},           {"model", section(model)},
  };
  SH_RETURN_IF_ERROR(r.read_section(root, "", top));

  const auto& m = c.megatron_config;
  if (m.ckpt_save_staging_buckets > m.ckpt_save_thread_count) {
    return r.error_at_keys(
        {"megatron_config.ckpt_save_staging_buckets", "megatron_config.ckpt_save_thread_count"},
        "must be at most megatron_config.ckpt_save_thread_count (" +
            std::to_string(m.ckpt_save_thread_count) + "), got " +
            std::to_string(m.ckpt_save_staging_buckets));
  }
  const std::int64_t world_size = c.parallel.tensor_parallel * c.parallel.data_parallel;
  if (world_size > kMaxWorldSize) {
    return r.error_at_keys(
        {"parallel.data_parallel", "parallel.tensor_parallel"},
        "parallel.tensor_parallel x parallel.data_parallel (the world size) must be at most " +
            std::to_string(kMaxWorldSize) + ", got " + std::to_string(world_size));
  }
  if (c.model.hidden % c.parallel.tensor_parallel != 0) {
    return r.error_at_keys({"model.hidden", "parallel.tensor_parallel"},
                           "must be divisible by parallel.tensor_parallel (" +
                               std::to_string(c.parallel.tensor_parallel) + "), got " +
                               std::to_string(c.model.hidden));
  }
  if (c.model.batch_size % c.parallel.data_parallel != 0) {
    return r.error_at_keys({"model.batch_size", "parallel.data_parallel"},
                           "must be divisible by parallel.data_parallel (" +
                               std::to_string(c.parallel.data_parallel) + "), got " +
                               std::to_string(c.model.batch_size));
  }
  if (c.storage.s3.part_size_mib > c.storage.s3.multipart_threshold_mib) {
    return r.error_at_keys({"storage.s3.part_size_mib", "storage.s3.multipart_threshold_mib"},
                           "must be at most storage.s3.multipart_threshold_mib (" +
                               std::to_string(c.storage.s3.multipart_threshold_mib) + "), got " +
                               std::to_string(c.storage.s3.part_size_mib));
  }
  if (c.trainer.resume_mode == ResumeMode::from_path && c.trainer.resume_path.empty()) {
    return r.error_at_keys({"trainer.resume_mode", "trainer.resume_path"},
                           "from_path needs trainer.resume_path");
  }
  if (c.trainer.export_interval > 0 &&
      (c.trainer.ckpt_interval == 0 || c.trainer.export_interval % c.trainer.ckpt_interval != 0)) {
    return r.error_at_keys({"trainer.export_interval", "trainer.ckpt_interval"},
                           "must be a multiple of trainer.ckpt_interval (" + std::to_string(c.trainer.ckpt_interval) +
                               "): only committed checkpoints are exported, got " +
                               std::to_string(c.trainer.export_interval));
  }
  if (c.trainer.export_interval > 0 && c.trainer.export_path.empty()) {
    return r.error_at_keys({"trainer.export_interval", "trainer.export_path"},
                           "trainer.export_interval needs trainer.export_path, the folder to export into");
  }
  for (const char* scheme : {"s3://", "gs://"}) {
    if (c.trainer.export_path.rfind(scheme, 0) == 0) {
      return r.error_at_keys({"trainer.export_path"}, "must be a local folder, got '" + c.trainer.export_path + "'");
    }
  }

  // Each key is at most 2^24, so no product below overflows. The first key is the one blamed.
  struct Matrix {
    const char* name;
    const char* first_key;
    std::int64_t first;
    const char* second_key;
    std::int64_t second;
  };
  const ModelConfig& mlp = c.model;
  const Matrix matrices[] = {
      {"model.fc1.weight", "model.hidden", mlp.hidden, "model.context_dim", mlp.context_dim},
      {"model.fc2.weight", "model.hidden", mlp.hidden, "model.num_arms", mlp.num_arms},
      {"the bandit's rule", "model.num_arms", mlp.num_arms, "model.context_dim", mlp.context_dim},
      {"a step's contexts", "model.batch_size", mlp.batch_size, "model.context_dim",
       mlp.context_dim},
      {"a step's activations", "model.batch_size", mlp.batch_size, "model.hidden", mlp.hidden},
      {"a step's logits", "model.batch_size", mlp.batch_size, "model.num_arms", mlp.num_arms},
      {"a step's sampled actions", "model.batch_size", mlp.batch_size, "model.group_size",
       mlp.group_size},
      {"the evaluation's contexts", "model.eval_contexts", mlp.eval_contexts, "model.context_dim",
       mlp.context_dim},
      {"the evaluation's activations", "model.eval_contexts", mlp.eval_contexts, "model.hidden",
       mlp.hidden},
      {"the evaluation's logits", "model.eval_contexts", mlp.eval_contexts, "model.num_arms",
       mlp.num_arms},
  };
  for (const Matrix& x : matrices) {
    const std::int64_t elements = x.first * x.second;
    if (elements > kMaxMatrixElements) {
      return r.error_at_keys({x.first_key, x.second_key},
                             std::string(x.first_key) + " x " + x.second_key + " = " +
                                 std::to_string(x.first) + " x " + std::to_string(x.second) +
                                 " = " + std::to_string(elements) + " elements in " + x.name +
                                 ", more than the " + std::to_string(kMaxMatrixElements) +
                                 " (2^31 - 1) that one matrix may hold");
    }
  }

  // A fully-async checkpoint also holds the batches generated ahead, up to
  // max_staleness_steps past the step it saves.
  const bool generates_ahead = c.trainer.kind == TrainerKind::fully_async;
  const std::int64_t ahead = generates_ahead ? c.fully_async.max_staleness_steps : 0;
  const std::int64_t max_steps = kEvalContextBase / mlp.batch_size - 1 - ahead;
  if (c.trainer.total_steps > max_steps) {
    std::vector<std::string> keys{"trainer.total_steps", "model.batch_size"};
    std::string given = "model.batch_size " + std::to_string(mlp.batch_size);
    if (generates_ahead) {
      keys.emplace_back("fully_async.max_staleness_steps");
      given += " and fully_async.max_staleness_steps " + std::to_string(ahead);
    }
    return r.error_at_keys(
        keys, "must be at most " + std::to_string(max_steps) + " with " + given +
                  ": the contexts a run trains on must end before the evaluation contexts, "
                  "which begin at context " +
                  std::to_string(kEvalContextBase) + " (2^40); got " +
                  std::to_string(c.trainer.total_steps));
  }
  return c;
}

}  // namespace

Status validate_config(const Config& config) {
  const auto& m = config.megatron_config;
  if (m.ckpt_save_thread_count < 1) {
    return {ErrorCode::config_error, "megatron_config.ckpt_save_thread_count must be at least 1"};
  }
  if (m.ckpt_load_thread_count < 1 || m.ckpt_load_thread_count > 256) {
    return {ErrorCode::config_error, "megatron_config.ckpt_load_thread_count must be between 1 and 256"};
  }
  if (m.ckpt_save_staging_buckets < 0 || m.ckpt_save_staging_buckets > m.ckpt_save_thread_count) {
    return {ErrorCode::config_error,
            "megatron_config.ckpt_save_staging_buckets must be between 0 and "
            "ckpt_save_thread_count"};
  }
  return Status::ok();
}

Result<Config> load_config_string(const std::string& text, const std::string& source,
                                  const std::vector<std::string>& overrides) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return Status{ErrorCode::config_error,
                  source + ":" + std::to_string(e.mark.line + 1) + ": invalid YAML: " + e.msg};
  }
  Overrides set_by;
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

Result<Config> load_config_file(const std::string& path, const std::vector<std::string>& overrides) {
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
