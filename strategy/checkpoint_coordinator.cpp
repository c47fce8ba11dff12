#include "strategy/checkpoint_coordinator.hpp"

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <map>
#include <optional>

#include "core/log.hpp"
#include "strategy/commit.hpp"
#include "strategy/destination.hpp"
#include "strategy/messages.hpp"
#include "strategy/report_codec.hpp"
#include "strategy/storage.hpp"

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
    if (is_cloud(options_.destination)) {
      finish(step, {ErrorCode::unsupported,
                    "uploading checkpoints to '" + options_.destination +
                        "' is not supported yet (object-store uploads are issue 5); step " + std::to_string(step) +
                        " was written to '" + root_ + "' and is not committed"});
      return;
    }
    finish(step, commit_checkpoint(root_, step, reports_, options_.world_size));
  }

  void finish(std::int64_t step, Status outcome) {
    if (outcome.is_ok()) {
      logger()->info("committed checkpoint step {} in '{}'", step, root_);
    } else {
      (void)abort_checkpoint(root_, step);
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
  std::vector<RankSaveReport> reports_;
  std::map<std::int64_t, Status> outcomes_;
  std::map<std::int64_t, std::vector<caf::response_promise>> waiters_;
};

}  // namespace

caf::actor spawn_checkpoint_coordinator(caf::actor_system& system, CoordinatorOptions options) {
  return system.spawn<CheckpointCoordinator>(std::move(options));
}

}  // namespace stagehand
