#include "stagehand/actors/checkpoint_coordinator.hpp"

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "stagehand/checkpoint/store/checkpoint_store.hpp"
#include "stagehand/checkpoint/metadata/gather.hpp"
#include "stagehand/core/log.hpp"
#include "stagehand/core/priority.hpp"

namespace stagehand {

namespace {

using Clock = std::chrono::steady_clock;

class CheckpointCoordinator : public coordinator_actor::base {
 public:
  CheckpointCoordinator(caf::actor_config& cfg, CoordinatorOptions options)
      : coordinator_actor::base(cfg),
        options_(std::move(options)),
        store_(options_.file_system, options_.destination),
        known_(static_cast<std::size_t>(options_.world_size)) {}

  behavior_type make_behavior() override {
    return {
        [this](plan_atom, LocalPlan& plan, std::string& trainer_state) -> caf::result<WriteAssignment> {
          return on_plan(std::move(plan), std::move(trainer_state));
        },
        [this](rank_saved_atom, RankSaveReport& report) { on_rank_saved(std::move(report)); },
        [this](await_atom, std::int64_t step) -> caf::result<CommitInfo> {
          if (auto outcome = outcomes_.find(step); outcome != outcomes_.end()) {
            if (!outcome->second.is_ok()) return to_caf_error(outcome->second.status());
            return *outcome->second;
          }
          // While a save of the step made again forms, an await is about the failed one: a rank
          // awaits its own save only once its plan was assigned, which opens the step.
          if (const Status* failed = superseded(step)) return to_caf_error(*failed);
          if (open_step_ != step && !forming(step)) {
            return to_caf_error({ErrorCode::invalid_argument, "step " + std::to_string(step) + " was never begun"});
          }
          auto promise = make_response_promise<CommitInfo>();
          waiters_[step].push_back(promise);
          return promise;
        },
        [this](poll_atom, std::int64_t step) -> bool {
          return outcomes_.count(step) != 0 || superseded(step) != nullptr;
        },
        [this](abort_atom, std::int64_t step, std::int32_t rank, const std::string& reason) {
          const Status why{ErrorCode::aborted, reason};
          // A rank's abort of a failed save may come after another rank began saving the step
          // again: it ends the new save only if it is about it (the rank planned in it, or was
          // not in the failed one). A rank's abort always comes before its own next plan.
          if (forming(step)) {
            const bool stale = rank >= 0 && rank < options_.world_size &&
                               !forming_->plans[static_cast<std::size_t>(rank)] && forming_->again.count(rank) != 0;
            if (!stale) fail_forming(why);
          }
          if (open_step_ == step) finish(step, why);
        },
        [this](rank_down_atom, std::int32_t rank, const std::string& reason) {
          const std::string what = "rank " + std::to_string(rank) + " died: " + reason;
          dead_.emplace(rank, what);
          fail_deferred({ErrorCode::aborted, what + "; the job cannot save any more (restart it)"});
          if (draining_) stopped_writing(rank);
          if (forming_) fail_forming({ErrorCode::aborted, what});
          if (open_step_) finish(*open_step_, Status{ErrorCode::aborted, what + " (during the save)"});
        },
        [this](write_timeout_atom, std::int64_t step, std::uint64_t opening) {
          if (open_step_ != step || opening_ != opening) return;
          std::vector<int> missing;
          for (int r = 0; r < options_.world_size; ++r) {
            if (!reported(r)) missing.push_back(r);
          }
          finish(step, Status{ErrorCode::timeout, rank_phrase(missing) + " did not finish writing step " +
                                                      std::to_string(step) + " within " + seconds(options_.write_timeout) +
                                                      " (" + options_.write_timeout_setting + ")"});
        },
        [this](drained_atom, std::int64_t step, std::uint64_t opening) {
          if (!draining_ || draining_->step != step || draining_->opening != opening) return;
          logger()->warn("coordinator: {} still writing failed step {} after {}; removing it now",
                         draining_ranks(), step, seconds(drain_limit()));
          drain_ended();
        },
        [this](timeout_atom, std::int64_t step, std::uint64_t id) {
          if (!forming_ || forming_->step != step || forming_->id != id) return;
          std::vector<int> missing;
          for (std::size_t r = 0; r < forming_->plans.size(); ++r) {
            if (!forming_->plans[r]) missing.push_back(static_cast<int>(r));
          }
          fail_forming({ErrorCode::timeout,
                        rank_phrase(missing) + " did not begin saving step " + std::to_string(step) + " within " +
                            std::to_string(options_.plan_timeout.count() / 1000) +
                            " s of the first rank (the call time limit): every rank must save every step"});
        },
    };
  }

  void on_exit() override {
    // A waiting promise holds this actor: each is answered now, or the actor would never be
    // destroyed (and the actor system, waiting for its thread, would never shut down).
    const Status stopped{ErrorCode::aborted, "the checkpoint coordinator stopped"};
    if (forming_) fail_forming(stopped);
    if (open_step_) finish(*open_step_, stopped);
    fail_deferred(stopped);
    if (draining_) remove_failed();
    for (auto& [step, promises] : waiters_) {
      for (auto& promise : promises) promise.deliver(to_caf_error(stopped));
    }
    waiters_.clear();
  }

 private:
  /// The local plans of the step being planned, and the ranks waiting for their assignment.
  struct Forming {
    std::int64_t step = 0;
    /// By rank.
    std::vector<std::optional<LocalPlan>> plans;
    std::vector<std::optional<caf::typed_response_promise<WriteAssignment>>> promises;
    std::string trainer_state;
    int arrived = 0;
    /// When this saves a failed step again: the ranks that were in the failed save.
    std::set<int> again;
    /// Counts the formings: a plan limit of an earlier forming of the same step is ignored.
    std::uint64_t id = 0;
    /// When this saves a failed step again: the failed save's outcome, the answer to its
    /// awaits and polls meanwhile (a rank whose report ended the drain awaits the failed save;
    /// the new save waits for that rank's next plan).
    std::optional<Status> superseded;
  };

  /// Whether a save of `step` forms (its plans are being gathered).
  bool forming(std::int64_t step) const { return forming_ && forming_->step == step; }

  /// While a save of `step` made again forms: the failed save's outcome, the answer to awaits
  /// and polls of the step meanwhile; null otherwise.
  const Status* superseded(std::int64_t step) const {
    return forming(step) && forming_->superseded ? &*forming_->superseded : nullptr;
  }

  caf::result<WriteAssignment> on_plan(LocalPlan plan, std::string trainer_state) {
    auto promise = make_response_promise<WriteAssignment>();
    take_plan(std::move(plan), std::move(trainer_state), promise);
    return promise;
  }

  void take_plan(LocalPlan plan, std::string trainer_state, caf::typed_response_promise<WriteAssignment> promise) {
    const int rank = plan.rank;
    const std::string who = "rank " + std::to_string(rank);
    auto refuse = [&promise](const Status& why) { promise.deliver(to_caf_error(why)); };
    if (rank < 0 || rank >= options_.world_size) {
      return refuse({ErrorCode::invalid_argument, who + " is outside the world of " +
                                                      std::to_string(options_.world_size) + " ranks"});
    }
    if (!dead_.empty()) {
      return refuse({ErrorCode::aborted, dead_.begin()->second + "; the job cannot save any more (restart it)"});
    }
    if (open_step_) {
      return refuse({ErrorCode::aborted, "step " + std::to_string(*open_step_) + " is still being written; " + who +
                                             " must finalize it before saving step " + std::to_string(plan.step)});
    }
    if (auto outcome = outcomes_.find(plan.step); outcome != outcomes_.end() && !outcome->second.is_ok() &&
                                                  !forming(plan.step)) {
      // A rank that was not in the failed save (it came after the others failed) hears why, once;
      // a rank that was told (its call failed) saves the step again: a new save begins.
      auto& untold = untold_[plan.step];
      if (untold.erase(rank) != 0) {
        return refuse(outcome->second.status().with_context(who + " began step " + std::to_string(plan.step) +
                                                            " too late"));
      }
    }
    if (draining_ && draining_->step == plan.step && !forming(plan.step)) {
      // The failed save's last writers still write into the step's folder: the new save begins
      // once they stopped (or the drain limit passed), never under them.
      deferred_.push_back(Deferred{std::move(plan), std::move(trainer_state), std::move(promise)});
      return;
    }
    if (!forming_) begin_forming(plan.step);
    if (forming_->step != plan.step) {
      const Status mismatch{ErrorCode::invalid_argument,
                            who + " saves step " + std::to_string(plan.step) + " while " + ranks_in_forming() +
                                " save step " + std::to_string(forming_->step) +
                                ": every rank must save the same step"};
      fail_forming(mismatch);
      // The ranks still to plan either step fail at once too (not at the plan limit).
      record_failure(plan.step, mismatch, {rank});
      return refuse(mismatch);
    }
    auto& slot = forming_->plans[static_cast<std::size_t>(rank)];
    if (slot) return refuse({ErrorCode::invalid_argument, who + " sent two plans for step " + std::to_string(plan.step)});
    auto& known = known_[static_cast<std::size_t>(rank)];
    if (plan.cached) {
      if (!known || known->signature != plan.signature) {
        const Status lost{ErrorCode::internal, who + "'s plan refers to a structure the coordinator does not know"};
        fail_forming(lost, {rank});
        return refuse(lost);
      }
    } else {
      // The descriptors are held once, here (the global plan and the commit read them here);
      // the forming slot keeps the rest of the plan.
      known = LocalPlan{rank, plan.step, plan.signature, false, std::move(plan.tensors), {}};
      plan.tensors.clear();
    }
    if (!trainer_state.empty() && forming_->trainer_state.empty()) forming_->trainer_state = std::move(trainer_state);
    slot = std::move(plan);
    forming_->promises[static_cast<std::size_t>(rank)] = promise;
    if (++forming_->arrived == options_.world_size) complete_forming();
  }

  /// A plan held while a failed save of its step drains.
  struct Deferred {
    LocalPlan plan;
    std::string trainer_state;
    caf::typed_response_promise<WriteAssignment> promise;
  };

  /// The failed step's writers stopped: its folder goes, and the plans held for it are taken.
  void drain_ended() {
    remove_failed();
    auto deferred = std::move(deferred_);
    deferred_.clear();
    for (auto& d : deferred) take_plan(std::move(d.plan), std::move(d.trainer_state), std::move(d.promise));
  }

  void fail_deferred(const Status& why) {
    for (auto& d : deferred_) d.promise.deliver(to_caf_error(why));
    deferred_.clear();
  }

  void begin_forming(std::int64_t step) {
    forming_.emplace();
    forming_->step = step;
    forming_->id = ++formings_;
    forming_->plans.resize(static_cast<std::size_t>(options_.world_size));
    forming_->promises.resize(static_cast<std::size_t>(options_.world_size));
    if (auto failed = outcomes_.find(step); failed != outcomes_.end() && !failed->second.is_ok()) {
      forming_->superseded = failed->second.status();
      const std::set<int>& untold = untold_[step];
      for (int r = 0; r < options_.world_size; ++r) {
        if (untold.count(r) == 0) forming_->again.insert(r);
      }
    }
    outcomes_.erase(step);
    untold_.erase(step);
    delayed_send(this, options_.plan_timeout, timeout_atom::value, step, forming_->id);
  }

  std::string ranks_in_forming() const {
    std::string ranks;
    for (std::size_t r = 0; r < forming_->plans.size(); ++r) {
      if (forming_->plans[r]) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    }
    return (ranks.find(',') == std::string::npos ? "rank " : "ranks ") + ranks;
  }

  /// Fails the forming step; `also_told` are ranks answered by the caller.
  void fail_forming(const Status& why, std::set<int> also_told = {}) {
    const std::int64_t step = forming_->step;
    std::set<int> told = std::move(also_told);
    for (std::size_t r = 0; r < forming_->promises.size(); ++r) {
      auto& promise = forming_->promises[r];
      if (!promise) continue;
      promise->deliver(to_caf_error(why));
      told.insert(static_cast<int>(r));
    }
    forming_.reset();
    record_failure(step, why, told);
  }

  void complete_forming() {
    Forming forming = std::move(*forming_);
    forming_.reset();
    auto assigned = global_plan(forming);
    Status st = assigned.status();
    std::string policy;
    if (st.is_ok()) {
      auto prepared = store_.prepare(forming.step);
      st = prepared.status();
      if (st.is_ok()) policy = *prepared;
    }
    // The trainer state is written at the commit, not here: here the ranks wait for their
    // assignment (an async save's stall), and a file's fsync on a disk busy with the last save's
    // write-back can take longer than the whole snapshot.
    trainer_state_ = std::move(forming.trainer_state);
    commit_ran_ = false;
    if (!st.is_ok()) {
      for (auto& promise : forming.promises) promise->deliver(to_caf_error(st));
      record_failure(forming.step, st, every_rank());
      return;
    }
    open_step_ = forming.step;
    ++opening_;
    reports_.clear();
    reported_.clear();
    if (options_.write_timeout.count() > 0) {
      delayed_send(this, options_.write_timeout, write_timeout_atom::value, forming.step, opening_);
    }
    for (std::size_t r = 0; r < forming.plans.size(); ++r) {
      forming.promises[r]->deliver(WriteAssignment{policy, assigned->writes[r]});
    }
  }

  /// The global plan of `forming`, the last one again while no rank's structure changed.
  Result<GlobalPlan> global_plan(const Forming& forming) {
    std::vector<const LocalPlan*> plans;
    std::vector<std::uint64_t> structure;
    for (std::size_t r = 0; r < forming.plans.size(); ++r) {
      // The rank's descriptors (known_) with this save's step and objects.
      LocalPlan& known = *known_[r];
      known.step = forming.plans[r]->step;
      known.objects = forming.plans[r]->objects;
      plans.push_back(&known);
      structure.push_back(known.signature);
    }
    if (last_plan_ && last_plan_->signatures == structure) return *last_plan_;
    SH_ASSIGN_OR_RETURN(GlobalPlan plan, make_global_plan(plans));
    last_plan_ = plan;
    return plan;
  }

  void on_rank_saved(RankSaveReport report) {
    if (draining_ && draining_->step == report.step && open_step_ != report.step) {
      stopped_writing(report.rank);
      return;
    }
    if (open_step_ != report.step) {
      logger()->warn("coordinator: ignoring rank {}'s report for step {}, which is not being saved", report.rank,
                     report.step);
      return;
    }
    reported_.insert(report.rank);
    if (!report.status.is_ok()) {
      finish(report.step, report.status.with_context("rank " + std::to_string(report.rank)));
      return;
    }
    reports_.push_back(std::move(report));
    if (static_cast<int>(reports_.size()) < options_.world_size) return;
    const std::int64_t step = *open_step_;
    const auto start = Clock::now();
    const double cpu_start = thread_cpu_seconds();
    auto committed = commit(step);
    if (committed.is_ok()) {
      committed->commit_s = std::chrono::duration<double>(Clock::now() - start).count();
      committed->commit_cpu_s = thread_cpu_seconds() - cpu_start;
    }
    finish(step, std::move(committed));
  }

  Result<CommitInfo> commit(std::int64_t step) {
    // The reports name their chunks' tensors by index into the plans' descriptors, held here.
    std::vector<const std::vector<ShardedTensorDesc>*> planned;
    for (const auto& known : known_) planned.push_back(known ? &known->tensors : nullptr);
    SH_ASSIGN_OR_RETURN(auto metadata,
                        gather_reports(step, reports_, options_.world_size, descriptors_by_rank(std::move(planned))));
    // A failed commit removes what it must itself: after the rename the step stays in place.
    commit_ran_ = true;
    if (!trainer_state_.empty()) {
      auto written = store_.write_trainer_state(step, trainer_state_);
      if (!written.is_ok()) {
        (void)store_.abort(step);
        return written.status();
      }
      metadata.trainer_state = *written;
    }
    SH_ASSIGN_OR_RETURN(CommitReport written, store_.commit(step, metadata));
    CommitInfo info;
    info.step = step;
    info.files = written.files;
    info.bytes = written.bytes;
    // Each phase of the slowest rank, so that a slow save explains itself.
    for (const auto& r : reports_) {
      info.phases.take_max(r.phases);
      info.ranks_cpu_s += r.cpu_s;
    }
    return info;
  }

  void finish(std::int64_t step, Result<CommitInfo> outcome) {
    trainer_state_.clear();  // a fully-async trainer's may be large
    if (outcome.is_ok()) {
      const CommitInfo& c = *outcome;
      logger()->info("committed checkpoint step {} in '{}' (copy_s {:.3f} hash_s {:.3f} write_s {:.3f} fsync_s {:.3f} "
                     "upload_s {:.3f} commit_s {:.3f} commit_cpu_s {:.3f})",
                     step, store_.root(), c.phases.copy_s, c.phases.hash_s, c.phases.write_s, c.phases.fsync_s,
                     c.phases.upload_s, c.commit_s, c.commit_cpu_s);
    } else if (!commit_ran_) {
      // Ranks may still be writing into the step's folder: it is removed once every rank has
      // reported or died (or after the drain limit), never under a writer.
      if (draining_) {
        fail_deferred(Status{ErrorCode::aborted, "step " + std::to_string(draining_->step) +
                                                     " could not be saved again: step " + std::to_string(step) +
                                                     " failed before its last writers stopped"});
        remove_failed();
      }
      draining_ = Draining{step, opening_, {}};
      for (int r = 0; r < options_.world_size; ++r) {
        if (!reported(r) && dead_.count(r) == 0) draining_->writing.insert(r);
      }
      if (draining_->writing.empty()) {
        remove_failed();
      } else {
        delayed_send(this, drain_limit(), drained_atom::value, step, opening_);
      }
    }
    open_step_.reset();
    reports_.clear();
    if (!outcome.is_ok()) {
      // Every rank planned the open step: each hears of its failure.
      record_failure(step, outcome.status(), every_rank());
      return;
    }
    outcomes_.insert_or_assign(step, outcome);
    answer_waiters(step);
  }

  /// Records that `step` failed; the ranks not in `told` (they had not begun it) are answered
  /// with the failure when they do, and the others begin it again.
  void record_failure(std::int64_t step, const Status& why, const std::set<int>& told) {
    const Status outcome = why.with_context("checkpoint step " + std::to_string(step) + " not committed");
    logger()->error("{}", outcome.message());
    outcomes_.insert_or_assign(step, Result<CommitInfo>(outcome));
    auto& untold = untold_[step];
    untold.clear();
    for (int r = 0; r < options_.world_size; ++r) {
      if (told.count(r) == 0) untold.insert(r);
    }
    answer_waiters(step);
  }

  std::set<int> every_rank() const {
    std::set<int> all;
    for (int r = 0; r < options_.world_size; ++r) all.insert(r);
    return all;
  }

  void answer_waiters(std::int64_t step) {
    const Result<CommitInfo>& outcome = outcomes_.at(step);
    for (auto& promise : waiters_[step]) {
      if (outcome.is_ok()) {
        promise.deliver(*outcome);
      } else {
        promise.deliver(to_caf_error(outcome.status()));
      }
    }
    waiters_.erase(step);
  }

  /// A failed step whose folder waits for its last writers to stop.
  struct Draining {
    std::int64_t step = 0;
    std::uint64_t opening = 0;
    std::set<int> writing;
  };

  /// Whether `rank` reported on the open step (it no longer writes into it).
  bool reported(int rank) const { return reported_.count(rank) != 0; }

  std::chrono::milliseconds drain_limit() const {
    return options_.write_timeout.count() > 0 ? options_.write_timeout : options_.plan_timeout;
  }

  static std::string seconds(std::chrono::milliseconds limit) {
    std::ostringstream out;
    out << static_cast<double>(limit.count()) / 1000.0 << " s";
    return out.str();
  }

  std::string draining_ranks() const {
    return rank_phrase(std::vector<int>(draining_->writing.begin(), draining_->writing.end()));
  }

  /// "rank 3", "ranks 1, 3".
  static std::string rank_phrase(const std::vector<int>& ranks) {
    std::string out = ranks.size() == 1 ? "rank " : "ranks ";
    for (std::size_t i = 0; i < ranks.size(); ++i) out += (i == 0 ? "" : ", ") + std::to_string(ranks[i]);
    return out;
  }

  void stopped_writing(int rank) {
    draining_->writing.erase(rank);
    if (draining_->writing.empty()) drain_ended();
  }

  /// Removes what the draining step left.
  void remove_failed() {
    const std::int64_t step = draining_->step;
    draining_.reset();
    if (Status removed = store_.abort(step); !removed.is_ok()) {
      logger()->warn("cannot remove what uncommitted step {} left now ({}); the next start cleans it", step,
                     removed.message());
    }
  }

  CoordinatorOptions options_;
  CheckpointStore store_;
  /// Each rank's last full local plan, for the plans that refer to it by signature: the only
  /// copy of its descriptors (the forming plans hold none), which the commit reads.
  std::vector<std::optional<LocalPlan>> known_;
  std::optional<GlobalPlan> last_plan_;
  std::optional<Forming> forming_;
  std::optional<std::int64_t> open_step_;
  /// The open step's trainer_state.json, written at its commit (empty: none).
  std::string trainer_state_;
  /// The store's commit of the open step ran (and cleaned up after itself if it failed).
  bool commit_ran_ = false;
  std::vector<RankSaveReport> reports_;
  /// The ranks that reported on the open step, with or without success.
  std::set<int> reported_;
  /// Counts the steps opened, so that a late limit of an earlier opening is ignored.
  std::uint64_t opening_ = 0;
  std::optional<Draining> draining_;
  std::map<std::int64_t, Result<CommitInfo>> outcomes_;
  /// For each failed step, the ranks that had not begun it when it failed: the first plan of
  /// each is answered with the failure ("too late"); a told rank's plan begins the step again.
  std::map<std::int64_t, std::set<int>> untold_;
  /// Plans of a step whose failed save still drains, taken once it has.
  std::vector<Deferred> deferred_;
  /// Counts the formings begun.
  std::uint64_t formings_ = 0;
  std::map<std::int64_t, std::vector<caf::typed_response_promise<CommitInfo>>> waiters_;
  /// Ranks reported down, with why.
  std::map<int, std::string> dead_;
};

}  // namespace

coordinator_actor spawn_checkpoint_coordinator(caf::actor_system& system, CoordinatorOptions options) {
  // Not detached: see the header.
  return system.spawn<CheckpointCoordinator>(std::move(options));
}

}  // namespace stagehand
