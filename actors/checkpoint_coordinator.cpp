#include "stagehand/actors/checkpoint_coordinator.hpp"

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include <chrono>
#include <map>
#include <optional>

#include "stagehand/actors/messages.hpp"
#include "stagehand/checkpoint/checkpoint_store.hpp"
#include "stagehand/checkpoint/gather.hpp"
#include "stagehand/checkpoint/report_codec.hpp"
#include "stagehand/core/log.hpp"
#include "stagehand/core/priority.hpp"

namespace stagehand {

namespace {

class CheckpointCoordinator : public caf::event_based_actor {
 public:
  CheckpointCoordinator(caf::actor_config& cfg, CoordinatorOptions options)
      : caf::event_based_actor(cfg), options_(std::move(options)), store_(options_.file_system, options_.destination) {}

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

 void on_exit() override {
    // A waiting promise holds this actor: answered now, or the actor would never be destroyed
    // (and the actor system, waiting for its thread, would never shut down).
    for (auto& [step, promises] : waiters_) {
      for (auto& promise : promises) {
        promise.deliver(to_caf_error({ErrorCode::aborted, "the checkpoint coordinator stopped before step " +
                                                              std::to_string(step) + " was committed"}));
      }
    }
    waiters_.clear();
  }

 private:
  Result<std::string> begin(std::int64_t step, const std::string& trainer_state) {
    if (open_step_) {
      return Status{ErrorCode::aborted, "checkpoint step " + std::to_string(*open_step_) +
                                            " is still being saved; finalize it before beginning step " +
                                            std::to_string(step)};
    }
    SH_ASSIGN_OR_RETURN(std::string policy, store_.prepare(step));
    trainer_state_.reset();
    commit_ran_ = false;
    if (!trainer_state.empty()) {
      auto written = store_.write_trainer_state(step, trainer_state);
      if (!written.is_ok()) {
        (void)store_.abort(step);
        return written.status();
      }
      trainer_state_ = *written;
    }
    open_step_ = step;
    reports_.clear();
    outcomes_.erase(step);
    return policy;
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
    Status outcome = commit(step);
    finish(step, outcome, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
           thread_cpu_seconds() - cpu_start);
  }

  Status commit(std::int64_t step) {
    SH_ASSIGN_OR_RETURN(auto metadata, gather_reports(step, reports_, options_.world_size));
    metadata.trainer_state = trainer_state_;
    // A failed commit removes what it must itself: after the rename the step stays in place.
    commit_ran_ = true;
    return store_.commit(step, metadata).status();
  }

  /// @param commit_s seconds the commit took (metadata, renames, tracker), when it ran.
  /// @param commit_cpu_s the CPU seconds of this thread in them: on a busy machine commit_s
  ///        also counts the time it waited for a core.
  void finish(std::int64_t step, Status outcome, double commit_s = 0, double commit_cpu_s = 0) {
    const std::string& where = store_.root();
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
      if (Status removed = commit_ran_ ? Status::ok() : store_.abort(step); !removed.is_ok()) {
        logger()->warn("cannot remove what uncommitted step {} left now ({}); the next start cleans it", step,
                       removed.message());
      }
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
  CheckpointStore store_;
  /// The open step's trainer_state.json, as written.
  std::optional<FileMeta> trainer_state_;
  /// The store's commit of the open step ran (and cleaned up after itself if it failed).
  bool commit_ran_ = false;
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
