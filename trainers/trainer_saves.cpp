// The trainer's side of a save: the trainer state, the stall, the commit's metrics line, the
// periodic exports and retention.
#include "stagehand/checkpoint/tiers/host_folders.hpp"
#include "stagehand/core/host_buffer.hpp"
#include "stagehand/trainers/trainer_base.hpp"

namespace stagehand {

Status TrainerBase::save(std::int64_t step) {
  SH_RETURN_IF_ERROR(finalize());
  const auto& c = options_.config;
  TrainerState state{step, name(), c.trainer.seed, step * c.model.batch_size, {},
                     SavedLayout{c.parallel.tensor_parallel, c.parallel.data_parallel}};
  SH_RETURN_IF_ERROR(fill_state(step, state));
  staging_memory().reset_peak();
  const auto started = Clock::now();
  auto saved = client_.save(step, c.megatron_config.async_dist_ckpt_save, trainer_state_to_json(state));
  if (!saved.is_ok()) return saved.status().with_context("checkpoint step " + std::to_string(step));
  summary_->total_stall_s += saved->stall_s;
  pending_ = PendingCommit{step, saved->stall_s, saved->async, started, 0};
  char buf[128];
  std::snprintf(buf, sizeof(buf), "step %lld stall %.3fs %s", static_cast<long long>(step), saved->stall_s,
                saved->async ? "async" : "sync");
  last_save_ = buf;
  if (saved->committed) return on_committed(saved->commit);
  return Status::ok();
}

Status TrainerBase::finalize() {
  auto finalized = client_.finalize();
  if (!finalized.is_ok()) {
    pending_.reset();
    return finalized.status();
  }
  if (!finalized->committed) return Status::ok();
  return on_committed(finalized->commit);
}

Status TrainerBase::on_committed(const CommitInfo& commit) {
  if (!pending_ || pending_->step != commit.step) return Status::ok();
  const PendingCommit saved = *pending_;
  pending_.reset();
  ++summary_->checkpoints_committed;
  const std::string dir = policy_.store().step_dir(saved.step);
  summary_->latest_checkpoint = dir;
  const SavePhases& p = commit.phases;
  nlohmann::json line{{"type", "save"},
                      {"step", saved.step},
                      {"stall_s", saved.stall_s},
                      {"fence_wait_s", saved.fence_wait_s},
                      {"async", saved.async},
                      {"save_s", std::chrono::duration<double>(Clock::now() - saved.started).count()},
                      {"bytes", commit.bytes},
                      // Through the commit: an async save's staging runs on after it returned.
                      {"host_staging_peak_bytes", staging_memory().peak()},
                      // Where the time went (the slowest rank's phases, and the commit's), so
                      // that a slow save explains itself.
                      {"copy_s", p.copy_s},
                      {"hash_s", p.hash_s},
                      {"write_s", p.write_s},
                      {"fsync_s", p.fsync_s},
                      {"upload_s", p.upload_s},
                      {"commit_s", commit.commit_s},
                      {"commit_cpu_s", commit.commit_cpu_s},
                      // What the save took from the cores: every rank's writer threads.
                      {"save_cpu_s", commit.ranks_cpu_s}};
  write_metrics(line);
  if (host_record_owed_) {
    // The first commit of a run over host folders records how many hosts wrote them.
    SH_RETURN_IF_ERROR(write_host_record(*fs_, policy_.store().root()).with_context("trainer.local_ckpt_path"));
    host_record_owed_ = false;
  }
  if (exports_ && policy_.should_export(saved.step)) exports_->enqueue(saved.step, dir, policy_.export_dir(saved.step));
  if (uploads_ && durable_->should_save(saved.step)) {
    owed_upload_ = saved.step;
    // An upload still queued is of no use once a newer step goes up: a slow store must not make
    // the local tier keep every step it has not taken yet.
    for (auto older : uploads_->drop_queued_before(saved.step)) {
      say("the upload of step %lld is skipped: step %lld supersedes it\n", static_cast<long long>(older),
          static_cast<long long>(saved.step));
    }
    uploads_->enqueue(saved.step, dir, durable_->store().step_dir(saved.step));
  }
  return apply_retention();
}

Status TrainerBase::apply_retention() {
  std::set<std::int64_t> in_use;
  if (exports_) in_use = exports_->steps_in_use();
  if (durable_) in_use.merge(local_steps_in_use());
  SH_ASSIGN_OR_RETURN(auto deleted, policy_.apply_retention(in_use));
  const char* tier = durable_ ? "the local tier's " : "";
  for (auto s : deleted) say("retention: removed %scheckpoint step %lld\n", tier, static_cast<long long>(s));
  return Status::ok();
}

Status TrainerBase::export_owed(std::int64_t step) {
  SH_ASSIGN_OR_RETURN(auto owed, policy_.owed_exports());
  for (auto s : owed) {
    // Later steps are only there with trainer.overwrite_checkpoints: this run replaces them.
    if (s > step) continue;
    say("exporting step %lld, committed but not exported yet (trainer.export_interval %lld)\n",
        static_cast<long long>(s), static_cast<long long>(options_.config.trainer.export_interval));
    exports_->enqueue(s, policy_.store().step_dir(s), policy_.export_dir(s));
  }
  return Status::ok();
}

void TrainerBase::report_exports() {
  if (!exports_) return;
  for (const auto& done : exports_->take_done()) {
    nlohmann::json line{{"type", "export"}, {"step", done.step}, {"path", done.out_dir}, {"ok", done.status.is_ok()},
                        {"export_s", done.report.total_s}, {"bytes", done.report.bytes}, {"files", done.report.files}};
    if (done.status.is_ok()) {
      ++summary_->exports_done;
      say("exported step %lld to %s (%llu files, %llu bytes, %.3f s)\n", static_cast<long long>(done.step),
          done.out_dir.c_str(), static_cast<unsigned long long>(done.report.files),
          static_cast<unsigned long long>(done.report.bytes), done.report.total_s);
    } else if (done.status.code() == ErrorCode::aborted && exports_->stopping()) {
      // Stopped with the run: no output, still owed.
      line["stopped"] = true;
      say("the export of step %lld to %s stopped with the run; the run that resumes does it\n",
          static_cast<long long>(done.step), done.out_dir.c_str());
    } else {
      ++summary_->exports_failed;
      line["error"] = done.status.message();
      warn("the export of step %lld to %s failed (the checkpoint is untouched): %s\n", static_cast<long long>(done.step),
           done.out_dir.c_str(), done.status.message().c_str());
    }
    write_metrics(line);
  }
}

}  // namespace stagehand
