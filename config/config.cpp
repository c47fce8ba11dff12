#include "config/config.hpp"

#include <yaml-cpp/yaml.h>

#include <charconv>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
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

namespace {

/// Reads one YAML document into a Config, remembering where each key stood.
class ConfigReader {
 public:
  explicit ConfigReader(std::string source) : source_(std::move(source)) {}

  using Field = std::function<Status(const YAML::Node&, const std::string& path)>;
  using Fields = std::map<std::string, Field>;

  Status error_at(const YAML::Mark& mark, const std::string& path, const std::string& what) const {
    std::string where = source_;
    if (!mark.is_null()) where += ":" + std::to_string(mark.line + 1);
    return {ErrorCode::config_error, where + ": " + path + ": " + what};
  }

  Status error_at_key(const std::string& path, const std::string& what) const {
    auto it = marks_.find(path);
    return error_at(it == marks_.end() ? YAML::Mark::null_mark() : it->second, path, what);
  }

  Status read_section(const YAML::Node& node, const std::string& path, const Fields& fields) {
    if (!node || node.IsNull()) return Status::ok();
    if (!node.IsMap()) return error_at(node.Mark(), path, "expected a mapping of keys");
    std::set<std::string> seen;
    for (auto it = node.begin(); it != node.end(); ++it) {
      const YAML::Node& key_node = it->first;
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
      if (ec != std::errc() || end != text.data() + text.size()) {
        return error_at(node.Mark(), path, "expected an integer, got '" + text + "'");
      }
      if (value < min || value > max) {
        std::string range = max == INT64_MAX ? "at least " + std::to_string(min)
                                             : "between " + std::to_string(min) + " and " +
                                                   std::to_string(max);
        return error_at(node.Mark(), path, "must be " + range + ", got " + text);
      }
      *out = value;
      return Status::ok();
    };
  }

  Field real(double* out, double min_exclusive) {
    return [this, out, min_exclusive](const YAML::Node& node, const std::string& path) -> Status {
      SH_ASSIGN_OR_RETURN(std::string text, scalar(node, path, "a number"));
      char* end = nullptr;
      double value = std::strtod(text.c_str(), &end);
      if (text.empty() || end != text.c_str() + text.size()) {
        return error_at(node.Mark(), path, "expected a number, got '" + text + "'");
      }
      if (!(value > min_exclusive)) {
        return error_at(node.Mark(), path, "must be greater than " + std::to_string(min_exclusive) + ", got " + text);
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
      if (ec != std::errc() || end != text.data() + text.size()) {
        return error_at(node.Mark(), path, "expected a non-negative integer, got '" + text + "'");
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

  std::string source_;
  std::map<std::string, YAML::Mark> marks_;
};

Status apply_override(YAML::Node root, const std::string& assignment, const std::string& source) {
  auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) {
    return {ErrorCode::config_error,
            source + ": override '" + assignment + "' must look like key.path=value"};
  }
  std::string path = assignment.substr(0, eq);
  std::vector<std::string> parts;
  std::stringstream ss(path);
  for (std::string part; std::getline(ss, part, '.');) {
    if (part.empty()) {
      return {ErrorCode::config_error, source + ": override '" + assignment + "' has an empty key"};
    }
    parts.push_back(part);
  }
  YAML::Node value;
  try {
    value = YAML::Load(assignment.substr(eq + 1));
  } catch (const YAML::Exception& e) {
    return {ErrorCode::config_error, source + ": override '" + assignment + "': " + e.msg};
  }
  // yaml-cpp nodes are handles; walk with reset() so that assignment never rebinds a parent.
  YAML::Node cursor;
  cursor.reset(root);
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    if (cursor[parts[i]] && !cursor[parts[i]].IsMap() && !cursor[parts[i]].IsNull()) {
      return {ErrorCode::config_error,
              source + ": override '" + assignment + "': '" + parts[i] + "' is not a section"};
    }
    YAML::Node next = cursor[parts[i]];
    cursor.reset(next);
  }
  cursor[parts.back()] = value;
  return Status::ok();
}

Result<Config> read_config(const YAML::Node& root, const std::string& source) {
  Config c;
  ConfigReader r(source);
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
      {"call_timeout_s", r.integer(&c.trainer.call_timeout_s, 1)},
  };
  ConfigReader::Fields megatron{
      {"async_dist_ckpt_save", r.boolean(&c.megatron_config.async_dist_ckpt_save)},
      {"ckpt_save_staging_buckets", r.integer(&c.megatron_config.ckpt_save_staging_buckets, 0)},
      {"ckpt_save_thread_count", r.integer(&c.megatron_config.ckpt_save_thread_count, 1, 256)},
      {"ckpt_writer_low_priority", r.boolean(&c.megatron_config.ckpt_writer_low_priority)},
      {"local_work_dir", r.string(&c.megatron_config.local_work_dir, false)},
      {"ckpt_write_rate_limit_mib_s", r.real(&c.megatron_config.ckpt_write_rate_limit_mib_s, 0.0)},
  };
  ConfigReader::Fields parallel{
      {"tensor_parallel", r.integer(&c.parallel.tensor_parallel, 1, 1024)},
      {"data_parallel", r.integer(&c.parallel.data_parallel, 1, 1024)},
  };
  ConfigReader::Fields fully_async{
      {"max_staleness_steps", r.integer(&c.fully_async.max_staleness_steps, 0)},
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
      {"learning_rate", r.real(&c.model.learning_rate, 0.0)},
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
    return r.error_at_key("megatron_config.ckpt_save_staging_buckets",
                          "must be at most megatron_config.ckpt_save_thread_count (" +
                              std::to_string(m.ckpt_save_thread_count) + "), got " +
                              std::to_string(m.ckpt_save_staging_buckets));
  }
  if (m.async_dist_ckpt_save && m.ckpt_save_staging_buckets > 0) {
    return r.error_at_key(
        "megatron_config.ckpt_save_staging_buckets",
        "must be 0 when async_dist_ckpt_save is true: waved staging writes each wave inside the "
        "training process before staging the next, while an async save must finish staging "
        "before training resumes, so waves would only make the async stall longer");
  }
  if (c.model.hidden % c.parallel.tensor_parallel != 0) {
    return r.error_at_key("model.hidden", "must be divisible by parallel.tensor_parallel (" +
                                              std::to_string(c.parallel.tensor_parallel) + "), got " +
                                              std::to_string(c.model.hidden));
  }
  if (c.model.batch_size % c.parallel.data_parallel != 0) {
    return r.error_at_key("model.batch_size", "must be divisible by parallel.data_parallel (" +
                                                  std::to_string(c.parallel.data_parallel) + "), got " +
                                                  std::to_string(c.model.batch_size));
  }
  if (c.storage.s3.part_size_mib > c.storage.s3.multipart_threshold_mib) {
    return r.error_at_key("storage.s3.part_size_mib", "must be at most storage.s3.multipart_threshold_mib (" +
                                                          std::to_string(c.storage.s3.multipart_threshold_mib) +
                                                          "), got " + std::to_string(c.storage.s3.part_size_mib));
  }
  if (c.trainer.resume_mode == ResumeMode::from_path && c.trainer.resume_path.empty()) {
    return r.error_at_key("trainer.resume_mode", "from_path needs trainer.resume_path");
  }
  return c;
}

}  // namespace

Status validate_config(const Config& config) {
  const auto& m = config.megatron_config;
  if (m.ckpt_save_thread_count < 1) {
    return {ErrorCode::config_error, "megatron_config.ckpt_save_thread_count must be at least 1"};
  }
  if (m.ckpt_save_staging_buckets < 0 || m.ckpt_save_staging_buckets > m.ckpt_save_thread_count) {
    return {ErrorCode::config_error,
            "megatron_config.ckpt_save_staging_buckets must be between 0 and "
            "ckpt_save_thread_count"};
  }
  if (m.async_dist_ckpt_save && m.ckpt_save_staging_buckets > 0) {
    return {ErrorCode::config_error,
            "megatron_config.ckpt_save_staging_buckets must be 0 when async_dist_ckpt_save is "
            "true: an async save must finish staging before training resumes"};
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
  if (!overrides.empty()) {
    if (!root || root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
    if (!root.IsMap()) {
      return Status{ErrorCode::config_error, source + ": expected a mapping of sections"};
    }
    for (const auto& o : overrides) SH_RETURN_IF_ERROR(apply_override(root, o, "--set"));
  }
  return read_config(root, source);
}

Result<Config> load_config_file(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path);
  if (!in) return Status::from_errno(errno, "cannot read config file '" + path + "'");
  std::stringstream buffer;
  buffer << in.rdbuf();
  return load_config_string(buffer.str(), path, overrides);
}

}  // namespace stagehand
