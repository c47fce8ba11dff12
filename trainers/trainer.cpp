#include "stagehand/trainers/trainer.hpp"

#include <caf/all.hpp>

#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "stagehand/actors/dispatch_client.hpp"
#include "stagehand/actors/messages.hpp"
#include "stagehand/actors/model.hpp"
#include "stagehand/checkpoint/format.hpp"
#include "stagehand/checkpoint/checkpoint_reader.hpp"
#include "stagehand/checkpoint/loader.hpp"
#include "stagehand/checkpoint/resolve.hpp"
#include "stagehand/checkpoint/trainer_state.hpp"
#include "stagehand/checkpoint/report_codec.hpp"
#include "stagehand/core/host_buffer.hpp"
#include "stagehand/trainers/background_export.hpp"
#include "stagehand/trainers/checkpoint_policy.hpp"
#include "stagehand/trainers/generator.hpp"

namespace stagehand {

namespace {

using Clock = std::chrono::steady_clock;

/// The loop and checkpoint policy shared by the trainers; subclasses choose the objective.
class TrainerBase : public caf::blocking_actor {
 public:
  TrainerBase(caf::actor_config& cfg, caf::actor dispatch, TrainerOptions options,
              std::shared_ptr<TrainerSummary> summary)
      : caf::blocking_actor(cfg),
        dispatch_(std::move(dispatch)),
        options_(std::move(options)),
        summary_(std::move(summary)),
        fs_(options_.file_system),
        policy_(options_.config.trainer, fs_),
        timeout_(std::chrono::seconds(options_.config.trainer.call_timeout_s)) {}

  void act() override {
    summary_->status = run_catching();
    on_stop();
    if (!summary_->status.is_ok()) {
      if (summary_->stopped_by_signal) {
        if (auto tracked = policy_.tracked_step(); tracked.is_ok()) summary_->tracked_step = *tracked;
      }
      std::fprintf(stderr, "stagehand-train: %s\n", summary_->status.message().c_str());
    }
  }

 protected:
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

  const TrainerOptions& options() const { return options_; }
  caf::actor& dispatch() { return dispatch_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  /// Loads `scope` of `dir` on every rank through the dispatch; where the time went, and what
  /// was missing or unused (each said in one warning line).
  Result<LoadReport> load_checkpoint_everywhere(const std::string& dir, const LoadScope& scope, const char* what) {
    Result<LoadReport> reply = LoadReport{};
    request(dispatch_, timeout_, load_atom::value, dir, encode_load_scope(scope))
        .receive([&](double load_s, double read_s, double verify_s, double copy_s, std::uint64_t bytes,
                     const std::string& notes) { reply = decode_load_reply(load_s, read_s, verify_s, copy_s, bytes, notes); },
                 [&](caf::error& err) { reply = from_caf_error(err); });
    if (!reply.is_ok()) {
      return reply.status().with_context(std::string(what) + (scope.strict ? "" : " (trainer.load_strict: false)"));
    }
    LoadReport load = std::move(*reply);
    auto names = [](const std::vector<std::string>& list) {
      std::string out;
      for (std::size_t i = 0; i < list.size() && i < 8; ++i) out += (i ? ", " : "") + list[i];
      if (list.size() > 8) out += " and " + std::to_string(list.size() - 8) + " more";
      return out;
    };
    if (!load.missing_tensors.empty()) {
      warn("%s: %zu tensor(s) not in '%s', left as initialized (trainer.load_strict: false): %s\n", what,
           load.missing_tensors.size(), dir.c_str(), names(load.missing_tensors).c_str());
    }
    if (!load.unused_tensors.empty() && scope.strict) {
      return Status{ErrorCode::invalid_argument,
                    std::string(what) + ": '" + dir + "' holds " + std::to_string(load.unused_tensors.size()) +
                        " tensor(s) the model does not have: " + names(load.unused_tensors) +
                        " (trainer.load_strict: false loads without them)"};
    }
    if (!load.unused_tensors.empty() && !scope.strict) {
      warn("%s: %zu tensor(s) of '%s' that the model does not have were ignored (trainer.load_strict: false): %s\n",
           what, load.unused_tensors.size(), dir.c_str(), names(load.unused_tensors).c_str());
    }
    std::vector<std::string> rng;
    std::vector<std::string> objects;
    for (const auto& name : load.missing_objects) (name.starts_with("rng.") ? rng : objects).push_back(name);
    if (!objects.empty()) {
      warn("%s: %zu object(s) not in '%s', left as initialized (trainer.load_strict: false): %s\n", what,
           objects.size(), dir.c_str(), names(objects).c_str());
    }
    if (!rng.empty() && scope.rng) {
      warn("%s: '%s' has no RNG state for %s (saved by fewer ranks): re-derived from trainer.seed, the step "
           "and the rank\n",
           what, dir.c_str(), names(rng).c_str());
    }
    return load;
  }

  Status call_void(const caf::message& msg) {
    Status st;
    request(dispatch_, timeout_, msg).receive([] {}, [&](caf::error& err) { st = from_caf_error(err); });
    return st;
  }

 private:
  /// run(), with any exception that code underneath lets out turned into the trainer's error: an
  /// exception leaving act() would end the actor with the summary still saying ok.
  Status run_catching() {
    try {
      return run();
    } catch (const std::exception& e) {
      return {ErrorCode::internal, std::string("the ") + name() + " trainer stopped on an exception: " + e.what()};
    }
  }

  Status run() {
    const auto& t = options_.config.trainer;
    if (!options_.metrics_out.empty()) {
      metrics_.open(options_.metrics_out, std::ios::trunc);
      if (!metrics_) return Status::from_errno(errno, "cannot write --metrics-out '" + options_.metrics_out + "'");
    }
    std::int64_t step = 0;
    SH_RETURN_IF_ERROR(policy_.check_destination());
    // Before anything is cleaned: another run's .tmp folder is its save in flight.
    SH_ASSIGN_OR_RETURN(summary_->root_lock, policy_.lock_destination());
    SH_ASSIGN_OR_RETURN(auto resume, policy_.resume_dir());
    if (!resume) {
      SH_RETURN_IF_ERROR(policy_.check_fresh_start());
      if (t.resume_mode == ResumeMode::latest) {
        say("resume_mode latest: nothing to resume in '%s' (no tracker); starting from step 1\n", t.ckpt_path.c_str());
      }
    }
    SH_RETURN_IF_ERROR(policy_.clean_interrupted_saves());
    if (t.export_interval > 0) exports_ = std::make_unique<BackgroundExports>(ExportOptions{}, fs_);
    if (resume) {
      SH_ASSIGN_OR_RETURN(TrainerState state, read_trainer_state(*fs_, *resume));
      const std::string state_file = *resume + "/" + kTrainerStateFile;
      if (state.kind.empty()) return {ErrorCode::corruption, "'" + state_file + "': field 'kind' is missing"};
      if (state.kind != name()) {
        return {ErrorCode::invalid_argument,
                "checkpoint '" + *resume + "' was written by the " + state.kind + " trainer, not " + name() +
                    ": it cannot be resumed by this one. To start a " + name() +
                    " run from its weights, set trainer.init_from: '" + *resume + "' with trainer.resume_mode: none"};
      }
      if (state.step > t.total_steps) {
        return {ErrorCode::invalid_argument, "checkpoint '" + *resume + "' is at step " + std::to_string(state.step) +
                                                 ", beyond trainer.total_steps " + std::to_string(t.total_steps)};
      }
      const LoadScope scope{t.load_optimizer.value_or(true), t.load_rng.value_or(true), t.load_strict};
      SH_ASSIGN_OR_RETURN(LoadReport load, load_checkpoint_everywhere(*resume, scope, "resume"));
      step = state.step;
      say("resumed from %s at step %lld, saved %s (load %.3f s, %llu bytes; slowest rank's thread-seconds: read "
          "%.3f, verify %.3f, copy %.3f)\n",
          resume->c_str(), static_cast<long long>(step), describe_layout(state).c_str(), load.total_s,
          static_cast<unsigned long long>(load.bytes), load.read_s, load.verify_s, load.copy_s);
      SH_RETURN_IF_ERROR(on_start(step, &state, state_file));
    } else {
      if (!t.init_from.empty()) SH_RETURN_IF_ERROR(init_from(t.init_from));
      SH_RETURN_IF_ERROR(on_start(step, nullptr, ""));
    }
    summary_->first_step = step + 1;
    summary_->last_step = step;
    auto started = Clock::now();
    std::int64_t saved_step = step;
    while (step < t.total_steps) {
      if (options_.stop_requested && options_.stop_requested->load()) {
        summary_->stopped_by_signal = true;
        break;
      }
      ++step;
      auto actions = batch_actions(step);
      if (!actions.is_ok()) return actions.status().with_context("step " + std::to_string(step));
      auto metrics = train(step, *actions);
      if (!metrics.is_ok()) return metrics.status().with_context("step " + std::to_string(step));
      summary_->total_fence_wait_s += metrics->fence_wait_s;
      if (pending_) pending_->fence_wait_s += metrics->fence_wait_s;
      SH_RETURN_IF_ERROR(after_step(step));
      auto accuracy = evaluate();
      if (!accuracy.is_ok()) return accuracy.status().with_context("evaluation at step " + std::to_string(step));
      summary_->last_step = step;
      summary_->last_accuracy = *accuracy;
      report_exports();
      double rate = double(step - summary_->first_step + 1) /
                    std::max(1e-9, std::chrono::duration<double>(Clock::now() - started).count());
      nlohmann::json line{{"type", "step"}, {"step", step}, {"accuracy", *accuracy},
                          {objective() == Objective::rl ? "reward" : "loss",
                           objective() == Objective::rl ? metrics->reward : metrics->loss},
                          {"fence_wait_s", metrics->fence_wait_s}};
      fill_metrics(step, line);
      write_metrics(line);
      if (policy_.should_save(step)) {
        SH_RETURN_IF_ERROR(save(step));
        saved_step = step;
      }
      if (step % 10 == 0 || step == t.total_steps) {
        say("step %lld/%lld %s %.4f acc %.3f %.1f steps/s | last save: %s\n", static_cast<long long>(step),
            static_cast<long long>(t.total_steps), objective() == Objective::rl ? "reward" : "loss",
            objective() == Objective::rl ? metrics->reward : metrics->loss, *accuracy, rate, last_save_.c_str());
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
    // End of training: every save is finished before the trainer reports done, and so is every
    // export, unless a signal asked to stop (then the export running now ends with the trainer,
    // and the queued ones are dropped).
    SH_RETURN_IF_ERROR(finalize());
    if (exports_ && !summary_->stopped_by_signal) {
      exports_->wait_idle();
      report_exports();
    }
    return Status::ok();
  }

  /// Says how the exports that ended went: a line and a metrics line each. A failed export is
  /// reported, not fatal: the checkpoint it read is untouched.
  void report_exports() {
    if (!exports_) return;
    for (const auto& done : exports_->take_done()) {
      nlohmann::json line{{"type", "export"}, {"step", done.step}, {"path", done.out_dir}, {"ok", done.status.is_ok()},
                          {"export_s", done.report.total_s}, {"bytes", done.report.bytes}, {"files", done.report.files}};
      if (done.status.is_ok()) {
        ++summary_->exports_done;
        say("exported step %lld to %s (%llu files, %llu bytes, %.3f s)\n", static_cast<long long>(done.step),
            done.out_dir.c_str(), static_cast<unsigned long long>(done.report.files),
            static_cast<unsigned long long>(done.report.bytes), done.report.total_s);
      } else {
        ++summary_->exports_failed;
        line["error"] = done.status.message();
        warn("the export of step %lld to %s failed (the checkpoint is untouched): %s\n",
             static_cast<long long>(done.step), done.out_dir.c_str(), done.status.message().c_str());
      }
      write_metrics(line);
    }
  }

  /// A fresh run's start from another checkpoint's weights (trainer.init_from): a Stagehand
  /// checkpoint of any trainer kind and layout, or a safetensors folder. Its optimizer state and
  /// RNG only when trainer.load_optimizer / load_rng ask for them.
  Status init_from(const std::string& path) {
    const auto& t = options_.config.trainer;
    const LoadScope scope{t.load_optimizer.value_or(false), t.load_rng.value_or(false), t.load_strict};
    auto dir = resolve_checkpoint(*fs_, path);
    if (!dir.is_ok()) return dir.status().with_context("trainer.init_from");
    std::string source = "a safetensors folder";
    SH_ASSIGN_OR_RETURN(bool safetensors, is_safetensors_folder(*fs_, *dir));
    if (!safetensors) {
      auto state = read_trainer_state(*fs_, *dir);
      source = state.is_ok() ? "the " + state->kind + " trainer's step " + std::to_string(state->step) + ", saved " +
                                   describe_layout(*state)
                             : "a checkpoint without a trainer state";
    }
    SH_ASSIGN_OR_RETURN(LoadReport load, load_checkpoint_everywhere(*dir, scope, "trainer.init_from"));
    say("initialized from %s (%s): weights%s%s (load %.3f s, %llu bytes); training starts at step 1\n", dir->c_str(),
        source.c_str(), scope.optimizer ? ", optimizer state" : ", a fresh optimizer", scope.rng ? ", RNG" : "",
        load.total_s, static_cast<unsigned long long>(load.bytes));
    return Status::ok();
  }

  static std::string describe_layout(const TrainerState& state) {
    if (!state.layout) return "with an unrecorded layout";
    return "with tensor_parallel " + std::to_string(state.layout->tensor_parallel) + " x data_parallel " +
           std::to_string(state.layout->data_parallel);
  }

  Result<StepMetrics> train(std::int64_t step, const std::vector<std::int32_t>& actions) {
    StepMetrics out;
    Status st;
    request(dispatch_, timeout_, train_atom::value, step, static_cast<std::int32_t>(objective() == Objective::sft),
            actions)
        .receive([&](double reward, double loss, double fence_wait_s) { out = {reward, loss, fence_wait_s}; },
                 [&](caf::error& err) { st = from_caf_error(err); });
    if (!st.is_ok()) return st;
    return out;
  }

  Result<double> evaluate() {
    double accuracy = 0;
    Status st;
    request(dispatch_, timeout_, eval_atom::value)
        .receive([&](double a) { accuracy = a; }, [&](caf::error& err) { st = from_caf_error(err); });
    if (!st.is_ok()) return st;
    return accuracy;
  }

  Status save(std::int64_t step) {
    SH_RETURN_IF_ERROR(finalize());
    const auto& c = options_.config;
    TrainerState state{step, name(), c.trainer.seed, step * c.model.batch_size, {},
                       SavedLayout{c.parallel.tensor_parallel, c.parallel.data_parallel}};
    SH_RETURN_IF_ERROR(fill_state(step, state));
    staging_memory().reset_peak();
    Status st;
    double stall = 0;
    bool async = false;
    request(dispatch_, timeout_, save_atom::value, step, trainer_state_to_json(state))
        .receive(
            [&](double s, bool a) {
              stall = s;
              async = a;
            },
            [&](caf::error& err) { st = from_caf_error(err); });
    SH_RETURN_IF_ERROR(st.with_context("checkpoint step " + std::to_string(step)));
    summary_->total_stall_s += stall;
    pending_ = PendingSave{step, stall, async, Clock::now(), 0};
    char buf[128];
    std::snprintf(buf, sizeof(buf), "step %lld stall %.3fs %s", static_cast<long long>(step), stall,
                  async ? "async" : "sync");
    last_save_ = buf;
    if (!async) return on_committed();
    return Status::ok();
  }

  /// Waits for the pending save (if any) to commit, then records it and applies retention.
  Status finalize() {
    Status st;
    request(dispatch_, timeout_, finalize_atom::value).receive([](bool) {}, [&](caf::error& err) {
      st = from_caf_error(err);
    });
    if (!st.is_ok()) {
      pending_.reset();
      return st;
    }
    return on_committed();
  }

  Status on_committed() {
    if (!pending_) return Status::ok();
    PendingSave saved = *pending_;
    pending_.reset();
    ++summary_->checkpoints_committed;
    std::string dir = CheckpointLayout{options_.config.trainer.ckpt_path}.step_dir(saved.step);
    summary_->latest_checkpoint = dir;
    std::uint64_t bytes = 0;
    if (auto metadata = read_checkpoint_metadata(*fs_, dir); metadata.is_ok()) {
      for (const auto& [file, meta] : metadata->files) bytes += meta.size;
    }
    nlohmann::json line{{"type", "save"},
                        {"step", saved.step},
                        {"stall_s", saved.stall_s},
                        {"fence_wait_s", saved.fence_wait_s},
                        {"async", saved.async},
                        {"save_s", std::chrono::duration<double>(Clock::now() - saved.started).count() + saved.stall_s},
                        {"bytes", bytes},
                        // Through the commit: an async save's staging runs on after it returned.
                        {"host_staging_peak_bytes", staging_memory().peak()}};
    // Where the time went (the slowest rank's phases, and the commit's), so that a slow save
    // explains itself.
    request(dispatch_, timeout_, phases_atom::value, saved.step)
        .receive(
            [&](const std::string& text) {
              auto phases = nlohmann::json::parse(text, nullptr, false);
              if (phases.is_object()) line.update(phases);
            },
            [&](caf::error&) {});
    write_metrics(line);
    const auto& t = options_.config.trainer;
    if (exports_ && saved.step % t.export_interval == 0) {
      exports_->enqueue(saved.step, dir, t.export_path + "/global_step_" + std::to_string(saved.step));
    }
    SH_ASSIGN_OR_RETURN(auto deleted, policy_.apply_retention(exports_ ? exports_->steps_in_use() : std::set<std::int64_t>{}));
    for (auto s : deleted) say("retention: removed checkpoint step %lld\n", static_cast<long long>(s));
    return Status::ok();
  }

  void write_metrics(const nlohmann::json& line) {
    if (metrics_.is_open()) metrics_ << line.dump() << "\n" << std::flush;
  }

  /// One warning line on stderr, whatever --quiet says.
  template <class... Ts>
  void warn(const char* format, Ts... args) {
    std::fprintf(stderr, "stagehand-train: warning: ");
    std::fprintf(stderr, format, args...);
    std::fflush(stderr);
  }

  template <class... Ts>
  void say(const char* format, Ts... args) {
    if (options_.progress) {
      std::printf(format, args...);
      std::fflush(stdout);
    }
  }

  struct PendingSave {
    std::int64_t step;
    double stall_s;
    bool async;
    Clock::time_point started;
    /// Waits at the fence for this save's background staging, summed over the steps after it.
    double fence_wait_s;
  };

  caf::actor dispatch_;
  TrainerOptions options_;
  std::shared_ptr<TrainerSummary> summary_;
  std::shared_ptr<FileSystem> fs_;
  CheckpointPolicy policy_;
  std::chrono::milliseconds timeout_;
  std::ofstream metrics_;
  std::optional<PendingSave> pending_;
  /// trainer.export_interval's exports; null when it is 0.
  std::unique_ptr<BackgroundExports> exports_;
  std::string last_save_ = "none";
};

/// GRPO-style RL: a group of sampled actions per context, group-normalized advantages.
class SyncTrainer final : public TrainerBase {
 public:
  using TrainerBase::TrainerBase;

 protected:
  Objective objective() const override { return Objective::rl; }
  const char* name() const override { return "sync"; }
};

/// Supervised cross-entropy on the rewarding arm.
class SftTrainer final : public TrainerBase {
 public:
  using TrainerBase::TrainerBase;

 protected:
  Objective objective() const override { return Objective::sft; }
  const char* name() const override { return "sft"; }
};

/// GRPO-style RL whose actions come from generator actors. Batch s is sampled with the weights of
/// version max(0, s - 1 - L) (L = fully_async.max_staleness_steps), so generation of later
/// batches runs while the trainer trains and saves, and no sample is more than L versions behind
/// the weights it trains. The schedule is fixed, so runs (and resumes) are exactly reproducible:
/// batches generated but not yet consumed are part of the checkpoint.
class FullyAsyncTrainer final : public TrainerBase {
 public:
  using TrainerBase::TrainerBase;

 protected:
  Objective objective() const override { return Objective::rl; }
  const char* name() const override { return "fully_async"; }

  Status on_start(std::int64_t step, const TrainerState* state, const std::string& state_file) override {
    const auto& c = options().config;
    if (!options().weights) return {ErrorCode::invalid_argument, "the fully-async trainer needs a weight store"};
    staleness_ = c.fully_async.max_staleness_steps;
    for (std::int64_t g = 0; g < c.fully_async.num_generators; ++g) {
      generators_.push_back(spawn_generator(system(), c.model, c.trainer.seed, options().weights, timeout()));
    }
    if (state != nullptr) {
      if (!state->fully_async) return {ErrorCode::corruption, "'" + state_file + "': field 'fully_async' is missing"};
      SH_RETURN_IF_ERROR(check_pending_batches(*state->fully_async, state_file));
      max_seen_ = state->fully_async->max_staleness_seen;
      for (const auto& b : state->fully_async->pending_batches) ready_[b.step] = {b.version, b.actions};
    }
    SH_RETURN_IF_ERROR(call_void(caf::make_message(export_atom::value, step)));
    for (std::int64_t s = step + 1; s <= step + staleness_ + 1; ++s) {
      if (ready_.count(s) == 0) schedule(s);
    }
    return Status::ok();
  }

  Result<std::vector<std::int32_t>> batch_actions(std::int64_t step) override {
    SH_RETURN_IF_ERROR(collect(step));
    auto it = ready_.find(step);
    if (it == ready_.end()) return Status{ErrorCode::internal, "batch " + std::to_string(step) + " was never generated"};
    Batch batch = std::move(it->second);
    ready_.erase(it);
    last_version_ = batch.version;
    std::int64_t staleness = (step - 1) - batch.version;
    if (staleness > staleness_ || staleness < 0) {
      return Status{ErrorCode::internal, "batch " + std::to_string(step) + " is " + std::to_string(staleness) +
                                             " versions stale, beyond the bound " + std::to_string(staleness_)};
    }
    max_seen_ = std::max(max_seen_, staleness);
    return std::move(batch.actions);
  }

  Status after_step(std::int64_t step) override {
    SH_RETURN_IF_ERROR(call_void(caf::make_message(export_atom::value, step)));
    options().weights->drop_before(step - staleness_);
    schedule(step + staleness_ + 1);
    return Status::ok();
  }

  Status fill_state(std::int64_t step, TrainerState& state) override {
    FullyAsyncState part{staleness_, static_cast<std::int64_t>(generators_.size()), step + staleness_ + 1, max_seen_,
                         {}};
    for (std::int64_t s = step + 1; s <= step + staleness_; ++s) {
      schedule(s, true);
      SH_RETURN_IF_ERROR(collect(s));
      auto it = ready_.find(s);
      if (it != ready_.end()) part.pending_batches.push_back({s, it->second.version, it->second.actions});
    }
    state.fully_async = std::move(part);
    return Status::ok();
  }

  void fill_metrics(std::int64_t step, nlohmann::json& line) override {
    line["behaviour_version"] = last_version_;
    line["staleness"] = (step - 1) - last_version_;
  }

  void on_stop() override {
    in_flight_.clear();
    for (auto& g : generators_) send_exit(g, caf::exit_reason::user_shutdown);
  }

 private:
  struct Batch {
    std::int64_t version = 0;
    std::vector<std::int32_t> actions;
  };
  using Handle = decltype(std::declval<caf::blocking_actor&>().request(
      std::declval<caf::actor&>(), std::chrono::milliseconds{}, std::declval<caf::message&>()));
  struct InFlight {
    std::int64_t version = 0;
    std::vector<Handle> parts;
  };

  /// The saved batches must fit this run's model: the trainer hands their actions to the Workers
  /// as they are.
  Status check_pending_batches(const FullyAsyncState& part, const std::string& state_file) const {
    const auto& m = options().config.model;
    const auto expected = static_cast<std::size_t>(m.batch_size * m.group_size);
    for (std::size_t i = 0; i < part.pending_batches.size(); ++i) {
      const auto& actions = part.pending_batches[i].actions;
      const std::string field =
          "'" + state_file + "': field 'fully_async.pending_batches[" + std::to_string(i) + "].actions'";
      if (actions.size() != expected) {
        return {ErrorCode::corruption, field + " holds " + std::to_string(actions.size()) +
                                           " actions, not model.batch_size x model.group_size = " +
                                           std::to_string(expected)};
      }
      for (std::int32_t a : actions) {
        if (a < 0 || a >= m.num_arms) {
          return {ErrorCode::corruption, field + " holds action " + std::to_string(a) + ", outside 0.." +
                                             std::to_string(m.num_arms - 1) + " (model.num_arms)"};
        }
      }
    }
    return Status::ok();
  }

  /// Asks the generators for batch `step`, each for its share of the contexts. Batches past the
  /// last step are generated only for a checkpoint (`for_checkpoint`), so that a resumed run
  /// that trains further finds them exactly as an uninterrupted run would have.
  void schedule(std::int64_t step, bool for_checkpoint = false) {
    const auto& c = options().config;
    if ((step > c.trainer.total_steps && !for_checkpoint) || in_flight_.count(step) != 0 || ready_.count(step) != 0) {
      return;
    }
    const std::int64_t version = std::max<std::int64_t>(0, step - 1 - staleness_);
    const std::int64_t batch = c.model.batch_size;
    const auto n = static_cast<std::int64_t>(generators_.size());
    InFlight flight{version, {}};
    for (std::int64_t g = 0; g < n; ++g) {
      std::int64_t lo = batch * g / n;
      std::int64_t hi = batch * (g + 1) / n;
      auto msg = caf::make_message(generate_atom::value, step, version, step * batch + lo, hi - lo);
      flight.parts.push_back(request(generators_[static_cast<std::size_t>(g)], timeout(), msg));
    }
    in_flight_.emplace(step, std::move(flight));
  }

  /// Waits for batch `step` if it is being generated.
  Status collect(std::int64_t step) {
    auto it = in_flight_.find(step);
    if (it == in_flight_.end()) return Status::ok();
    Batch batch{it->second.version, {}};
    Status st;
    for (auto& part : it->second.parts) {
      part.receive([&](std::vector<std::int32_t>& actions) { batch.actions.insert(batch.actions.end(), actions.begin(), actions.end()); },
                   [&](caf::error& err) {
                     if (st.is_ok()) st = from_caf_error(err).with_context("generating batch " + std::to_string(step));
                   });
    }
    in_flight_.erase(it);
    SH_RETURN_IF_ERROR(st);
    ready_[step] = std::move(batch);
    return Status::ok();
  }

  std::int64_t staleness_ = 1;
  std::int64_t last_version_ = 0;
  std::int64_t max_seen_ = 0;
  std::vector<caf::actor> generators_;
  std::map<std::int64_t, InFlight> in_flight_;
  std::map<std::int64_t, Batch> ready_;
};

}  // namespace

Result<caf::actor> spawn_trainer(caf::actor_system& system, caf::actor dispatch, TrainerOptions options,
                                 std::shared_ptr<TrainerSummary> summary) {
  switch (options.config.trainer.kind) {
    case TrainerKind::sync:
      return system.spawn<SyncTrainer>(std::move(dispatch), std::move(options), std::move(summary));
    case TrainerKind::sft:
      return system.spawn<SftTrainer>(std::move(dispatch), std::move(options), std::move(summary));
    case TrainerKind::fully_async:
      return system.spawn<FullyAsyncTrainer>(std::move(dispatch), std::move(options), std::move(summary));
  }
  return Status{ErrorCode::invalid_argument, "unknown trainer.kind"};
}

}  // namespace stagehand
