#include "stagehand/actors/worker.hpp"

#include <caf/all.hpp>

#include <spdlog/spdlog.h>

#include <atomic>
#include <exception>
#include <future>
#include <memory>
#include <optional>

#include "stagehand/checkpoint/save/planner.hpp"
#include "stagehand/core/thread_pool.hpp"

namespace stagehand {

namespace {

class Worker : public worker_actor::base {
 public:
  Worker(caf::actor_config& cfg, std::unique_ptr<Checkpointable> owned, int rank, coordinator_actor coordinator,
         std::chrono::milliseconds call_timeout, std::shared_ptr<StagingFence> fence,
         std::optional<WeightPublishing> publishing)
      : worker_actor::base(cfg),
        owned_(std::move(owned)),
        model_(dynamic_cast<Model*>(owned_.get())),
        rank_(rank),
        coordinator_(std::move(coordinator)),
        timeout_(call_timeout),
        fence_(std::move(fence)),
        publishing_(std::move(publishing)) {}

  // The push thread (joined as push_thread_ goes) serves late receivers until told to stop; on_exit
  // has told it already, unless the Worker is destroyed without running.
  ~Worker() override {
    if (stop_serving_) stop_serving_->store(true);
  }

  behavior_type make_behavior() override {
    return {
        [this](attach_atom, strategy_actor& strategy) {
          strategy_ = std::move(strategy);
          link_to(strategy_);
        },
        [this](train_atom, const TrainOrder& order) -> caf::result<StepMetrics> {
          if (model_ == nullptr) return to_caf_error(no_model());
          // A model that does not fence right before its optimizer step is fenced here, before
          // the whole step.
          const double waited = model_->fences_itself() ? 0 : model_->fence();
          auto metrics = model_->train_step(order.step, order.objective, order.behaviour_actions);
          if (!metrics.is_ok()) return to_caf_error(metrics.status());
          metrics->fence_wait_s += waited;
          return *metrics;
        },
        [this](fence_atom) -> double { return owned_->fence(); },
        [this](export_atom, std::int64_t version, std::int32_t wait_for) -> caf::result<void> {
          if (model_ == nullptr) return to_caf_error(no_model());
          Status st = publishing_ ? start_push(version, wait_for) : model_->export_weights(version);
          if (!st.is_ok()) return to_caf_error(st);
          return caf::unit;
        },
        [this](eval_atom) -> caf::result<double> {
          if (model_ == nullptr) return to_caf_error(no_model());
          auto accuracy = model_->evaluate();
          if (!accuracy.is_ok()) return to_caf_error(accuracy.status());
          return *accuracy;
        },
        [this](save_atom, const SaveCall& call) -> caf::result<SaveAck> { return save(call); },
        [this](finalize_atom) -> caf::result<bool> {
          auto rp = make_response_promise<bool>();
          request(strategy_, timeout_, finalize_atom::value)
              .then([rp](bool drained) mutable { rp.deliver(drained); },
                    [rp](caf::error& err) mutable { rp.deliver(std::move(err)); });
          return rp;
        },
        [this](load_atom, const LoadCall& call) -> caf::result<LoadReport> { return load(call); },
        [this](report_to_atom, coordinator_actor& coordinator) {
          coordinator_ = std::move(coordinator);
          for (auto& report : unsent_) send(coordinator_, rank_saved_atom::value, std::move(report));
          unsent_.clear();
        },
        [this](rank_saved_atom, RankSaveReport& report) {
          if (coordinator_) {
            send(coordinator_, rank_saved_atom::value, std::move(report));
          } else {
            unsent_.push_back(std::move(report));
          }
        },
    };
  }

  void on_exit() override {
    if (Status st = finish_push(); !st.is_ok()) spdlog::warn("rank {}: {}", rank_, st.message());
    // strategy_ is kept until the Worker is destroyed: dropping the last reference to an idle
    // strategy here would destroy it on this thread (CAF runs its on_exit, which drains the
    // background writes, here) while a late write notice runs its handler on its own thread. The
    // strategy, linked, stops on its own thread and then releases the Worker it reports to.
    coordinator_ = nullptr;
  }

 private:
  caf::result<SaveAck> save(const SaveCall& call) {
    if (!coordinator_) {
      return to_caf_error({ErrorCode::aborted, "rank " + std::to_string(rank_) + " does not know the coordinator yet"});
    }
    auto state = owned_->state();
    if (Status valid = state->validate(); !valid.is_ok()) {
      return to_caf_error(valid.with_context("rank " + std::to_string(rank_)));
    }
    LocalPlan plan;
    plan.rank = rank_;
    plan.step = call.step;
    plan.objects = state->objects;
    // The descriptors are copied only for a structure the coordinator does not know yet.
    plan.signature = structure_signature(*state);
    plan.cached = sent_signature_ == plan.signature;
    if (!plan.cached) plan.tensors = state->descriptors();
    auto rp = make_response_promise<SaveAck>();
    const bool full = !plan.cached;
    const std::uint64_t signature = plan.signature;
    // The coordinator's limits pass first and name the rank that did not begin.
    request(coordinator_, plan_wait_limit(timeout_), plan_atom::value, std::move(plan), call.trainer_state)
        .then(
            [this, rp, call, full, signature](WriteAssignment& assigned) mutable {
              if (full) sent_signature_ = signature;
              SaveOrder order{call.step, call.async, std::move(assigned.policy_dir), std::move(assigned.writes)};
              request(strategy_, timeout_, save_atom::value, std::move(order))
                  .then([rp](SaveAck ack) mutable { rp.deliver(ack); },
                        [rp](caf::error& err) mutable { rp.deliver(std::move(err)); });
            },
            [rp](caf::error& err) mutable { rp.deliver(std::move(err)); });
    return rp;
  }

  caf::result<LoadReport> load(const LoadCall& call) {
    // A load writes the state a push may still read.
    if (Status st = finish_push(); !st.is_ok()) spdlog::warn("rank {}: {}", rank_, st.message());
    auto rp = make_response_promise<LoadReport>();
    request(strategy_, timeout_, load_atom::value, LoadOrder{call.path, owned_->load_selection(call.scope)})
        .then(
            [this, rp, call](LoadReport& report) mutable {
              Status st = loaded(call.path, call.scope, report);
              if (st.is_ok()) {
                rp.deliver(std::move(report));
              } else {
                rp.deliver(to_caf_error(st));
              }
            },
            [rp](caf::error& err) mutable { rp.deliver(std::move(err)); });
    return rp;
  }

  /// The model's on_loaded(), whose exceptions (a user's model may throw) become the error: an
  /// exception out of a handler would kill the Worker.
  Status loaded(const std::string& checkpoint_dir, const LoadScope& scope, const LoadReport& report) {
    try {
      return owned_->on_loaded(scope, report).with_context("checkpoint '" + checkpoint_dir + "'");
    } catch (const std::exception& e) {
      return {ErrorCode::internal, "checkpoint '" + checkpoint_dir + "': the model's on_loaded() threw: " + e.what()};
    }
  }

  /// The tensors a push sends: those whose names start with the prefix (sharing the storage).
  StateDict pushed_tensors(const StateDict& state) const {
    StateDict selected;
    for (const auto& t : state.tensors) {
      if (t.desc.name.rfind(publishing_->prefix, 0) == 0) selected.tensors.push_back(t);
    }
    return selected;
  }

  /// Waits for the previous push (bounded: a push waits at most the receiver timeout for each
  /// bucket and receiver); its error, if it failed.
  Status finish_push() {
    if (!push_.valid()) return Status::ok();
    if (stop_serving_) stop_serving_->store(true);
    try {
      push_.get();
    } catch (const std::exception& e) {
      return {ErrorCode::internal, "rank " + std::to_string(rank_) + ": the weight push failed: " + e.what()};
    }
    return *push_status_;
  }

  /// Starts pushing the state as `version` in the background, fence closed.
  Status start_push(std::int64_t version, int wait_for) {
    Status previous = finish_push();
    if (!previous.is_ok()) return previous;
    auto selected = std::make_shared<StateDict>(pushed_tensors(*owned_->state()));
    if (!publisher_) {
      if (selected->tensors.empty()) {
        return {ErrorCode::invalid_argument, "weight_sync.tensors '" + publishing_->prefix +
                                                 "' matches no tensor of rank " + std::to_string(rank_) + "'s state"};
      }
      auto created = open_weight_publisher(publishing_->channel, rank_, publishing_->world, selected->descriptors(),
                                           publishing_->options);
      if (!created.is_ok()) {
        return created.status().with_context(
            "rank " + std::to_string(rank_) +
            (is_tcp_channel(publishing_->channel)
                 ? std::string()
                 : " (the shared-memory channel needs every trainer rank on one host; ranks on several hosts: "
                   "weight_sync.transport tcp or collective)"));
      }
      publisher_ = std::shared_ptr<WeightPublisher>(std::move(*created));
    }
    bool closed = false;
    try {
      if (!push_thread_) push_thread_ = std::make_unique<ThreadPool>(1);
      push_status_ = std::make_shared<Status>();
      stop_serving_ = std::make_shared<std::atomic<bool>>(false);
      if (fence_) fence_->close();
      closed = fence_ != nullptr;
      push_ = push_thread_->submit([publisher = publisher_, selected, fence = fence_, version, wait_for, rank = rank_,
                                    out = push_status_, stop = stop_serving_] {
        // The fence opens however the push ends.
        struct Open {
          StagingFence* fence;
          ~Open() {
            if (fence) fence->open();
          }
        } open{fence.get()};
        Status st;
        try {
          auto log = [rank, version](const PushReport& report) {
            for (const auto& dropped : report.dropped) {
              spdlog::warn("rank {}: weight sync of step {}: not delivered: {}", rank, version, dropped);
            }
          };
          auto report = publisher->push(version, *selected, wait_for);
          if (!report.is_ok()) {
            st = report.status();
          } else {
            log(*report);
            // Until the state is modified (someone waits at the fence) or the next export, a
            // receiver that joins late gets this version, the newest, at once.
            // Its failure is logged: the version itself was pushed.
            if (fence) {
              if (Status served = serve_late_receivers(*publisher, version, *selected, *fence, *stop, log);
                  !served.is_ok()) {
                spdlog::warn("rank {}: weight sync: {}", rank, served.message());
              }
            }
          }
        } catch (const std::exception& e) {
          st = {ErrorCode::internal, std::string("the push threw: ") + e.what()};
        }
        *out = st.with_context("weight push of step " + std::to_string(version));
      });
    } catch (const std::exception& e) {
      // Nothing was submitted (submit() threw): this push's close is undone.
      if (closed) fence_->open();
      push_ = {};
      return {ErrorCode::internal, "rank " + std::to_string(rank_) + ": starting the weight push failed: " + e.what()};
    }
    return Status::ok();
  }

  Status no_model() const {
    return {ErrorCode::invalid_argument,
            "rank " + std::to_string(rank_) + "'s Worker holds checkpointable state only, not a trainable Model"};
  }

  std::unique_ptr<Checkpointable> owned_;
  /// owned_ when it is a Model, else null (training calls are then refused).
  Model* model_;
  int rank_;
  coordinator_actor coordinator_;
  strategy_actor strategy_;
  std::chrono::milliseconds timeout_;
  /// The signature of the last structure the coordinator received in full from this rank.
  std::optional<std::uint64_t> sent_signature_;
  /// Reports pushed before the coordinator was known (a Worker in another process).
  std::vector<RankSaveReport> unsent_;
  std::shared_ptr<StagingFence> fence_;
  std::optional<WeightPublishing> publishing_;
  std::shared_ptr<WeightPublisher> publisher_;
  /// The thread that pushes, the push in flight (if any) and its outcome.
  std::unique_ptr<ThreadPool> push_thread_;
  std::future<void> push_;
  std::shared_ptr<Status> push_status_;
  /// Set to end the push thread's serving of late receivers (the next push, a load, exit).
  std::shared_ptr<std::atomic<bool>> stop_serving_;
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

Result<worker_actor> spawn_worker(caf::actor_system& system, std::unique_ptr<Checkpointable> state_owner,
                                  StrategyOptions strategy_options, coordinator_actor coordinator,
                                  std::chrono::milliseconds call_timeout,
                                  std::optional<WeightPublishing> publishing) {
  if (!state_owner) return Status{ErrorCode::invalid_argument, "a Worker needs a model or checkpointable state"};
  auto state = state_owner->state();
  if (!state) return Status{ErrorCode::invalid_argument, "a Worker's checkpointable returned no state"};
  const int rank = strategy_options.rank;
  // Shared by the strategy, which closes it while a save stages from the state in the
  // background, and the state's owner, which waits at it before modifying the state.
  auto fence = std::make_shared<StagingFence>();
  strategy_options.fence = fence;
  state_owner->attach_fence(fence);
  auto worker =
      system.spawn<Worker, caf::detached>(std::move(state_owner), rank, std::move(coordinator), call_timeout, fence,
                                          std::move(publishing));
  auto strategy = spawn_megatron_strategy(system, std::move(strategy_options), state, worker);
  if (!strategy.is_ok()) {
    caf::anon_send_exit(worker, caf::exit_reason::user_shutdown);
    return strategy.status();
  }
  caf::anon_send(worker, attach_atom::value, *strategy);
  return worker;
}

}  // namespace stagehand
