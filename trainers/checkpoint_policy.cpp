#include "stagehand/trainers/checkpoint_policy.hpp"

#include <unistd.h>

#include <cerrno>
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
  std::string writable = fs::is_directory(root, ec) ? root : fs::absolute(root, ec).parent_path().string();
  if (::access(writable.c_str(), W_OK) != 0) {
    return Status::from_errno(errno, "trainer.ckpt_path '" + root + "': folder '" + writable + "'");
  }
  return Status::ok();
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
  if (!s.fully_async.empty()) j["fully_async"] = nlohmann::json::parse(s.fully_async);
  return j.dump(1) + "\n";
}

Result<TrainerState> read_trainer_state(const std::string& checkpoint_dir, const ObjectStoreOptions& store) {
  std::string path = checkpoint_dir + "/" + kTrainerStateFile;
  SH_ASSIGN_OR_RETURN(std::string text, read_checkpoint_text(checkpoint_dir, kTrainerStateFile, store));
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) {
    return Status{ErrorCode::corruption, "'" + path + "' is not a trainer state with a step"};
  }
  TrainerState s;
  s.step = j["step"].get<std::int64_t>();
  s.kind = j.value("kind", "");
  s.seed = j.value("seed", std::uint64_t{0});
  s.data_cursor = j.value("data_cursor", std::int64_t{0});
  if (j.contains("fully_async")) s.fully_async = j["fully_async"].dump();
  return s;
}

}  // namespace stagehand
