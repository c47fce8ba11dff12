#pragma once
// Internal to trainers/: the loop and checkpoint policy every trainer shares. Its parts are in
// trainer_loop.cpp (the loop, steps, metrics), trainer_resume.cpp (resume and init_from) and
// trainer_saves.cpp (saves, commits, retention, exports); the trainers themselves choose the
// objective and, for the fully-async one, where samples come from. Not installed.

#include <caf/blocking_actor.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "stagehand/actors/dispatch_client.hpp"
#include "stagehand/checkpoint/format/trainer_state.hpp"
#include "stagehand/checkpoint/interop/export.hpp"
#include "stagehand/checkpoint/tiers/tier_copy.hpp"
#include "stagehand/trainers/background_steps.hpp"
#include "stagehand/trainers/checkpoint_policy.hpp"
#include "stagehand/trainers/trainer.hpp"

namespace stagehand {

/// The loop and checkpoint policy shared by the trainers; subclasses choose the objective.
///
/// Thread-safety: an actor; everything runs on its own thread.
class TrainerBase : public caf::blocking_actor {
 public:
  TrainerBase(caf::actor_config& cfg, dispatch_actor dispatch, TrainerOptions options,
              std::shared_ptr<TrainerSummary> summary);

  void act() override;

 protected:
  using Clock = std::chrono::steady_clock;

  virtual Objective objective() const = 0;
  virtual const char* name() const = 0;

  // -- hooks for trainers whose samples come from elsewhere --

  /// After resume (or at a fresh start, `state` null), before the first step; `state_file` is
  /// where `state` was read, for errors.
  virtual Status on_start(std::int64_t, const TrainerState*, const std::string&) { return Status::ok(); }
  /// The behaviour actions of step `step`'s batch; empty: sampled on-policy by the Workers.
  virtual Result<std::vector<std::int32_t>> batch_actions(std::int64_t) { return std::vector<std::int32_t>{}; }
  /// After step `step` trained.
  virtual Status after_step(std::int64_t) { return Status::ok(); }
  /// Adds to the trainer state saved with the checkpoint of `step`.
  virtual Status fill_state(std::int64_t, TrainerState&) { return Status::ok(); }
  /// Adds to the metrics line of `step`.
  virtual void fill_metrics(std::int64_t, nlohmann::json&) {}
  /// Last call, after the final finalize.
  virtual void on_stop() {}

  /// Whether the trainer pushes the weights itself (the fully-async trainer, to its generators);
  /// otherwise, with a weight_sync.channel, every step's weights are pushed after the step.
  virtual bool pushes_weights_itself() const { return false; }

  /// Receivers outside the run each push waits for (weight_sync.receivers).
  std::int32_t outside_receivers() const {
    return static_cast<std::int32_t>(options_.config.weight_sync.receivers);
  }

  const TrainerOptions& options() const { return options_; }
  DispatchClient& client() { return client_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  /// One warning line on stderr, whatever --quiet says.
  template <class... Ts>
  void warn(const char* format, Ts... args) {
    std::fprintf(stderr, "stagehand-train: warning: ");
    std::fprintf(stderr, format, args...);
    std::fflush(stderr);
  }

  /// One progress line on stdout, unless --quiet.
  template <class... Ts>
  void say(const char* format, Ts... args) {
    if (options_.progress) {
      std::printf(format, args...);
      std::fflush(stdout);
    }
  }

 private:
  /// The save the trainer waits to see committed.
  struct PendingCommit {
    std::int64_t step;
    double stall_s;
    bool async;
    Clock::time_point started;
    /// Waits at the fence for this save's background staging, summed over the steps after it.
    double fence_wait_s;
  };

  // -- the loop (trainer_loop.cpp) --

  /// run(), with any exception that code underneath lets out turned into the trainer's error: an
  /// exception leaving act() would end the actor with the summary still saying ok.
  Status run_catching();
  Status run();
  /// Trains from `step` + 1 to the last step (or a stop); the last step trained.
  Result<std::int64_t> train_steps(std::int64_t step);
  /// With a weight_sync.channel (and a trainer that does not push itself), pushes the weights of
  /// `step` to the receivers: before the first step and after each one, so that the rollout
  /// that follows can use them.
  Status push_weights(std::int64_t step);
  void write_metrics(const nlohmann::json& line);

  // -- where training starts (trainer_resume.cpp) --

  /// Resumes from `dir`, or starts afresh (init_from when set) without one. Committed steps in
  /// `rejected` may be replaced by the run's saves (CheckpointPolicy::check_resume).
  /// @return the step training continues after.
  Result<std::int64_t> start_from(const std::optional<std::string>& dir, const std::set<std::int64_t>& rejected = {});
  /// A committed step resume_mode latest may start from, and its tier ("local", "durable";
  /// empty without a local tier).
  struct Candidate {
    std::int64_t step;
    std::string dir;
    std::string tier;
  };
  /// What resume_mode latest may start from: the committed steps of every tier up to the one its
  /// tracker names, newest first (the local tier's first at the same step), and why a tracker's
  /// own step is not among them.
  struct Candidates {
    std::vector<Candidate> steps;
    std::vector<std::string> stale;
  };
  Result<Candidates> resume_candidates() const;
  /// resume_mode latest, checking before it trusts: resumes the newest of `found` that loads
  /// whole (every chunk read is checked, and the trainer state), saying which steps it rejected
  /// and why; a step whose load fails as corrupt or missing (not for other errors, such as a
  /// model that does not match) is passed over for the next older one, in its tier or the
  /// other. Each step of each tier is tried once.
  /// @return the step training continues after; an error naming every rejected step when none
  ///         loads.
  Result<std::int64_t> resume_latest(const Candidates& found);
  /// Before a checkpoint of a local tier spread over host folders is trusted: every file has a
  /// copy that verifies (check_host_copies), damaged copies are rewritten, and parts read from
  /// replicas and repairs are reported. corruption naming the part when one has no good copy.
  Status check_host_folders(const std::string& dir);
  /// A fresh run's start from another checkpoint's weights (trainer.init_from).
  Status init_from(const std::string& path);
  /// Loads `scope` of `dir` on every rank through the dispatch; where the time went, and what
  /// was missing or unused (each said in one warning line).
  Result<LoadReport> load_everywhere(const std::string& dir, const LoadScope& scope, const char* what);
  static std::string describe_layout(const TrainerState& state);

  // -- saves (trainer_saves.cpp) --

  /// Saves `step` (after the pending save committed), with its trainer state.
  Status save(std::int64_t step);
  /// Waits for the pending save (if any) to commit, then records it and applies retention.
  Status finalize();
  /// The metrics line, exports and retention of a commit.
  Status on_committed(const CommitInfo& commit);
  /// Deletes the checkpoints retention does not keep, saying which.
  Status apply_retention();
  /// Queues the exports owed by committed steps up to `step`, the step resumed (a run stopped
  /// or killed before it did them).
  Status export_owed(std::int64_t step);
  /// Says how the exports that ended went: a line and a metrics line each.
  void report_exports();
  /// At the end of the run: waits for the jobs of `steps` (the exports or the uploads) as long
  /// as they move: gives up on a job that asked for no piece of its work for `still_limit` (a
  /// file system that no longer answers; none: no limit, where every call has one of its own),
  /// marks the run's background work hung (no retention touches those folders again) and
  /// returns that job's step; act() then leaves it behind at once (BackgroundSteps::stop).
  template <class Report>
  std::optional<std::int64_t> wait_background(BackgroundSteps<Report>& steps,
                                              std::optional<std::chrono::milliseconds> still_limit) {
    const auto stalled = steps.wait_idle(still_limit);
    if (stalled) background_hung_ = true;
    return stalled;
  }
  /// The limit on a background job's lack of progress for its writes under `root`:
  /// trainer.call_timeout_s, except into an object store, where a file's upload is one piece of
  /// any length and each of its requests has limits of its own (storage.s3). Asked once, when
  /// the jobs are set up (the folder answered then): a hung mount would not answer later.
  std::optional<std::chrono::milliseconds> still_limit_for(const std::string& root) const;
  /// The two kinds of background job, for what is said of one that hangs.
  enum class BackgroundJob { export_hf, upload };
  /// What is said of the `job` of `step` that hangs: `how` it hangs (made no progress, or left
  /// behind in a call), where it was writing, and what stays owed.
  std::string hung_message(BackgroundJob job, std::int64_t step, const std::string& how) const;
  static constexpr const char* kMadeNoProgress = "made no progress for";
  static constexpr const char* kLeftBehind = "is left behind, in a call that did not return within";

  // -- the durable tier, beside a local one (trainer_tiers.cpp) --

  /// Whether `step` is saved: the local or the durable tier's interval says so.
  bool should_save(std::int64_t step) const;
  /// Local steps that retention keeps: being uploaded or queued, and owed_upload_. Older owed
  /// steps are not kept: once a newer step is in the durable tier they are of no use, so that a
  /// store that stays unreachable cannot fill the local tier.
  std::set<std::int64_t> local_steps_in_use() const;
  /// At the start, `step` the step resumed: owed_upload_ is the newest committed local step up
  /// to `step` that the durable tier's interval names, that the resume did not reject and that
  /// is newer than the step the durable tier holds; its upload is queued.
  Status upload_owed(std::int64_t step);
  /// Says how the uploads that ended went (a line and a metrics line each), and applies the
  /// durable tier's retention after those that landed.
  Status report_uploads();
  /// At the end of training: waits for the uploads; an error when the newest step owed to the
  /// durable tier did not reach it.
  Status finish_uploads();
  /// After the resume at `resumed`: the step the durable tier holds, the newest committed one up
  /// to its tracker's and to `resumed` that the resume did not reject (its tracker alone may
  /// name a step that is gone or corrupt, or an older run's later step that this run replaces).
  Status find_durable_step(std::int64_t resumed);

  TrainerOptions options_;
  std::shared_ptr<TrainerSummary> summary_;
  std::shared_ptr<FileSystem> fs_;
  CheckpointPolicy policy_;
  std::chrono::milliseconds timeout_;
  DispatchClient client_;
  std::ofstream metrics_;
  std::optional<PendingCommit> pending_;
  /// trainer.export_interval's exports; null when it is 0.
  std::unique_ptr<BackgroundSteps<ExportReport>> exports_;
  /// With a local tier (policy_ is then the local tier's): the durable tier, the copies into it,
  /// and the step its tracker names (-1: none).
  std::optional<CheckpointPolicy> durable_;
  /// The copies into the durable tier. When the run ends, the one running stops at its next
  /// piece (the local tier keeps its step, and a resume uploads it), so that a stop does not
  /// wait on a store; a signal (options().stop_requested) stops it too.
  std::unique_ptr<BackgroundSteps<TierCopyReport>> uploads_;
  /// still_limit_for the export path and the durable tier.
  std::optional<std::chrono::milliseconds> export_still_limit_;
  std::optional<std::chrono::milliseconds> upload_still_limit_;
  /// An export or upload stopped moving, or was left behind: nothing touches the folders they
  /// write any more (no retention), so that the end of the run cannot hang there.
  bool background_hung_ = false;
  std::int64_t durable_step_ = -1;
  /// The newest committed local step the durable tier lacks and should get (its interval names
  /// it): set by upload_owed at the start and by each such commit, cleared when an upload of it
  /// or of a newer step lands; a failed upload leaves it. Local steps beyond the step resumed (an
  /// older run's, with trainer.overwrite_checkpoints) are never owed.
  std::optional<std::int64_t> owed_upload_;
  /// The local tier's host folders lack the record of this run's placement
  /// (check_host_record): written after the first commit.
  bool host_record_owed_ = false;
  /// Why the last upload that failed did, for the end of the run.
  std::string upload_error_;
  /// Steps resume_mode latest rejected as corrupt, by tier: they are not owed, and not what
  /// the durable tier holds.
  std::set<std::int64_t> rejected_local_;
  std::set<std::int64_t> rejected_durable_;
  std::string last_save_ = "none";
};

}  // namespace stagehand
