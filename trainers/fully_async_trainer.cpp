// The fully-async trainer: GRPO-style RL whose samples come from generator actors.
#include <caf/all.hpp>

#include <map>

#include "stagehand/actors/messages.hpp"
#include "stagehand/trainers/fully_async_trainer.hpp"
#include "stagehand/trainers/generator.hpp"
#include "stagehand/trainers/trainer_base.hpp"

namespace stagehand {

namespace {

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

  bool pushes_weights_itself() const override { return true; }

  Status on_start(std::int64_t step, const TrainerState* state, const std::string& state_file) override {
    const auto& c = options().config;
    if (!options().weights && options().weight_channel.empty()) {
      return {ErrorCode::invalid_argument, "the fully-async trainer needs a weight store or a weight-sync channel"};
    }
    staleness_ = c.fully_async.max_staleness_steps;
    for (std::int64_t g = 0; g < c.fully_async.num_generators; ++g) {
      GeneratorWeights source;
      source.store = options().weights;
      source.channel = options().weight_channel;
      source.name = "generator-" + std::to_string(g);
      source.options = weight_channel_options(c.weight_sync, timeout());
      // Batch s needs version s - 1 - L, and the batches not yet consumed reach L versions back.
      source.keep = staleness_ + 1;
      generators_.push_back(spawn_generator(system(), c.model, c.trainer.seed, std::move(source), timeout()));
    }
    if (state != nullptr) {
      if (!state->fully_async) return {ErrorCode::corruption, "'" + state_file + "': field 'fully_async' is missing"};
      SH_RETURN_IF_ERROR(check_pending_batches(*state->fully_async, state_file));
      max_seen_ = state->fully_async->max_staleness_seen;
      for (const auto& b : state->fully_async->pending_batches) ready_[b.step] = {b.version, b.actions};
    }
    for (std::int64_t s = step + 1; s <= step + staleness_ + 1; ++s) {
      if (ready_.count(s) == 0) schedule(s);
    }
    return export_weights(step);
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
    schedule(step + staleness_ + 1);
    SH_RETURN_IF_ERROR(export_weights(step));
    if (options().weights) options().weights->drop_before(step - staleness_);
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

  /// Publishes the weights of `step`: to the store, or pushed over the channel in the background
  /// once every generator (and weight_sync.receivers outside the run) waits for it; each
  /// generator keeps the versions its batches may still need.
  Status export_weights(std::int64_t step) {
    const auto waits = static_cast<std::int32_t>(generators_.size()) + outside_receivers();
    return client().export_weights(step, options().weights ? 0 : waits)
        .with_context("weight sync of step " + std::to_string(step));
  }

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
    for (std::size_t g = 0; g < it->second.parts.size(); ++g) {
      it->second.parts[g].receive(
          [&](std::vector<std::int32_t>& actions) { batch.actions.insert(batch.actions.end(), actions.begin(), actions.end()); },
          [&](caf::error& err) {
            if (!st.is_ok()) return;
            const std::string what = "generating batch " + std::to_string(step);
            st = err == caf::sec::request_timeout
                     ? Status{ErrorCode::timeout, what + ": generator " + std::to_string(g) + " did not answer within " +
                                                      std::to_string(timeout().count() / 1000) +
                                                      " s (trainer.call_timeout_s)"}
                     : from_caf_error(err).with_context(what);
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

caf::actor spawn_fully_async_trainer(caf::actor_system& system, dispatch_actor dispatch, TrainerOptions options,
                                     std::shared_ptr<TrainerSummary> summary) {
  return system.spawn<FullyAsyncTrainer>(std::move(dispatch), std::move(options), std::move(summary));
}

}  // namespace stagehand
