#include "stagehand/strategy/megatron_strategy.hpp"

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include <chrono>

#include "stagehand/checkpoint/loader.hpp"
#include "stagehand/checkpoint/resolve.hpp"
#include "stagehand/checkpoint/report_codec.hpp"
#include "stagehand/checkpoint/save_engine.hpp"
#include "stagehand/core/log.hpp"
#include "stagehand/core/priority.hpp"
#include "stagehand/strategy/async_calls_queue.hpp"
#include "stagehand/strategy/messages.hpp"

namespace stagehand {

namespace {

using Clock = std::chrono::steady_clock;

class MegatronStrategy : public caf::event_based_actor {
 public:
  MegatronStrategy(caf::actor_config& cfg, StrategyOptions options, std::unique_ptr<SaveEngine> engine,
                   std::shared_ptr<StateDict> state, caf::actor listener)
      : caf::event_based_actor(cfg),
        options_(std::move(options)),
        engine_(std::move(engine)),
        state_(std::move(state)),
        listener_(std::move(listener)) {
    caf::actor_addr self_addr = address();
    queue_ = std::make_unique<AsyncCallsQueue>([self_addr](std::int64_t id) {
      if (auto self = caf::actor_cast<caf::actor>(self_addr)) caf::anon_send(self, write_done_atom::value, id);
    });
  }

  caf::behavior make_behavior() override {
    return {
        [this](save_atom, std::int64_t step, const std::string& destination,
               const std::string& policy_dir) -> caf::result<double, bool> {
          return save(step, destination, policy_dir);
        },
        [this](finalize_atom) -> caf::result<bool> {
          bool drained = queue_->pending() > 0;
          Status st = drain();
          if (!st.is_ok()) return to_caf_error(st);
          return drained;
        },
        [this](load_atom, const std::string& checkpoint_dir, const std::string& selection)
            -> caf::result<double, double, double, double, std::uint64_t, std::string> {
          Status st = drain();
          LoadReport report;
          if (st.is_ok()) {
            // A checkpoint root loads the step its tracker names; a step folder loads itself.
            FileSystem& fs = *options_.file_system;
            auto dir = resolve_checkpoint(fs, checkpoint_dir);
            LoadOptions load_options;
            load_options.thread_count = options_.load_thread_count;
            st = decode_load_selection(selection, load_options);
            if (st.is_ok()) st = dir.is_ok() ? load_checkpoint(fs, *dir, *state_, load_options, &report) : dir.status();
          }
          // The dispatch names the rank.
          if (!st.is_ok()) return to_caf_error(st.with_context("load of '" + checkpoint_dir + "'"));
          logger()->debug("rank {}: loaded '{}': {} bytes in {} reads ({} of {} chunks straight into tensors) on {} "
                          "threads, {:.3f} s (thread-seconds: read {:.3f}, verify {:.3f}, copy {:.3f}), "
                          "buffers {} bytes",
                          options_.rank, checkpoint_dir, report.bytes, report.reads, report.direct_chunks,
                          report.chunks, report.thread_count, report.total_s, report.read_s, report.verify_s,
                          report.copy_s, report.buffer_peak_bytes);
          return caf::result<double, double, double, double, std::uint64_t, std::string>(
              report.total_s, report.read_s, report.verify_s, report.copy_s, report.bytes, encode_load_notes(report));
        },
        [this](write_done_atom, std::int64_t) { accept_background(queue_->take_finished()); },
        [this](stats_atom) -> caf::result<std::uint64_t, std::int32_t, std::int64_t> {
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
  caf::result<double, bool> save(std::int64_t step, const std::string& destination, const std::string& policy_dir) {
    auto start = Clock::now();
    Status prior = drain();
    if (!prior.is_ok()) return to_caf_error(prior.with_context("an earlier checkpoint save failed"));
    ++saves_;
    bool async = options_.async_save;
    if (async && options_.file_system->capabilities(policy_dir).uploads) {
      if (!warned_uploads_ && options_.rank == 0) {
        logger()->warn("rank {}: ckpt_path '{}' is an object store: async_dist_ckpt_save is ignored and saves "
                       "run synchronously, because the upload must finish before the commit",
                       options_.rank, destination);
        warned_uploads_ = true;
      }
      async = false;
    }
    if (!async) {
      RankSaveReport report = engine_->save(*state_, policy_dir, step);
      Status st = report.status;
      push(report);
      if (!st.is_ok()) return to_caf_error(st);
      return caf::result<double, bool>(seconds_since(start), false);
    }
    Status staged = engine_->begin_async(*state_);
    if (!staged.is_ok()) {
      RankSaveReport failed;
      failed.rank = options_.rank;
      failed.step = step;
      failed.status = staged;
      push(failed);
      return to_caf_error(staged);
    }
    SaveEngine* engine = engine_.get();
    std::shared_ptr<StagingFence> fence = options_.fence;
    if (fence && engine->stages_in_background()) fence->close();
    queue_->schedule([engine, state = state_, fence, policy_dir, step] {
      return engine->write_async(*state, policy_dir, step, [fence] {
        if (fence) fence->open();
      });
    });
    return caf::result<double, bool>(seconds_since(start), true);
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
      push(report);
    }
  }

  void push(const RankSaveReport& report) {
    if (listener_) send(listener_, rank_saved_atom::value, encode_report(report));
  }

  static double seconds_since(Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
  }

  StrategyOptions options_;
  std::unique_ptr<SaveEngine> engine_;
  std::unique_ptr<AsyncCallsQueue> queue_;
  std::shared_ptr<StateDict> state_;
  caf::actor listener_;
  Status kept_error_;
  bool warned_uploads_ = false;
  std::int64_t saves_ = 0;
};

}  // namespace

Result<caf::actor> spawn_megatron_strategy(caf::actor_system& system, StrategyOptions options,
                                           std::shared_ptr<StateDict> state, caf::actor listener) {
  if (!state) return Status{ErrorCode::invalid_argument, "a strategy needs the rank's state"};
  SaveEngineOptions engine_options{options.thread_count, options.staging_buckets, false, nullptr,
                                   options.staging_per_save, options.stage_host_memory, options.early_writeback};
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
