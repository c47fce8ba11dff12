#include "stagehand/strategy/megatron_strategy.hpp"

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include <chrono>

#include "stagehand/checkpoint/load/load_group.hpp"
#include "stagehand/checkpoint/load/loader.hpp"
#include "stagehand/checkpoint/load/resolve.hpp"
#include "stagehand/checkpoint/save/global_plan.hpp"
#include "stagehand/checkpoint/save/save_engine.hpp"
#include "stagehand/core/foreground_gate.hpp"
#include "stagehand/core/log.hpp"
#include "stagehand/core/priority.hpp"
#include "stagehand/strategy/async_calls_queue.hpp"
#include "stagehand/strategy/messages.hpp"

namespace stagehand {

namespace {

using Clock = std::chrono::steady_clock;

class MegatronStrategy : public strategy_actor::base {
 public:
  MegatronStrategy(caf::actor_config& cfg, StrategyOptions options, std::unique_ptr<SaveEngine> engine,
                   std::shared_ptr<StateDict> state, report_listener_actor listener)
      : strategy_actor::base(cfg),
        options_(std::move(options)),
        engine_(std::move(engine)),
        state_(std::move(state)),
        listener_(std::move(listener)) {
    caf::actor_addr self_addr = address();
    queue_ = std::make_unique<AsyncCallsQueue>([self_addr](std::int64_t id) {
      if (auto self = caf::actor_cast<strategy_actor>(self_addr)) caf::anon_send(self, write_done_atom::value, id);
    });
  }

  behavior_type make_behavior() override {
    return {
        [this](save_atom, const SaveOrder& order) -> caf::result<SaveAck> { return save(order); },
        [this](finalize_atom) -> caf::result<bool> {
          if (!queue_) return caf::make_error(caf::sec::request_receiver_down);
          bool drained = queue_->pending() > 0;
          Status st = drain();
          if (!st.is_ok()) return to_caf_error(st);
          return drained;
        },
        [this](load_atom, const LoadOrder& order) -> caf::result<LoadReport> { return load(order); },
        [this](write_done_atom, std::int64_t) {
          // A write's notice can still be in the mailbox when the actor stops (on_exit drained it).
          if (queue_) accept_background(queue_->take_finished());
        },
        [this](stats_atom) -> StrategyStats {
          if (!queue_) return {};
          return {static_cast<std::uint64_t>(engine_->staging_bytes()), static_cast<std::int32_t>(queue_->pending()),
                  saves_};
        },
    };
  }

  void on_exit() override {
    if (queue_) {
      accept_background(queue_->drain());
      queue_.reset();
    }
    engine_.reset();
    listener_ = nullptr;
  }

 private:
  caf::result<SaveAck> save(const SaveOrder& order) {
    if (!queue_) return caf::make_error(caf::sec::request_receiver_down);
    auto start = Clock::now();
    Status prior = drain();
    if (!prior.is_ok()) return to_caf_error(prior.with_context("an earlier checkpoint save failed"));
    ++saves_;
    bool async = order.async;
    if (async && options_.file_system->capabilities(order.policy_dir).uploads) {
      if (!warned_uploads_ && options_.rank == 0) {
        logger()->warn("rank {}: '{}' is in an object store: async_dist_ckpt_save is ignored and saves run "
                       "synchronously, because the upload must finish before the commit",
                       options_.rank, order.policy_dir);
        warned_uploads_ = true;
      }
      async = false;
    }
    // The state as the global plan assigned it: replica id 0 on exactly the blocks this rank writes.
    // A plan that gives the rank exactly its own replica-0 blocks (no replicas, or one rank) is
    // the state itself: not copied (with 100,000 tensors, ~40 MB). Nothing reassigns the state
    // while a save of it runs: a new one is bound after the pending save finished.
    std::shared_ptr<const StateDict> view =
        writes_own_replicas(*state_, order.writes) ? std::shared_ptr<const StateDict>(state_)
                                                   : std::make_shared<const StateDict>(apply_writes(*state_, order.writes));
    if (!async) {
      RankSaveReport report = engine_->save(*view, order.policy_dir, order.step);
      Status st = report.status;
      push(std::move(report));
      if (!st.is_ok()) return to_caf_error(st);
      return SaveAck{seconds_since(start), false};
    }
    // Other ranks' background writes in this process wait while this caller is blocked.
    ForegroundGate::Hold foreground = foreground_gate().hold();
    Status staged = engine_->begin_async(*view, order.policy_dir);
    if (!staged.is_ok()) {
      RankSaveReport failed;
      failed.rank = options_.rank;
      failed.step = order.step;
      failed.status = staged;
      push(std::move(failed));
      return to_caf_error(staged);
    }
    SaveEngine* engine = engine_.get();
    // Closed only while staging goes on in the background; then opened once, when it ends (the
    // fence counts its readers: a weight push may hold it too).
    std::shared_ptr<StagingFence> fence = engine->stages_in_background() ? options_.fence : nullptr;
    if (fence) fence->close();
    queue_->schedule([engine, view, fence, policy_dir = order.policy_dir, step = order.step] {
      return engine->write_async(*view, policy_dir, step, [fence] {
        if (fence) fence->open();
      });
    });
    return SaveAck{seconds_since(start), true};
  }

  caf::result<LoadReport> load(const LoadOrder& order) {
    LoadGroup* group = options_.load_group.get();
    if (!queue_) {
      if (group != nullptr) group->abstain(options_.rank);
      return caf::make_error(caf::sec::request_receiver_down);
    }
    Status st = drain();
    LoadReport report;
    FileSystem& fs = *options_.file_system;
    // A checkpoint root loads the step its tracker names; a step folder loads itself.
    Result<std::string> dir = st.is_ok() ? resolve_checkpoint(fs, order.checkpoint_dir) : Result<std::string>(st);
    if (dir.is_ok()) {
      LoadOptions options = order.selection;
      options.thread_count = options_.load_thread_count;
      st = load_checkpoint(fs, *dir, *state_, options, &report, group, options_.rank);
    } else {
      if (group != nullptr) group->abstain(options_.rank);  // the other ranks of the process do not wait
      st = dir.status();
    }
    // The dispatch names the rank.
    if (!st.is_ok()) return to_caf_error(st.with_context("load of '" + order.checkpoint_dir + "'"));
    logger()->debug("rank {}: loaded '{}': {} bytes in {} reads ({} of {} chunks straight into tensors) on {} "
                    "threads, {:.3f} s (thread-seconds: read {:.3f}, verify {:.3f}, copy {:.3f}), buffers {} bytes",
                    options_.rank, order.checkpoint_dir, report.bytes, report.reads, report.direct_chunks,
                    report.chunks, report.thread_count, report.total_s, report.read_s, report.verify_s,
                    report.copy_s, report.buffer_peak_bytes);
    return report;
  }

  /// Waits for every background write, pushes the results, and returns (once) the first error
  /// of a background write not reported yet.
  Status drain() {
    accept_background(queue_->drain());
    return std::exchange(kept_error_, Status::ok());
  }

  void accept_background(std::vector<RankSaveReport> reports) {
    for (auto& report : reports) {
      if (!report.status.is_ok() && kept_error_.is_ok()) {
        kept_error_ = report.status.with_context("background write of step " + std::to_string(report.step));
        logger()->error("rank {}: {}", options_.rank, kept_error_.message());
      }
      push(std::move(report));
    }
  }

  void push(RankSaveReport report) {
    if (listener_) send(listener_, rank_saved_atom::value, std::move(report));
  }

  static double seconds_since(Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
  }

  StrategyOptions options_;
  std::unique_ptr<SaveEngine> engine_;
  std::unique_ptr<AsyncCallsQueue> queue_;
  std::shared_ptr<StateDict> state_;
  report_listener_actor listener_;
  Status kept_error_;
  bool warned_uploads_ = false;
  std::int64_t saves_ = 0;
};

}  // namespace

Result<strategy_actor> spawn_megatron_strategy(caf::actor_system& system, StrategyOptions options,
                                               std::shared_ptr<StateDict> state, report_listener_actor listener) {
  if (!state) return Status{ErrorCode::invalid_argument, "a strategy needs the rank's state"};
  SaveEngineOptions engine_options{options.thread_count, options.staging_buckets, false, nullptr,
                                   options.staging_per_save, options.stage_host_memory, options.early_writeback,
                                   options.uncached_writes};
  for (const auto& t : state->tensors) engine_options.pinned |= t.tensor.device().is_cuda();
  if (options.low_priority_writers) {
    engine_options.writer_thread_start = [] {
      Status st = lower_current_thread_priority();
      if (!st.is_ok()) logger()->warn("cannot lower a writer thread's priority: {}", st.message());
    };
  }
  SH_ASSIGN_OR_RETURN(auto engine, SaveEngine::create(options.rank, engine_options, options.file_system));
  SH_RETURN_IF_ERROR(engine->prepare(*state, options.async_save).with_context("rank " + std::to_string(options.rank)));
  return system.spawn<MegatronStrategy, caf::detached>(std::move(options), std::move(engine), std::move(state),
                                                       std::move(listener));
}

}  // namespace stagehand
