#include "stagehand/trainers/checkpoint_policy.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <filesystem>

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

Result<std::vector<std::int64_t>> CheckpointPolicy::apply_retention(const std::set<std::int64_t>& in_use) const {
  std::vector<std::int64_t> deleted;
  if (config_.max_ckpts_to_keep <= 0) return deleted;
  if (is_cloud(config_.ckpt_path)) return apply_cloud_retention(in_use);
  SH_ASSIGN_OR_RETURN(auto newest, read_tracker(config_.ckpt_path));
  auto steps = committed_steps(config_.ckpt_path);
  auto keep = static_cast<std::size_t>(config_.max_ckpts_to_keep);
  for (std::size_t i = 0; i + keep < steps.size(); ++i) {
    if ((newest && steps[i] == *newest) || in_use.count(steps[i]) != 0) continue;
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

Result<std::vector<std::int64_t>> CheckpointPolicy::apply_cloud_retention(const std::set<std::int64_t>& in_use) const {
  std::vector<std::int64_t> deleted;
  SH_ASSIGN_OR_RETURN(auto cloud, CloudCheckpoints::open(config_.ckpt_path, store_));
  SH_ASSIGN_OR_RETURN(auto newest, cloud.read_tracker());
  SH_ASSIGN_OR_RETURN(auto steps, cloud.committed_steps());
  auto keep = static_cast<std::size_t>(config_.max_ckpts_to_keep);
  for (std::size_t i = 0; i + keep < steps.size(); ++i) {
    if ((newest && steps[i] == *newest) || in_use.count(steps[i]) != 0) continue;
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
    SH_RETURN_IF_ERROR(cloud.clean_interrupted().status().with_context("cleaning '" + config_.ckpt_path + "'"));
  }
  // For an object store, the folder the killed run wrote into before uploading.
  const std::string local = local_staging_root(config_.ckpt_path, local_work_dir_);
  if (!fs::is_directory(local, ec)) return Status::ok();
  return clean_stale_tmp_dirs(local).status();
}

}  // namespace stagehand
