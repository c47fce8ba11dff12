#include "stagehand/actors/checkpoint_coordinator.hpp"

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <optional>

#include "stagehand/actors/messages.hpp"
#include "stagehand/checkpoint/cloud_checkpoint.hpp"
#include "stagehand/checkpoint/commit.hpp"
#include "stagehand/checkpoint/report_codec.hpp"
#include "stagehand/core/log.hpp"
#include "stagehand/core/priority.hpp"
#include "stagehand/storage/destination.hpp"
#include "stagehand/storage/local_files.hpp"

namespace stagehand {

namespace {

class CheckpointCoordinator : public caf::event_based_actor {
 public:
  CheckpointCoordinator(caf::actor_config& cfg, CoordinatorOptions options)
      : caf::event_based_actor(cfg),
        options_(std::move(options)),
        root_(local_staging_root(options_.destination, options_.local_work_dir)) {}

  caf::behavior make_behavior() override {
    return {
        [this](begin_atom, std::int64_t step, const std::string& trainer_state) -> caf::result<std::string> {
          auto dir = begin(step, trainer_state);
          if (!dir.is_ok()) return to_caf_error(dir.status());
          return *dir;
        },
        [this](rank_saved_atom, const std::string& encoded) { on_rank_saved(encoded); },
        [this](abort_atom, std::int64_t step, const std::string& reason) {
          if (open_step_ == step) finish(step, {ErrorCode::aborted, reason});
        },
        [this](phases_atom, std::int64_t step) -> std::string {
          return last_phases_ && last_phases_->first == step ? last_phases_->second : std::string("{}");
        },
        [this](await_atom, std::int64_t step) -> caf::result<void> {
          auto outcome = outcomes_.find(step);
          if (outcome != outcomes_.end()) {
            if (!outcome->second.is_ok()) return to_caf_error(outcome->second);
            return caf::unit;
          }
          if (open_step_ != step) {
            return to_caf_error({ErrorCode::invalid_argument, "step " + std::to_string(step) + " was never begun"});
          }
          auto promise = make_response_promise();
          waiters_[step].push_back(promise);
          return promise;
        },
    };
  }

 private:
  Result<std::string> begin(std::int64_t step, const std::string& trainer_state) {
    if (open_step_) {
      return Status{ErrorCode::aborted, "checkpoint step " + std::to_string(*open_step_) +
                                            " is still being saved; finalize it before beginning step " +
                                            std::to_string(step)};
    }
    if (is_cloud(options_.destination)) {
      SH_ASSIGN_OR_RETURN(auto cloud, CloudCheckpoints::open(options_.destination, options_.object_store));
      SH_ASSIGN_OR_RETURN(bool committed, cloud.is_committed(step));
      if (committed) {
        return Status{ErrorCode::already_exists,
                      "step " + std::to_string(step) + " is already committed at '" + cloud.step_url(step) +
                          "'; an object store cannot replace it atomically, so it is not overwritten"};
      }
      std::error_code ec;
      std::filesystem::create_directories(std::filesystem::path(root_).parent_path(), ec);
      if (ec) return Status::from_errno(ec.value(), "cannot create local_work_dir '" + options_.local_work_dir + "'");
    }
    SH_ASSIGN_OR_RETURN(std::string tmp, prepare_checkpoint_dir(root_, step));
    if (!trainer_state.empty()) SH_RETURN_IF_ERROR(write_file_atomic(tmp + "/" + kTrainerStateFile, trainer_state));
    open_step_ = step;
    reports_.clear();
    outcomes_.erase(step);
    return CheckpointLayout::policy_dir(tmp);
  }

  void on_rank_saved(const std::string& encoded) {
    auto report = decode_report(encoded);
    if (!report.is_ok()) {
      logger()->error("coordinator: {}", report.status().message());
      return;
    }
    if (open_step_ != report->step) {
      logger()->warn("coordinator: ignoring rank {}'s report for step {}, which is not being saved", report->rank,
                     report->step);
      return;
    }
    if (!report->status.is_ok()) {
      finish(report->step, report->status.with_context("rank " + std::to_string(report->rank)));
      return;
    }
    reports_.push_back(std::move(*report));
    if (static_cast<int>(reports_.size()) < options_.world_size) return;
    std::int64_t step = *open_step_;
    auto start = std::chrono::steady_clock::now();
    const double cpu_start = thread_cpu_seconds();
    Status outcome = is_cloud(options_.destination) ? commit_cloud(step)
                                                    : commit_checkpoint(root_, step, reports_, options_.world_size);
    finish(step, outcome, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
           thread_cpu_seconds() - cpu_start);
  }

  Status commit_cloud(std::int64_t step) {
    SH_ASSIGN_OR_RETURN(auto metadata, gather_reports(step, reports_, options_.world_size));
    SH_ASSIGN_OR_RETURN(metadata.trainer_state, trainer_state_meta(CheckpointLayout{root_}.tmp_dir(step)));
    SH_ASSIGN_OR_RETURN(auto cloud, CloudCheckpoints::open(options_.destination, options_.object_store));
    SH_RETURN_IF_ERROR(cloud.commit(step, metadata, CheckpointLayout{root_}.tmp_dir(step)));
    // Committed in the store; what is left locally is only the emptied work folder.
    Status cleaned = abort_checkpoint(root_, step);
    if (!cleaned.is_ok()) logger()->warn("step {} is committed; {}", step, cleaned.message());
    return Status::ok();
  }

  /// Deletes what the ranks uploaded for a step that will not commit.
  void remove_uploaded(std::int64_t step) {
    auto cloud = CloudCheckpoints::open(options_.destination, options_.object_store);
    if (cloud.is_ok()) {
      // A tracker write whose answer was lost may still have landed: then the step is committed.
      auto tracker = cloud->read_tracker();
      if (tracker.is_ok() && *tracker == step) return;
    }
    Status st = cloud.is_ok() ? cloud->remove_step(step) : cloud.status();
    if (!st.is_ok()) {
      logger()->warn("cannot delete the objects of uncommitted step {} now ({}); the next start cleans them", step,
                     st.message());
    }
  }

  /// @param commit_s seconds the commit took (metadata, renames, tracker), when it ran.
  /// @param commit_cpu_s the CPU seconds of this thread in them: on a busy machine commit_s
  ///        also counts the time it waited for a core.
  void finish(std::int64_t step, Status outcome, double commit_s = 0, double commit_cpu_s = 0) {
    const std::string where = is_cloud(options_.destination) ? options_.destination : root_;
    if (outcome.is_ok()) {
      // Each phase of the slowest rank, so that a slow save explains itself.
      SavePhases phases;
      for (const auto& r : reports_) phases.take_max(r.phases);
      logger()->info("committed checkpoint step {} in '{}' (copy_s {:.3f} hash_s {:.3f} write_s {:.3f} fsync_s {:.3f} "
                     "upload_s {:.3f} commit_s {:.3f} commit_cpu_s {:.3f})",
                     step, where, phases.copy_s, phases.hash_s, phases.write_s, phases.fsync_s, phases.upload_s,
                     commit_s, commit_cpu_s);
      last_phases_.emplace(step, encode_phases(phases, commit_s, commit_cpu_s));
    } else {
      (void)abort_checkpoint(root_, step);
      if (is_cloud(options_.destination)) remove_uploaded(step);
      outcome = outcome.with_context("checkpoint step " + std::to_string(step) + " not committed");
      logger()->error("{}", outcome.message());
    }
    outcomes_[step] = outcome;
    open_step_.reset();
    reports_.clear();
    for (auto& promise : waiters_[step]) {
      if (outcome.is_ok()) {
        promise.deliver(caf::unit);
      } else {
        promise.deliver(to_caf_error(outcome));
      }
    }
    waiters_.erase(step);
  }

  CoordinatorOptions options_;
  std::string root_;
  std::optional<std::int64_t> open_step_;
  /// The phases of the last committed step, as JSON text.
  std::optional<std::pair<std::int64_t, std::string>> last_phases_;
  std::vector<RankSaveReport> reports_;
  std::map<std::int64_t, Status> outcomes_;
  std::map<std::int64_t, std::vector<caf::response_promise>> waiters_;
};

}  // namespace

caf::actor spawn_checkpoint_coordinator(caf::actor_system& system, CoordinatorOptions options) {
  return system.spawn<CheckpointCoordinator, caf::detached>(std::move(options));
}

}  // namespace stagehand
