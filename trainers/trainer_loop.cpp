// The loop every trainer runs: start (resume or fresh), train, evaluate, save on the policy,
// finalize at the end.
#include <caf/all.hpp>

#include <cerrno>
#include <exception>

#include "stagehand/checkpoint/tiers/host_folders.hpp"
#include "stagehand/trainers/trainer_base.hpp"

namespace stagehand {

TrainerBase::TrainerBase(caf::actor_config& cfg, dispatch_actor dispatch, TrainerOptions options,
                         std::shared_ptr<TrainerSummary> summary)
    : caf::blocking_actor(cfg),
      options_(std::move(options)),
      summary_(std::move(summary)),
      fs_(options_.file_system),
      policy_(options_.config.trainer.local_ckpt_path.empty()
                  ? CheckpointPolicy(options_.config.trainer, fs_)
                  : CheckpointPolicy::local_tier(options_.config.trainer, fs_)),
      timeout_(std::chrono::seconds(options_.config.trainer.call_timeout_s)),
      // The dispatch bounds each of its waits by the call limit; a call is a few of them.
      client_(system(), std::move(dispatch), timeout_ * 6, "6 x trainer.call_timeout_s") {
  if (!options_.config.trainer.local_ckpt_path.empty()) {
    durable_.emplace(CheckpointPolicy::durable_tier(options_.config.trainer, fs_));
  }
}

void TrainerBase::act() {
  summary_->status = run_catching();
  // A run that ended well has ended every export and upload. After a signal or an error, the
  // job running now stops at its next piece (an export leaving no output, an upload leaving the
  // durable tier as it was) and queued ones are dropped, all still owed: the run that resumes
  // does them. Both are asked at once. A job that does not stop within trainer.call_timeout_s
  // (a write to a file system that no longer answers; at once if the end of the run found it
  // stalled; into an object store, as long as its requests' own limits allow) is left behind,
  // so that the process can end.
  const auto dropped_uploads = uploads_ ? uploads_->request_stop() : std::vector<std::int64_t>{};
  if (exports_) {
    const auto stopped = exports_->stop(export_still_limit_);
    if (stopped.left_running >= 0) {
      background_hung_ = true;
      summary_->work_left_behind = true;
      ++summary_->exports_failed;
      warn("%s\n", hung_message(BackgroundJob::export_hf, stopped.left_running, kLeftBehind).c_str());
    }
    report_exports();
  }
  if (uploads_) {
    const auto stopped = uploads_->stop(upload_still_limit_);
    for (auto step : dropped_uploads) {
      warn("the upload of step %lld to '%s' was not started (the run stopped); the local tier keeps the newest step "
           "the durable tier lacks, and a resume uploads it\n",
           static_cast<long long>(step), durable_->store().root().c_str());
    }
    if (stopped.left_running >= 0) {
      background_hung_ = true;
      summary_->work_left_behind = true;
      ++summary_->uploads_failed;
      warn("%s\n", hung_message(BackgroundJob::upload, stopped.left_running, kLeftBehind).c_str());
    }
    // Without retention once a job stopped moving or was left behind (background_hung_).
    (void)report_uploads();
  }
  on_stop();
  if (!summary_->status.is_ok()) {
    if (summary_->stopped_by_signal) {
      if (auto tracked = policy_.tracked_step(); tracked.is_ok()) summary_->tracked_step = *tracked;
    }
    std::fprintf(stderr, "stagehand-train: %s\n", summary_->status.message().c_str());
  }
}

Status TrainerBase::run_catching() {
  try {
    return run();
  } catch (const std::exception& e) {
    return {ErrorCode::internal, std::string("the ") + name() + " trainer stopped on an exception: " + e.what()};
  }
}

Status TrainerBase::run() {
  const auto& t = options_.config.trainer;
  if (!options_.metrics_out.empty()) {
    metrics_.open(options_.metrics_out, std::ios::trunc);
    if (!metrics_) return Status::from_errno(errno, "cannot write --metrics-out '" + options_.metrics_out + "'");
  }
  SH_RETURN_IF_ERROR(policy_.check_destination());
  if (durable_) SH_RETURN_IF_ERROR(durable_->check_destination());
  // Before anything is cleaned: another run's .tmp folder is its save in flight.
  SH_ASSIGN_OR_RETURN(summary_->root_lock, policy_.lock_destination());
  if (durable_) {
    SH_ASSIGN_OR_RETURN(summary_->durable_lock, durable_->lock_destination());
  }
  if (save_root(t).find(kHostPlaceholder) != std::string::npos && host_placement_of(*fs_) != nullptr) {
    auto owed = check_host_record(*fs_, save_root(t));
    if (!owed.is_ok()) return owed.status().with_context("trainer.local_ckpt_path");
    host_record_owed_ = *owed;
  }
  // resume_mode latest checks before it trusts: it tries the committed steps newest first.
  Candidates candidates;
  std::optional<std::string> resume;
  if (t.resume_mode == ResumeMode::latest) {
    SH_ASSIGN_OR_RETURN(candidates, resume_candidates());
    if (!candidates.steps.empty()) resume = candidates.steps.front().dir;
    if (candidates.steps.empty() && !candidates.stale.empty()) {
      std::string stale;
      for (const auto& s : candidates.stale) stale += (stale.empty() ? "" : "; ") + s;
      return Status{ErrorCode::corruption, "trainer.resume_mode latest: " + stale +
                                               ", and no committed step before it is in '" + save_root(t) + "'" +
                                               (durable_ ? " nor in '" + t.ckpt_path + "'" : "")};
    }
  } else {
    SH_ASSIGN_OR_RETURN(resume, policy_.resume_dir());
  }
  if (!resume) {
    SH_RETURN_IF_ERROR(policy_.check_fresh_start());
    if (durable_) SH_RETURN_IF_ERROR(durable_->check_fresh_start());
    if (t.resume_mode == ResumeMode::latest) {
      say("resume_mode latest: nothing to resume in '%s'%s (no tracker); starting from step 1\n", save_root(t).c_str(),
          durable_ ? (" nor in '" + t.ckpt_path + "'").c_str() : "");
    }
  }
  SH_RETURN_IF_ERROR(policy_.clean_interrupted_saves());
  if (durable_) {
    SH_RETURN_IF_ERROR(durable_->clean_interrupted_saves());
    // The uploads' copy buffers, kept from one upload to the next (16 MiB with the defaults).
    auto buffers = std::make_shared<CopyBuffers>(TierCopyOptions{}.piece_bytes);
    upload_still_limit_ = still_limit_for(durable_->store().root());
    uploads_ = std::make_unique<BackgroundSteps<TierCopyReport>>(
        "the upload",
        [buffers, from = policy_.store(), to = durable_->store()](std::int64_t step, const std::string&,
                                                                  const std::string&, JobControl& control,
                                                                  TierCopyReport& report) {
          TierCopyOptions copy;
          copy.buffers = buffers;
          copy.should_stop = [&control] { return control.piece(); };
          auto copied = copy_committed_step(from, to, step, copy);
          if (copied.is_ok()) report = *copied;
          return copied.status();
        },
        options_.stop_requested);
  }
  if (t.export_interval > 0) {
    export_still_limit_ = still_limit_for(t.export_path);
    exports_ = std::make_unique<BackgroundSteps<ExportReport>>(
        "the export",
        [fs = fs_](std::int64_t, const std::string& checkpoint_dir, const std::string& out_dir, JobControl& control,
                   ExportReport& report) {
          ExportOptions options;
          options.should_stop = [&control] { return control.piece(); };
          return export_checkpoint(*fs, checkpoint_dir, out_dir, options, &report);
        },
        options_.stop_requested);
  }
  SH_ASSIGN_OR_RETURN(std::int64_t step, t.resume_mode == ResumeMode::latest && resume ? resume_latest(candidates)
                                                                                     : start_from(resume));
  if (resume && exports_) SH_RETURN_IF_ERROR(export_owed(step));
  if (uploads_) {
    SH_RETURN_IF_ERROR(find_durable_step(step));
    SH_RETURN_IF_ERROR(upload_owed(step));
  }
  summary_->first_step = step + 1;
  summary_->last_step = step;
  SH_RETURN_IF_ERROR(push_weights(step));
  SH_ASSIGN_OR_RETURN(step, train_steps(step));
  // End of training: every save is finished before the trainer reports done, and so is every
  // export, unless a signal asked to stop (then the export running now ends with the trainer,
  // and the queued ones are dropped).
  SH_RETURN_IF_ERROR(finalize());
  if (exports_ && !summary_->stopped_by_signal) {
    if (const auto stalled = wait_background(*exports_, export_still_limit_)) {
      report_exports();
      return Status{ErrorCode::timeout, hung_message(BackgroundJob::export_hf, *stalled, kMadeNoProgress)};
    }
    report_exports();
    // The checkpoints kept until their exports were done may go now.
    SH_RETURN_IF_ERROR(apply_retention());
  }
  if (uploads_ && !summary_->stopped_by_signal) SH_RETURN_IF_ERROR(finish_uploads());
  return Status::ok();
}

Status TrainerBase::push_weights(std::int64_t step) {
  if (pushes_weights_itself() || options_.config.weight_sync.channel.empty()) return Status::ok();
  return client_.export_weights(step, outside_receivers()).with_context("weight sync of step " + std::to_string(step));
}

Result<std::int64_t> TrainerBase::train_steps(std::int64_t step) {
  const auto& t = options_.config.trainer;
  const auto started = Clock::now();
  std::int64_t saved_step = step;
  while (step < t.total_steps) {
    if (options_.stop_requested && options_.stop_requested->load()) {
      summary_->stopped_by_signal = true;
      break;
    }
    ++step;
    auto actions = batch_actions(step);
    if (!actions.is_ok()) return actions.status().with_context("step " + std::to_string(step));
    auto metrics = client_.train({step, objective(), std::move(*actions)});
    if (!metrics.is_ok()) return metrics.status().with_context("step " + std::to_string(step));
    summary_->total_fence_wait_s += metrics->fence_wait_s;
    if (pending_) pending_->fence_wait_s += metrics->fence_wait_s;
    SH_RETURN_IF_ERROR(after_step(step));
    SH_RETURN_IF_ERROR(push_weights(step));
    auto accuracy = client_.evaluate();
    if (!accuracy.is_ok()) return accuracy.status().with_context("evaluation at step " + std::to_string(step));
    summary_->last_step = step;
    summary_->last_accuracy = *accuracy;
    report_exports();
    SH_RETURN_IF_ERROR(report_uploads());
    const double elapsed_s = std::chrono::duration<double>(Clock::now() - started).count();
    const double rate = double(step - summary_->first_step + 1) / std::max(1e-9, elapsed_s);
    const bool rl = objective() == Objective::rl;
    nlohmann::json line{{"type", "step"},
                        {"step", step},
                        {"accuracy", *accuracy},
                        {rl ? "reward" : "loss", rl ? metrics->reward : metrics->loss},
                        {"fence_wait_s", metrics->fence_wait_s},
                        // Seconds from the first step's start to this step's end, for steps
                        // per second (bench/interference.py); a save at this step runs after
                        // the line, so its stall lands in the next step's figure.
                        {"elapsed_s", elapsed_s}};
    fill_metrics(step, line);
    write_metrics(line);
    if (should_save(step)) {
      SH_RETURN_IF_ERROR(save(step));
      saved_step = step;
    }
    if (step % 10 == 0 || step == t.total_steps) {
      say("step %lld/%lld %s %.4f acc %.3f %.1f steps/s | last save: %s\n", static_cast<long long>(step),
          static_cast<long long>(t.total_steps), rl ? "reward" : "loss", rl ? metrics->reward : metrics->loss,
          *accuracy, rate, last_save_.c_str());
    }
  }
  if (summary_->stopped_by_signal && step > 0) {
    // Set before saving, so that a failed save is reported with its step.
    summary_->signal_save_step = step;
    if (saved_step != step) {
      say("stop requested: saving step %lld before exiting\n", static_cast<long long>(step));
      SH_RETURN_IF_ERROR(save(step));
    }
  }
  return step;
}

void TrainerBase::write_metrics(const nlohmann::json& line) {
  if (metrics_.is_open()) metrics_ << line.dump() << "\n" << std::flush;
}

}  // namespace stagehand
