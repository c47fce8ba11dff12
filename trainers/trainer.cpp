#include "trainers/trainer.hpp"

#include <caf/all.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "actors/messages.hpp"
#include "core/host_buffer.hpp"
#include "models/model.hpp"
#include "strategy/format.hpp"
#include "strategy/loader.hpp"
#include "trainers/checkpoint_policy.hpp"

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
        policy_(options_.config.trainer),
        timeout_(std::chrono::minutes(30)) {}

  void act() override {
    summary_->status = run();
    if (!summary_->status.is_ok() && options_.progress) {
      std::fprintf(stderr, "stagehand-train: %s\n", summary_->status.message().c_str());
    }
  }

 protected:
  virtual Objective objective() const = 0;
  virtual const char* name() const = 0;

 private:
  Status run() {
    const auto& t = options_.config.trainer;
    if (!options_.metrics_out.empty()) {
      metrics_.open(options_.metrics_out, std::ios::trunc);
      if (!metrics_) return Status::from_errno(errno, "cannot write --metrics-out '" + options_.metrics_out + "'");
    }
    SH_RETURN_IF_ERROR(policy_.clean_interrupted_saves());
    std::int64_t step = 0;
    SH_ASSIGN_OR_RETURN(auto resume, policy_.resume_dir());
    if (resume) {
      SH_ASSIGN_OR_RETURN(TrainerState state, read_trainer_state(*resume));
      if (state.kind != name()) {
        return {ErrorCode::invalid_argument, "checkpoint '" + *resume + "' was written by the " + state.kind +
                                                 " trainer, not " + name()};
      }
      SH_RETURN_IF_ERROR(call_void(caf::make_message(load_atom::value, *resume)).with_context("resume"));
      step = state.step;
      say("resumed from %s at step %lld\n", resume->c_str(), static_cast<long long>(step));
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
      auto metrics = train(step);
      if (!metrics.is_ok()) return metrics.status().with_context("step " + std::to_string(step));
      auto accuracy = evaluate();
      if (!accuracy.is_ok()) return accuracy.status().with_context("evaluation at step " + std::to_string(step));
      summary_->last_step = step;
      summary_->last_accuracy = *accuracy;
      double rate = double(step - summary_->first_step + 1) /
                    std::max(1e-9, std::chrono::duration<double>(Clock::now() - started).count());
      write_metrics({{"type", "step"}, {"step", step}, {"accuracy", *accuracy},
                     {objective() == Objective::rl ? "reward" : "loss",
                      objective() == Objective::rl ? metrics->first : metrics->second}});
      if (policy_.should_save(step)) {
        SH_RETURN_IF_ERROR(save(step));
        saved_step = step;
      }
      if (step % 10 == 0 || step == t.total_steps) {
        say("step %lld/%lld %s %.4f acc %.3f %.1f steps/s | last save: %s\n", static_cast<long long>(step),
            static_cast<long long>(t.total_steps), objective() == Objective::rl ? "reward" : "loss",
            objective() == Objective::rl ? metrics->first : metrics->second, *accuracy, rate, last_save_.c_str());
      }
    }
    if (summary_->stopped_by_signal && saved_step != step && step > 0) {
      say("stop requested: saving step %lld before exiting\n", static_cast<long long>(step));
      SH_RETURN_IF_ERROR(save(step));
      summary_->signal_save_step = step;
    } else if (summary_->stopped_by_signal) {
      summary_->signal_save_step = saved_step;
    }
    // End of training: every save is finished before the trainer reports done.
    SH_RETURN_IF_ERROR(finalize());
    return Status::ok();
  }

  Result<std::pair<double, double>> train(std::int64_t step) {
    std::pair<double, double> out;
    Status st;
    request(dispatch_, timeout_, train_atom::value, step, static_cast<std::int32_t>(objective() == Objective::sft))
        .receive([&](double reward, double loss) { out = {reward, loss}; },
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

  Status call_void(const caf::message& msg) {
    Status st;
    request(dispatch_, timeout_, msg).receive([] {}, [&](caf::error& err) { st = from_caf_error(err); });
    return st;
  }

  Status save(std::int64_t step) {
    SH_RETURN_IF_ERROR(finalize());
    const auto& c = options_.config;
    TrainerState state{step, name(), c.trainer.seed, step * c.model.batch_size};
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
    pending_ = PendingSave{step, stall, async, Clock::now(), staging_memory().peak()};
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
    if (auto metadata = read_checkpoint_metadata(dir); metadata.is_ok()) {
      for (const auto& [file, meta] : metadata->files) bytes += meta.size;
    }
    write_metrics({{"type", "save"},
                   {"step", saved.step},
                   {"stall_s", saved.stall_s},
                   {"async", saved.async},
                   {"write_s", std::chrono::duration<double>(Clock::now() - saved.started).count() + saved.stall_s},
                   {"bytes", bytes},
                   {"host_staging_peak_bytes", saved.staging_peak}});
    SH_ASSIGN_OR_RETURN(auto deleted, policy_.apply_retention());
    for (auto s : deleted) say("retention: removed checkpoint step %lld\n", static_cast<long long>(s));
    return Status::ok();
  }

  void write_metrics(const nlohmann::json& line) {
    if (metrics_.is_open()) metrics_ << line.dump() << "\n" << std::flush;
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
    std::size_t staging_peak;
  };

  caf::actor dispatch_;
  TrainerOptions options_;
  std::shared_ptr<TrainerSummary> summary_;
  CheckpointPolicy policy_;
  std::chrono::milliseconds timeout_;
  std::ofstream metrics_;
  std::optional<PendingSave> pending_;
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

}  // namespace

Result<caf::actor> spawn_trainer(caf::actor_system& system, caf::actor dispatch, TrainerOptions options,
                                 std::shared_ptr<TrainerSummary> summary) {
  switch (options.config.trainer.kind) {
    case TrainerKind::sync:
      return system.spawn<SyncTrainer>(std::move(dispatch), std::move(options), std::move(summary));
    case TrainerKind::sft:
      return system.spawn<SftTrainer>(std::move(dispatch), std::move(options), std::move(summary));
    case TrainerKind::fully_async:
      break;
  }
  return Status{ErrorCode::unsupported,
                "trainer.kind fully_async is not built yet (its generators and staleness bound are the open part "
                "of issue 4); use sync or sft"};
}

}  // namespace stagehand
