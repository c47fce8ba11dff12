#include "stagehand/actors/dispatch_client.hpp"

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include <sstream>

#include "stagehand/actors/worker.hpp"
#include "stagehand/checkpoint/load/load_group.hpp"
#include "stagehand/core/log.hpp"

namespace stagehand {

namespace {

/// A call is at most a few bounded waits of the dispatch (finalize: drain and await; plan and
/// write; await the commit), plus slack.
constexpr int kWaitsPerCall = 6;

/// The error of a failed request to the dispatch; its own time limit names `setting`.
Status call_error(const caf::error& err, std::chrono::milliseconds timeout, const std::string& setting) {
  if (err != caf::sec::request_timeout) return from_caf_error(err);
  std::ostringstream within;
  within << static_cast<double>(timeout.count()) / 1000.0 << " s";
  return {ErrorCode::timeout, "the dispatch did not answer within " + within.str() +
                                  (setting.empty() ? "" : " (" + setting + ")")};
}

/// The reply to one request of `self` to `dispatch`, or the error.
template <class T, class... Args>
Result<T> call(caf::actor_system& system, const dispatch_actor& dispatch, std::chrono::milliseconds timeout,
               const std::string& setting, Args&&... args) {
  caf::scoped_actor self{system};
  Result<T> out = Status{ErrorCode::internal, "no reply"};
  self->request(dispatch, timeout, std::forward<Args>(args)...)
      .receive([&](T& value) { out = std::move(value); },
               [&](caf::error& err) { out = call_error(err, timeout, setting); });
  return out;
}

}  // namespace

DispatchClient::DispatchClient(caf::actor_system& system, dispatch_actor dispatch, std::chrono::milliseconds timeout,
                               std::string timeout_setting)
    : system_(system), dispatch_(std::move(dispatch)), timeout_(timeout), timeout_setting_(std::move(timeout_setting)) {}

Result<SaveResult> DispatchClient::save(std::int64_t step, bool async, const std::string& trainer_state_json) {
  return call<SaveResult>(system_, dispatch_, timeout_, timeout_setting_, save_atom::value,
                          SaveCall{step, async, trainer_state_json});
}

Result<double> DispatchClient::fence() {
  return call<double>(system_, dispatch_, timeout_, timeout_setting_, fence_atom::value);
}

Result<FinalizeResult> DispatchClient::finalize() {
  return call<FinalizeResult>(system_, dispatch_, timeout_, timeout_setting_, finalize_atom::value);
}

Result<LoadReport> DispatchClient::load(const std::string& path, const LoadScope& scope) {
  return call<LoadReport>(system_, dispatch_, timeout_, timeout_setting_, load_atom::value,
                          LoadCall{path, scope});
}

Result<StepMetrics> DispatchClient::train(TrainOrder order) {
  return call<StepMetrics>(system_, dispatch_, timeout_, timeout_setting_, train_atom::value, std::move(order));
}

Result<double> DispatchClient::evaluate() {
  return call<double>(system_, dispatch_, timeout_, timeout_setting_, eval_atom::value);
}

Status DispatchClient::export_weights(std::int64_t version, std::int32_t wait_for) {
  caf::scoped_actor self{system_};
  Status st;
  self->request(dispatch_, timeout_, export_atom::value, version, wait_for)
      .receive([] {}, [&](caf::error& err) { st = call_error(err, timeout_, timeout_setting_); });
  return st;
}

CheckpointCluster::CheckpointCluster(caf::actor_system& system, coordinator_actor coordinator,
                                     std::vector<worker_actor> workers, dispatch_actor dispatch,
                                     std::chrono::milliseconds client_timeout, std::string client_timeout_setting)
    : system_(system),
      coordinator_(std::move(coordinator)),
      workers_(std::move(workers)),
      client_(system, std::move(dispatch), client_timeout, std::move(client_timeout_setting)) {}

Result<std::unique_ptr<CheckpointCluster>> CheckpointCluster::spawn(caf::actor_system& system,
                                                                    std::vector<std::unique_ptr<Checkpointable>> ranks,
                                                                    CheckpointClusterOptions options) {
  if (ranks.empty()) return Status{ErrorCode::invalid_argument, "a checkpoint cluster needs at least one rank"};
  options.coordinator.world_size = static_cast<int>(ranks.size());
  options.coordinator.plan_timeout = options.timeout;
  auto coordinator = spawn_checkpoint_coordinator(system, options.coordinator);
  std::vector<worker_actor> workers;
  auto load_group = ranks.size() > 1 ? std::make_shared<LoadGroup>(static_cast<int>(ranks.size()), options.timeout)
                                     : nullptr;
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    StrategyOptions strategy = options.strategy;
    strategy.rank = static_cast<int>(r);
    strategy.load_group = load_group;
    auto worker = spawn_worker(system, std::move(ranks[r]), std::move(strategy), coordinator, options.timeout);
    if (!worker.is_ok()) {
      for (auto& w : workers) caf::anon_send_exit(w, caf::exit_reason::user_shutdown);
      caf::anon_send_exit(coordinator, caf::exit_reason::user_shutdown);
      return worker.status().with_context("rank " + std::to_string(r));
    }
    workers.push_back(*worker);
  }
  auto dispatch = spawn_worker_dispatch(system, workers, coordinator, {options.timeout, options.timeout_setting, 0});
  return std::unique_ptr<CheckpointCluster>(new CheckpointCluster(system, std::move(coordinator), std::move(workers),
                                                                  std::move(dispatch), options.timeout * kWaitsPerCall,
                                                                  std::to_string(kWaitsPerCall) + " x " +
                                                                      options.timeout_setting));
}

CheckpointCluster::~CheckpointCluster() { (void)shutdown(); }

Status CheckpointCluster::shutdown() {
  if (shut_down_) return Status::ok();
  shut_down_ = true;
  Status st = client_.finalize().status();
  if (!st.is_ok()) logger()->error("shutting down: the pending checkpoint save did not commit: {}", st.message());
  std::vector<caf::actor> all;
  for (const auto& w : workers_) all.push_back(caf::actor_cast<caf::actor>(w));
  all.push_back(caf::actor_cast<caf::actor>(client_.dispatch()));
  all.push_back(caf::actor_cast<caf::actor>(coordinator_));
  (void)stop_actors(system_, all, std::chrono::minutes(1));
  return st;
}

bool stop_actors(caf::actor_system& system, const std::vector<caf::actor>& actors, std::chrono::milliseconds limit) {
  caf::scoped_actor self{system};
  for (const auto& a : actors) {
    self->monitor(a);
    self->send_exit(a, caf::exit_reason::user_shutdown);
  }
  std::size_t gone = 0;
  bool in_time = true;
  // Not receive_for(gone, n): it counts up after each handler and stops only at n exactly, so a
  // timeout handler that set gone = n sent it past n and the wait never ended.
  self->receive_while([&] { return in_time && gone < actors.size(); })(
      [&](const caf::down_msg&) { ++gone; }, caf::after(limit) >> [&] { in_time = false; });
  return in_time;
}

}  // namespace stagehand
