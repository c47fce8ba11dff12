#include "stagehand/actors/worker.hpp"

#include <caf/all.hpp>

#include <exception>

#include "stagehand/actors/messages.hpp"
#include "stagehand/checkpoint/report_codec.hpp"

namespace stagehand {

namespace {

class Worker : public caf::event_based_actor {
 public:
  Worker(caf::actor_config& cfg, std::unique_ptr<Checkpointable> owned, int rank, caf::actor coordinator)
      : caf::event_based_actor(cfg),
        owned_(std::move(owned)),
        model_(dynamic_cast<Model*>(owned_.get())),
        rank_(rank),
        coordinator_(std::move(coordinator)) {}

  caf::behavior make_behavior() override {
    return {
        [this](attach_atom, caf::actor strategy) {
          strategy_ = std::move(strategy);
          link_to(strategy_);
        },
        [this](train_atom, std::int64_t step, std::int32_t objective,
               const std::vector<std::int32_t>& behaviour_actions) -> caf::result<double, double, double> {
          if (model_ == nullptr) return to_caf_error(no_model());
          // A model that does not fence right before its optimizer step is fenced here, before
          // the whole step.
          const double waited = model_->fences_itself() ? 0 : model_->fence();
          auto metrics = model_->train_step(step, objective == 1 ? Objective::sft : Objective::rl, behaviour_actions);
          if (!metrics.is_ok()) return to_caf_error(metrics.status());
          return caf::result<double, double, double>(metrics->reward, metrics->loss, metrics->fence_wait_s + waited);
        },
        [this](fence_atom) -> double { return owned_->fence(); },
        [this](export_atom, std::int64_t version) -> caf::result<void> {
          if (model_ == nullptr) return to_caf_error(no_model());
          Status st = model_->export_weights(version);
          if (!st.is_ok()) return to_caf_error(st);
          return caf::unit;
        },
        [this](eval_atom) -> caf::result<double> {
          if (model_ == nullptr) return to_caf_error(no_model());
          auto accuracy = model_->evaluate();
          if (!accuracy.is_ok()) return to_caf_error(accuracy.status());
          return *accuracy;
        },
        [this](save_atom, std::int64_t step, const std::string& destination,
               const std::string& policy_dir) -> caf::result<double, bool> {
          auto rp = make_response_promise<double, bool>();
          request(strategy_, caf::infinite, save_atom::value, step, destination, policy_dir)
              .then([rp](double stall, bool async) mutable { rp.deliver(stall, async); },
                    [rp](caf::error& err) mutable { rp.deliver(std::move(err)); });
          return rp;
        },
        [this](finalize_atom) -> caf::result<bool> {
          auto rp = make_response_promise<bool>();
          request(strategy_, caf::infinite, finalize_atom::value)
              .then([rp](bool drained) mutable { rp.deliver(drained); },
                    [rp](caf::error& err) mutable { rp.deliver(std::move(err)); });
          return rp;
        },
        [this](load_atom, const std::string& checkpoint_dir, const std::string& scope_text)
            -> caf::result<double, double, double, double, std::uint64_t, std::string> {
          auto scope = decode_load_scope(scope_text);
          if (!scope.is_ok()) return to_caf_error(scope.status());
          auto rp = make_response_promise<double, double, double, double, std::uint64_t, std::string>();
          request(strategy_, caf::infinite, load_atom::value, checkpoint_dir,
                  encode_load_selection(owned_->load_selection(*scope)))
              .then(
                  [this, rp, checkpoint_dir, scope = *scope](double total_s, double read_s, double verify_s,
                                                             double copy_s, std::uint64_t bytes,
                                                             const std::string& notes) mutable {
                    LoadReport report;
                    Status st = decode_load_notes(notes, report);
                    if (st.is_ok()) st = loaded(checkpoint_dir, scope, report);
                    if (st.is_ok()) {
                      rp.deliver(total_s, read_s, verify_s, copy_s, bytes, notes);
                    } else {
                      rp.deliver(to_caf_error(st));
                    }
                  },
                  [rp](caf::error& err) mutable { rp.deliver(std::move(err)); });
          return rp;
        },
        [this](report_to_atom, caf::actor coordinator) {
          coordinator_ = std::move(coordinator);
          for (auto& report : unsent_) send(coordinator_, rank_saved_atom::value, report);
          unsent_.clear();
        },
        [this](rank_saved_atom, const std::string& report) {
          if (coordinator_) {
            send(coordinator_, rank_saved_atom::value, report);
          } else {
            unsent_.push_back(report);
          }
        },
    };
  }

 private:
  /// The model's on_loaded(), whose exceptions (a user's model may throw) become the error: an
  /// exception out of a handler would kill the Worker.
  Status loaded(const std::string& checkpoint_dir, const LoadScope& scope, const LoadReport& report) {
    try {
      return owned_->on_loaded(scope, report).with_context("checkpoint '" + checkpoint_dir + "'");
    } catch (const std::exception& e) {
      return {ErrorCode::internal, "checkpoint '" + checkpoint_dir + "': the model's on_loaded() threw: " + e.what()};
    }
  }

  Status no_model() const {
    return {ErrorCode::invalid_argument,
            "rank " + std::to_string(rank_) + "'s Worker holds checkpointable state only, not a trainable Model"};
  }

  std::unique_ptr<Checkpointable> owned_;
  /// owned_ when it is a Model, else null (training calls are then refused).
  Model* model_;
  int rank_;
  caf::actor coordinator_;
  caf::actor strategy_;
  /// Reports pushed before the coordinator was known (a Worker in another process).
  std::vector<std::string> unsent_;
};

/// A Checkpointable that is nothing but its state.
class StateOnly final : public Checkpointable {
 public:
  explicit StateOnly(std::shared_ptr<StateDict> state) : state_(std::move(state)) {}
  std::shared_ptr<StateDict> state() override { return state_; }

 private:
  std::shared_ptr<StateDict> state_;
};

}  // namespace

std::unique_ptr<Checkpointable> checkpointable_state(std::shared_ptr<StateDict> state) {
  return std::make_unique<StateOnly>(std::move(state));
}

Result<caf::actor> spawn_worker(caf::actor_system& system, std::unique_ptr<Checkpointable> state_owner,
                                StrategyOptions strategy_options, caf::actor coordinator) {
  if (!state_owner) return Status{ErrorCode::invalid_argument, "a Worker needs a model or checkpointable state"};
  auto state = state_owner->state();
  if (!state) return Status{ErrorCode::invalid_argument, "a Worker's checkpointable returned no state"};
  const int rank = strategy_options.rank;
  // Shared by the strategy, which closes it while a save stages from the state in the
  // background, and the state's owner, which waits at it before modifying the state.
  auto fence = std::make_shared<StagingFence>();
  strategy_options.fence = fence;
  state_owner->attach_fence(fence);
  auto worker = system.spawn<Worker, caf::detached>(std::move(state_owner), rank, std::move(coordinator));
  auto strategy = spawn_megatron_strategy(system, std::move(strategy_options), state, worker);
  if (!strategy.is_ok()) {
    caf::anon_send_exit(worker, caf::exit_reason::user_shutdown);
    return strategy.status();
  }
  caf::anon_send(worker, attach_atom::value, *strategy);
  return worker;
}

}  // namespace stagehand
