#include "stagehand/trainers/checkpoint_policy.hpp"

#include "stagehand/checkpoint/load/resolve.hpp"

namespace stagehand {

namespace {

/// Whether `dir` holds an export: a folder with something in it (one that cannot be read does not).
bool holds_export(FileSystem& fs, const std::string& dir) {
  auto is_dir = fs.is_dir(dir);
  if (!is_dir.is_ok() || !*is_dir) return false;
  auto entries = fs.list_dir(dir);
  return entries.is_ok() && !entries->empty();
}

}  // namespace

CheckpointPolicy CheckpointPolicy::local_tier(TrainerConfig config, std::shared_ptr<FileSystem> fs) {
  config.ckpt_path = config.local_ckpt_path;
  config.ckpt_interval = config.local_ckpt_interval;
  config.max_ckpts_to_keep = config.local_max_ckpts_to_keep;
  return CheckpointPolicy(std::move(config), std::move(fs), "trainer.local_ckpt_path");
}

CheckpointPolicy CheckpointPolicy::durable_tier(TrainerConfig config, std::shared_ptr<FileSystem> fs) {
  config.export_interval = 0;
  return CheckpointPolicy(std::move(config), std::move(fs), "trainer.ckpt_path");
}

bool CheckpointPolicy::should_save(std::int64_t step) const {
  return step == config_.total_steps ||
         (config_.ckpt_interval > 0 && step % config_.ckpt_interval == 0);
}

Result<std::optional<std::string>> CheckpointPolicy::resume_dir() const {
  switch (config_.resume_mode) {
    case ResumeMode::none:
      return std::optional<std::string>{};
    case ResumeMode::latest:
      return Status{ErrorCode::internal, "resume_mode latest resumes through resume_candidates()"};
    case ResumeMode::from_path: {
      auto dir = resolve_checkpoint(store_.fs(), config_.resume_path);
      if (!dir.is_ok()) return dir.status().with_context("trainer.resume_path");
      return std::optional<std::string>{*dir};
    }
  }
  return Status{ErrorCode::internal, "unknown resume_mode"};
}

Result<CheckpointPolicy::ResumeCandidates> CheckpointPolicy::resume_candidates() const {
  ResumeCandidates found;
  SH_ASSIGN_OR_RETURN(auto tracked, store_.tracker());
  if (!tracked) return found;
  SH_ASSIGN_OR_RETURN(auto steps, store_.committed_steps());
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    if (*it <= *tracked) found.steps.push_back(*it);
  }
  if (found.steps.empty() || found.steps.front() != *tracked) {
    found.stale = "the tracker '" + store_.layout().tracker() + "' names step " + std::to_string(*tracked) +
                  ", but '" + store_.step_dir(*tracked) + "' is not a committed checkpoint";
  }
  return found;
}

Status CheckpointPolicy::check_fresh_start() const {
  if (config_.overwrite_checkpoints) return Status::ok();
  const std::string& root = config_.ckpt_path;
  SH_ASSIGN_OR_RETURN(auto steps, store_.committed_steps());
  if (steps.empty()) return Status::ok();
  SH_ASSIGN_OR_RETURN(auto tracked, tracked_step());
  auto folder = [](std::int64_t step) { return "global_step_" + std::to_string(step); };
  std::string held = folder(steps.front());
  if (steps.size() == 2) held += ", " + folder(steps.back());
  if (steps.size() > 2)
    held += " ... " + folder(steps.back()) + ", " + std::to_string(steps.size()) + " in all";
  const std::string exists =
      root_setting_ + " '" + root + "' holds committed checkpoints (" + held + ")";
  const std::string overwrite =
      "or set trainer.overwrite_checkpoints: true to start over in this folder anyway";
  const std::string from_path =
      "resume one with trainer.resume_mode: from_path and trainer.resume_path: '" +
      store_.step_dir(steps.back()) + "', ";
  if (config_.resume_mode == ResumeMode::none) {
    return {ErrorCode::already_exists,
            exists + " and trainer.resume_mode is none: a run from step 1 would replace them. " +
                (tracked ? "Set trainer.resume_mode: latest to continue from step " +
                               std::to_string(*tracked) + ", "
                         : from_path) +
                overwrite};
  }
  return {ErrorCode::already_exists,
          exists + ", but its tracker '" + store_.layout().tracker() +
              "' is missing: trainer.resume_mode latest would start from step 1 "
              "and replace them. Restore the tracker, " +
              from_path + overwrite};
}

Status CheckpointPolicy::check_resume(std::int64_t step, const std::set<std::int64_t>& rejected) const {
  if (config_.overwrite_checkpoints) return Status::ok();
  SH_ASSIGN_OR_RETURN(auto steps, store_.committed_steps());
  // resume_mode latest takes the tracker as the truth: a step beyond it (a commit whose tracker
  // never moved, or one a resume passed over and the tracker moved back from) is not resumable
  // and is replaced when the run saves it again.
  std::optional<std::int64_t> tracked;
  if (config_.resume_mode == ResumeMode::latest) {
    SH_ASSIGN_OR_RETURN(tracked, store_.tracker());
  }
  std::vector<std::int64_t> later;
  for (auto s : steps) {
    if (tracked && s > *tracked) continue;
    if (s > step && rejected.count(s) == 0) later.push_back(s);
  }
  if (later.empty()) return Status::ok();
  std::string held = "global_step_" + std::to_string(later.front());
  if (later.size() > 1) held += " ... global_step_" + std::to_string(later.back()) + ", " + std::to_string(later.size()) + " in all";
  return {ErrorCode::already_exists,
          root_setting_ + " '" + config_.ckpt_path + "' holds committed checkpoints of steps after " +
              std::to_string(step) + ", the step resumed (" + held +
              "): the run's saves would replace them. Resume the newest (trainer.resume_mode: latest), give the "
              "run another " + root_setting_ + ", or set trainer.overwrite_checkpoints: true to replace them anyway"};
}

bool CheckpointPolicy::should_export(std::int64_t step) const {
  return config_.export_interval > 0 && step % config_.export_interval == 0;
}

std::string CheckpointPolicy::export_dir(std::int64_t step) const {
  return config_.export_path + "/global_step_" + std::to_string(step);
}

Result<std::vector<std::int64_t>> CheckpointPolicy::owed_exports() const {
  std::vector<std::int64_t> owed;
  if (config_.export_interval <= 0) return owed;
  SH_ASSIGN_OR_RETURN(auto steps, store_.committed_steps());
  for (auto step : steps) {
    if (should_export(step) && !holds_export(store_.fs(), export_dir(step))) owed.push_back(step);
  }
  return owed;
}

Result<std::vector<std::int64_t>> CheckpointPolicy::apply_retention(const std::set<std::int64_t>& in_use) const {
  const int keep = static_cast<int>(config_.max_ckpts_to_keep);
  if (keep <= 0) return std::vector<std::int64_t>{};
  std::set<std::int64_t> kept = in_use;
  SH_ASSIGN_OR_RETURN(auto owed, owed_exports());
  kept.insert(owed.begin(), owed.end());
  return store_.apply_retention(keep, kept);
}

Result<std::unique_ptr<FileLock>> CheckpointPolicy::lock_destination() const {
  auto lock = store_.lock();
  if (!lock.is_ok()) return lock.status().with_context(context());
  return lock;
}

Status CheckpointPolicy::clean_interrupted_saves() const {
  return store_.clean_interrupted().status().with_context("cleaning '" + config_.ckpt_path + "'");
}

}  // namespace stagehand
