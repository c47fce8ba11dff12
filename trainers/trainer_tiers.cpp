// The durable tier beside a local one (trainer.local_ckpt_path): which steps are saved, the
// background copies of committed local steps into ckpt_path, what the local tier keeps for them,
// and how they are reported.
#include "stagehand/trainers/trainer_base.hpp"

namespace stagehand {

bool TrainerBase::should_save(std::int64_t step) const {
  return policy_.should_save(step) || (durable_ && durable_->should_save(step));
}

std::set<std::int64_t> TrainerBase::local_steps_in_use() const {
  std::set<std::int64_t> in_use = uploads_ ? uploads_->steps_in_use() : std::set<std::int64_t>{};
  if (owed_upload_) in_use.insert(*owed_upload_);
  return in_use;
}

Status TrainerBase::upload_owed(std::int64_t step) {
  // Later steps are only there with trainer.overwrite_checkpoints: this run replaces them.
  SH_ASSIGN_OR_RETURN(auto steps, policy_.store().committed_steps());
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    if (*it > step || !durable_->should_save(*it) || rejected_local_.count(*it) != 0) continue;
    if (*it > durable_step_) owed_upload_ = *it;
    break;
  }
  if (!owed_upload_) return Status::ok();
  // A step complete in the durable tier whose tracker never moved (a crash between the two) is
  // copied again: the copy replaces it and moves the tracker.
  const std::int64_t owed = *owed_upload_;
  SH_ASSIGN_OR_RETURN(bool there, durable_->store().is_committed(owed));
  say("uploading step %lld of the local tier, committed but %s '%s' yet (trainer.ckpt_interval %lld)\n",
      static_cast<long long>(owed), there ? "not named by the tracker of" : "not in", durable_->store().root().c_str(),
      static_cast<long long>(options_.config.trainer.ckpt_interval));
  uploads_->enqueue(owed, policy_.store().step_dir(owed), durable_->store().step_dir(owed));
  return Status::ok();
}

Status TrainerBase::report_uploads() {
  if (!uploads_) return Status::ok();
  bool landed = false;
  const auto ended = uploads_->take_done();
  for (const auto& done : ended) {
    const TierCopyReport& r = done.report;
    nlohmann::json line{{"type", "upload"}, {"step", done.step},       {"path", done.out_dir},
                        {"ok", done.status.is_ok()}, {"upload_s", r.total_s}, {"copy_s", r.copy_s},
                        {"verify_s", r.verify_s},   {"commit_s", r.commit_s}, {"cpu_s", r.cpu_s},
                        {"bytes", r.bytes},
                        {"files", r.files},         {"replaced", r.replaced}};
    if (!r.repaired.empty()) {
      std::string list;
      for (const auto& item : r.repaired) list += (list.empty() ? "" : "; ") + item;
      warn("the upload of step %lld found a damaged copy in the local tier and rewrote it from a good one first: %s\n",
           static_cast<long long>(done.step), list.c_str());
      line["repaired"] = r.repaired;
    }
    if (done.status.is_ok()) {
      ++summary_->uploads_done;
      // The copy's commit moved the tracker to this step.
      durable_step_ = done.step;
      if (owed_upload_ && *owed_upload_ <= done.step) owed_upload_.reset();
      landed = true;
      say("uploaded step %lld to %s (%llu files, %llu bytes, %.3f s: copy %.3f, read back %.3f, commit %.3f)%s\n",
          static_cast<long long>(done.step), done.out_dir.c_str(), static_cast<unsigned long long>(r.files),
          static_cast<unsigned long long>(r.bytes), r.total_s, r.copy_s, r.verify_s, r.commit_s,
          r.replaced ? " (replacing the step of the same number there)" : "");
    } else {
      ++summary_->uploads_failed;
      line["error"] = done.status.message();
      const std::string held = durable_step_ >= 0 ? "still holds step " + std::to_string(durable_step_) : "holds no step yet";
      const bool stopped = done.status.code() == ErrorCode::aborted;
      upload_error_ = "the upload of step " + std::to_string(done.step) + " to '" + durable_->store().root() +
                      (stopped ? "' was stopped, the run stopping" : "' failed") + " (the durable tier " + held +
                      "; the local tier keeps the newest step it lacks, and a resume uploads it): " +
                      done.status.message();
      warn("%s\n", upload_error_.c_str());
    }
    write_metrics(line);
  }
  summary_->durable_step = durable_step_;
  if (ended.empty() || background_hung_) return Status::ok();
  // Local steps kept for an upload that ended (landed, or superseded by a newer owed step) may go.
  if (!landed) return apply_retention();
  // A store that is unreachable now fails no training step: the next upload's retention tries again.
  auto deleted = durable_->apply_retention();
  if (!deleted.is_ok()) {
    warn("retention in the durable tier '%s' failed (tried again after the next upload): %s\n",
         durable_->store().root().c_str(), deleted.status().message().c_str());
  }
  for (auto s : deleted.is_ok() ? *deleted : std::vector<std::int64_t>{}) {
    say("retention: removed the durable tier's checkpoint step %lld\n", static_cast<long long>(s));
  }
  return apply_retention();
}

Status TrainerBase::finish_uploads() {
  if (const auto stalled = wait_background(*uploads_, upload_still_limit_)) {
    // The uploads that ended first are said (no retention: the tier no longer answers), so that
    // the message names the step the durable tier holds now.
    (void)report_uploads();
    return Status{ErrorCode::timeout, hung_message(BackgroundJob::upload, *stalled, kMadeNoProgress)};
  }
  SH_RETURN_IF_ERROR(report_uploads());
  if (!owed_upload_) return Status::ok();
  return Status{ErrorCode::io_error,
                "the durable tier '" + durable_->store().root() + "' did not receive step " + std::to_string(*owed_upload_) +
                    ", committed in the local tier '" + policy_.store().root() + "'" +
                    (upload_error_.empty() ? "" : ": " + upload_error_)};
}

std::optional<std::chrono::milliseconds> TrainerBase::still_limit_for(const std::string& root) const {
  if (fs_->capabilities(root).uploads) return std::nullopt;
  return timeout_;
}

std::string TrainerBase::hung_message(BackgroundJob job, std::int64_t step, const std::string& how) const {
  const std::string limit = " " + std::to_string(options_.config.trainer.call_timeout_s) +
                            " s (trainer.call_timeout_s: a file system that does not answer?); ";
  if (job == BackgroundJob::export_hf) {
    return "the export of step " + std::to_string(step) + " to '" + policy_.export_dir(step) + "' " + how + limit +
           "the checkpoint is untouched, and the run that resumes exports it";
  }
  const std::string held =
      durable_step_ >= 0 ? "still holds step " + std::to_string(durable_step_) : "holds no step yet";
  return "the upload of step " + std::to_string(step) + " to '" + durable_->store().root() + "' " + how + limit +
         "the durable tier " + held + "; the local tier keeps the newest step it lacks, and a resume uploads it";
}

Status TrainerBase::find_durable_step(std::int64_t resumed) {
  SH_ASSIGN_OR_RETURN(auto listed, durable_->resume_candidates());
  durable_step_ = -1;
  for (auto step : listed.steps) {
    if (step > resumed || rejected_durable_.count(step) != 0) continue;
    durable_step_ = step;
    break;
  }
  summary_->durable_step = durable_step_;
  return Status::ok();
}

}  // namespace stagehand
