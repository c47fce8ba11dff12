#include "stagehand/trainers/checkpoint_policy.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "stagehand/checkpoint/cloud_checkpoint.hpp"
#include "stagehand/checkpoint/commit.hpp"
#include "stagehand/checkpoint/format.hpp"
#include "stagehand/checkpoint/loader.hpp"
#include "stagehand/storage/destination.hpp"
#include "stagehand/storage/local_files.hpp"

namespace fs = std::filesystem;

namespace stagehand {

bool CheckpointPolicy::should_save(std::int64_t step) const {
  return step == config_.total_steps || (config_.ckpt_interval > 0 && step % config_.ckpt_interval == 0);
}

Result<std::optional<std::string>> CheckpointPolicy::resume_dir() const {
  switch (config_.resume_mode) {
    case ResumeMode::none: return std::optional<std::string>{};
    case ResumeMode::latest: {
      if (is_cloud(config_.ckpt_path)) {
        SH_ASSIGN_OR_RETURN(auto cloud, CloudCheckpoints::open(config_.ckpt_path, store_));
        SH_ASSIGN_OR_RETURN(auto tracker, cloud.read_tracker());
        if (!tracker) return std::optional<std::string>{};
        SH_ASSIGN_OR_RETURN(std::string dir, resolve_checkpoint(config_.ckpt_path, store_));
        return std::optional<std::string>{dir};
      }
      std::error_code ec;
      if (!fs::exists(CheckpointLayout{config_.ckpt_path}.tracker(), ec)) return std::optional<std::string>{};
      SH_ASSIGN_OR_RETURN(std::string dir, resolve_checkpoint(config_.ckpt_path));
      return std::optional<std::string>{dir};
    }
    case ResumeMode::from_path: {
      auto dir = resolve_checkpoint(config_.resume_path, store_);
      if (!dir.is_ok()) return dir.status().with_context("trainer.resume_path");
      return std::optional<std::string>{*dir};
    }
  }
  return Status{ErrorCode::internal, "unknown resume_mode"};
}

Status CheckpointPolicy::check_fresh_start() const {
  if (config_.overwrite_checkpoints) return Status::ok();
  const std::string& root = config_.ckpt_path;
  std::vector<std::int64_t> steps;
  if (is_cloud(root)) {
    SH_ASSIGN_OR_RETURN(auto cloud, CloudCheckpoints::open(root, store_));
    SH_ASSIGN_OR_RETURN(steps, cloud.committed_steps());
  } else {
    steps = committed_steps(root);
  }
  if (steps.empty()) return Status::ok();
  SH_ASSIGN_OR_RETURN(auto tracked, tracked_step());
  const CheckpointLayout layout{root};
  auto folder = [](std::int64_t step) { return "global_step_" + std::to_string(step); };
  std::string held = folder(steps.front());
  if (steps.size() == 2) held += ", " + folder(steps.back());
  if (steps.size() > 2) held += " ... " + folder(steps.back()) + ", " + std::to_string(steps.size()) + " in all";
  const std::string exists = "trainer.ckpt_path '" + root + "' holds committed checkpoints (" + held + ")";
  const std::string overwrite = "or set trainer.overwrite_checkpoints: true to start over in this folder anyway";
  const std::string from_path = "resume one with trainer.resume_mode: from_path and trainer.resume_path: '" +
                                layout.step_dir(steps.back()) + "', ";
  if (config_.resume_mode == ResumeMode::none) {
    return {ErrorCode::already_exists,
            exists + " and trainer.resume_mode is none: a run from step 1 would replace them. " +
                (tracked ? "Set trainer.resume_mode: latest to continue from step " + std::to_string(*tracked) + ", "
                         : from_path) +
                overwrite};
  }
  return {ErrorCode::already_exists, exists + ", but its tracker '" + layout.tracker() +
                                         "' is missing: trainer.resume_mode latest would start from step 1 "
                                         "and replace them. Restore the tracker, " +
                                         from_path + overwrite};
}

Result<std::optional<std::int64_t>> CheckpointPolicy::tracked_step() const {
  if (is_cloud(config_.ckpt_path)) {
    SH_ASSIGN_OR_RETURN(auto cloud, CloudCheckpoints::open(config_.ckpt_path, store_));
    return cloud.read_tracker();
  }
  return read_tracker(config_.ckpt_path);
}

Result<std::vector<std::int64_t>> CheckpointPolicy::apply_retention() const {
  std::vector<std::int64_t> deleted;
  if (config_.max_ckpts_to_keep <= 0) return deleted;
  if (is_cloud(config_.ckpt_path)) return apply_cloud_retention();
  SH_ASSIGN_OR_RETURN(auto newest, read_tracker(config_.ckpt_path));
  auto steps = committed_steps(config_.ckpt_path);
  auto keep = static_cast<std::size_t>(config_.max_ckpts_to_keep);
  for (std::size_t i = 0; i + keep < steps.size(); ++i) {
    if (newest && steps[i] == *newest) continue;
    std::string dir = CheckpointLayout{config_.ckpt_path}.step_dir(steps[i]);
    // Renamed first so that a crash mid-delete leaves a .tmp folder, which loaders ignore.
    std::string doomed = CheckpointLayout{config_.ckpt_path}.tmp_dir(steps[i]);
    std::error_code ec;
    fs::rename(dir, doomed, ec);
    if (ec) return Status::from_errno(ec.value(), "retention: cannot retire '" + dir + "'");
    fs::remove_all(doomed, ec);
    if (ec) return Status::from_errno(ec.value(), "retention: cannot remove '" + doomed + "'");
    deleted.push_back(steps[i]);
  }
  return deleted;
}

Result<std::vector<std::int64_t>> CheckpointPolicy::apply_cloud_retention() const {
  std::vector<std::int64_t> deleted;
  SH_ASSIGN_OR_RETURN(auto cloud, CloudCheckpoints::open(config_.ckpt_path, store_));
  SH_ASSIGN_OR_RETURN(auto newest, cloud.read_tracker());
  SH_ASSIGN_OR_RETURN(auto steps, cloud.committed_steps());
  auto keep = static_cast<std::size_t>(config_.max_ckpts_to_keep);
  for (std::size_t i = 0; i + keep < steps.size(); ++i) {
    if (newest && steps[i] == *newest) continue;
    SH_RETURN_IF_ERROR(cloud.remove_step(steps[i]).with_context("retention"));
    deleted.push_back(steps[i]);
  }
  return deleted;
}

Status CheckpointPolicy::check_destination() const {
  const std::string& root = config_.ckpt_path;
  if (is_cloud(root)) {
    SH_ASSIGN_OR_RETURN(auto cloud, CloudCheckpoints::open(root, store_));
    return cloud.check_access().with_context("trainer.ckpt_path '" + root + "'");
  }
  SH_RETURN_IF_ERROR(check_checkpoint_root(root).with_context("trainer"));
  std::error_code ec;
  std::string writable = fs::is_directory(root, ec) ? root : checkpoint_root_parent(root);
  if (::access(writable.c_str(), W_OK) != 0) {
    return Status::from_errno(errno, "trainer.ckpt_path '" + root + "': folder '" + writable + "'");
  }
  return Status::ok();
}

Result<std::optional<CheckpointRootLock>> CheckpointPolicy::lock_destination() const {
  if (is_cloud(config_.ckpt_path)) return std::optional<CheckpointRootLock>{};
  auto lock = CheckpointRootLock::acquire(config_.ckpt_path);
  if (!lock.is_ok()) return lock.status().with_context("trainer");
  return std::optional<CheckpointRootLock>{std::move(*lock)};
}

Status CheckpointPolicy::clean_interrupted_saves() const {
  std::error_code ec;
  if (is_cloud(config_.ckpt_path)) {
    SH_ASSIGN_OR_RETURN(auto cloud, CloudCheckpoints::open(config_.ckpt_path, store_));
    return cloud.clean_interrupted().status().with_context("cleaning '" + config_.ckpt_path + "'");
  }
  if (!fs::is_directory(config_.ckpt_path, ec)) return Status::ok();
  return clean_stale_tmp_dirs(config_.ckpt_path).status();
}

std::string trainer_state_to_json(const TrainerState& s) {
  nlohmann::json j{{"step", s.step}, {"kind", s.kind}, {"seed", s.seed}, {"data_cursor", s.data_cursor}};
  if (s.fully_async) {
    nlohmann::json batches = nlohmann::json::array();
    for (const auto& b : s.fully_async->pending_batches) {
      batches.push_back({{"step", b.step}, {"version", b.version}, {"actions", b.actions}});
    }
    j["fully_async"] = {{"max_staleness_steps", s.fully_async->max_staleness_steps},
                        {"num_generators", s.fully_async->num_generators},
                        {"next_generation_step", s.fully_async->next_generation_step},
                        {"max_staleness_seen", s.fully_async->max_staleness_seen},
                        {"pending_batches", std::move(batches)}};
  }
  return j.dump(1) + "\n";
}

namespace {

/// One JSON object of a trainer_state.json: reads its fields by type, and says which field of
/// which file is wrong instead of letting nlohmann::json throw.
class StateObject {
 public:
  StateObject(const nlohmann::json& j, const std::string& file, std::string path)
      : j_(j), file_(file), path_(std::move(path)) {}

  /// Reads `key` into `out`; a missing key leaves `out` as it is unless `required`.
  Status integer(const char* key, std::int64_t& out, bool required = false) const {
    const nlohmann::json* v = find(key);
    if (v == nullptr) return required ? missing(key) : Status::ok();
    if (!v->is_number_integer() || (v->is_number_unsigned() && v->get<std::uint64_t>() > kMaxInt64)) {
      return wrong(key, *v, "an integer");
    }
    out = v->get<std::int64_t>();
    return Status::ok();
  }

  Status unsigned_integer(const char* key, std::uint64_t& out) const {
    const nlohmann::json* v = find(key);
    if (v == nullptr) return Status::ok();
    if (!v->is_number_unsigned()) return wrong(key, *v, "a non-negative integer");
    out = v->get<std::uint64_t>();
    return Status::ok();
  }

  Status string(const char* key, std::string& out) const {
    const nlohmann::json* v = find(key);
    if (v == nullptr) return Status::ok();
    if (!v->is_string()) return wrong(key, *v, "a string");
    out = v->get<std::string>();
    return Status::ok();
  }

  Status int32_array(const char* key, std::vector<std::int32_t>& out) const {
    const nlohmann::json* v = find(key);
    if (v == nullptr) return missing(key);
    if (!v->is_array()) return wrong(key, *v, "an array of integers");
    out.clear();
    for (const auto& e : *v) {
      const bool fits = e.is_number_unsigned() ? e.get<std::uint64_t>() <= INT32_MAX
                                               : e.is_number_integer() && e.get<std::int64_t>() >= INT32_MIN &&
                                                     e.get<std::int64_t>() <= INT32_MAX;
      if (!fits) return error(key, "holds " + e.dump() + ", not a 32-bit integer");
      out.push_back(e.get<std::int32_t>());
    }
    return Status::ok();
  }

  /// The object or array at `key`; null when missing and not `required`.
  Result<const nlohmann::json*> nested(const char* key, nlohmann::json::value_t type, bool required) const {
    const nlohmann::json* v = find(key);
    if (v == nullptr && required) return missing(key);
    if (v != nullptr && v->type() != type) {
      return wrong(key, *v, type == nlohmann::json::value_t::array ? "an array" : "an object");
    }
    return v;
  }

  std::string field(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

  Status error(const std::string& key, const std::string& why) const {
    return {ErrorCode::corruption, "'" + file_ + "': field '" + field(key) + "' " + why};
  }

 private:
  static constexpr std::uint64_t kMaxInt64 = static_cast<std::uint64_t>(INT64_MAX);

  const nlohmann::json* find(const char* key) const {
    auto it = j_.find(key);
    return it == j_.end() ? nullptr : &*it;
  }
  Status missing(const std::string& key) const { return error(key, "is missing"); }
  Status wrong(const std::string& key, const nlohmann::json& v, const std::string& expected) const {
    return error(key, "is " + std::string(v.type_name()) + " " + v.dump() + ", not " + expected);
  }

  const nlohmann::json& j_;
  const std::string& file_;
  std::string path_;
};

Result<FullyAsyncState> read_fully_async_state(const nlohmann::json& j, const std::string& file) {
  const StateObject part(j, file, "fully_async");
  FullyAsyncState s;
  SH_RETURN_IF_ERROR(part.integer("max_staleness_steps", s.max_staleness_steps));
  SH_RETURN_IF_ERROR(part.integer("num_generators", s.num_generators));
  SH_RETURN_IF_ERROR(part.integer("next_generation_step", s.next_generation_step));
  SH_RETURN_IF_ERROR(part.integer("max_staleness_seen", s.max_staleness_seen));
  SH_ASSIGN_OR_RETURN(const nlohmann::json* batches,
                      part.nested("pending_batches", nlohmann::json::value_t::array, true));
  for (std::size_t i = 0; i < batches->size(); ++i) {
    const std::string key = "pending_batches[" + std::to_string(i) + "]";
    const nlohmann::json& b = (*batches)[i];
    if (!b.is_object()) return part.error(key, "is " + std::string(b.type_name()) + ", not an object");
    const StateObject batch(b, file, part.field(key));
    PendingBatch p;
    SH_RETURN_IF_ERROR(batch.integer("step", p.step, true));
    SH_RETURN_IF_ERROR(batch.integer("version", p.version, true));
    SH_RETURN_IF_ERROR(batch.int32_array("actions", p.actions));
    s.pending_batches.push_back(std::move(p));
  }
  return s;
}

}  // namespace

Result<TrainerState> read_trainer_state(const std::string& checkpoint_dir, const ObjectStoreOptions& store) {
  std::string path = checkpoint_dir + "/" + kTrainerStateFile;
  SH_ASSIGN_OR_RETURN(std::string text, read_checkpoint_text(checkpoint_dir, kTrainerStateFile, store));
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Status{ErrorCode::corruption, "'" + path + "' is not a JSON object"};
  const StateObject top(j, path, "");
  TrainerState s;
  SH_RETURN_IF_ERROR(top.integer("step", s.step, true));
  SH_RETURN_IF_ERROR(top.string("kind", s.kind));
  SH_RETURN_IF_ERROR(top.unsigned_integer("seed", s.seed));
  SH_RETURN_IF_ERROR(top.integer("data_cursor", s.data_cursor));
  SH_ASSIGN_OR_RETURN(const nlohmann::json* fully_async,
                      top.nested("fully_async", nlohmann::json::value_t::object, false));
  if (fully_async != nullptr) {
    SH_ASSIGN_OR_RETURN(s.fully_async, read_fully_async_state(*fully_async, path));
  }
  return s;
}

}  // namespace stagehand
