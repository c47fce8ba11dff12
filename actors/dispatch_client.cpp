#include "stagehand/actors/dispatch_client.hpp"

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "stagehand/actors/messages.hpp"
#include "stagehand/actors/worker.hpp"
#include "stagehand/actors/worker_dispatch.hpp"
#include "stagehand/checkpoint/report_codec.hpp"
#include "stagehand/core/log.hpp"

namespace stagehand {

namespace {

/// A save is at most six bounded waits of the dispatch (finalize: drain and await; begin; fan
/// out; finalize again for a sync save), plus slack.
constexpr int kWaitsPerCall = 8;

}  // namespace

DispatchClient::DispatchClient(caf::actor_system& system, caf::actor dispatch, std::chrono::milliseconds timeout)
    : system_(system), dispatch_(std::move(dispatch)), timeout_(timeout) {}

Result<SaveTiming> DispatchClient::save(std::int64_t step, const std::string& trainer_state_json) {
  caf::scoped_actor self{system_};
  SaveTiming timing;
  Status st;
  self->request(dispatch_, timeout_, save_atom::value, step, trainer_state_json)
      .receive(
          [&](double stall, bool async) {
            timing.stall_s = stall;
            timing.async = async;
          },
          [&](caf::error& err) { st = from_caf_error(err); });
  if (!st.is_ok()) return st;
  return timing;
}

Result<double> DispatchClient::fence() {
  caf::scoped_actor self{system_};
  double waited = 0;
  Status st;
  self->request(dispatch_, timeout_, fence_atom::value)
      .receive([&](double seconds) { waited = seconds; }, [&](caf::error& err) { st = from_caf_error(err); });
  if (!st.is_ok()) return st;
  return waited;
}

Result<std::string> DispatchClient::save_phases(std::int64_t step) {
  caf::scoped_actor self{system_};
  std::string phases;
  Status st;
  self->request(dispatch_, timeout_, phases_atom::value, step)
      .receive([&](std::string& text) { phases = std::move(text); }, [&](caf::error& err) { st = from_caf_error(err); });
  if (!st.is_ok()) return st;
  return phases;
}

Status DispatchClient::finalize() {
  caf::scoped_actor self{system_};
  Status st;
  self->request(dispatch_, timeout_, finalize_atom::value)
      .receive([](bool) {}, [&](caf::error& err) { st = from_caf_error(err); });
  return st;
}

Status DispatchClient::load(const std::string& path, LoadReport* timing, const LoadScope& scope) {
  caf::scoped_actor self{system_};
  Result<LoadReport> reply = LoadReport{};
  self->request(dispatch_, timeout_, load_atom::value, path, encode_load_scope(scope))
      .receive([&](double load_s, double read_s, double verify_s, double copy_s, std::uint64_t bytes,
                   const std::string& notes) { reply = decode_load_reply(load_s, read_s, verify_s, copy_s, bytes, notes); },
               [&](caf::error& err) { reply = from_caf_error(err); });
  if (reply.is_ok() && timing != nullptr) *timing = std::move(*reply);
  return reply.status();
}

CheckpointCluster::CheckpointCluster(caf::actor_system& system, caf::actor coordinator,
                                     std::vector<caf::actor> workers, caf::actor dispatch,
                                     std::chrono::milliseconds client_timeout)
    : system_(system),
      coordinator_(std::move(coordinator)),
      workers_(std::move(workers)),
      client_(system, std::move(dispatch), client_timeout) {}

Result<std::unique_ptr<CheckpointCluster>> CheckpointCluster::spawn(caf::actor_system& system,
                                                                    std::vector<std::unique_ptr<Checkpointable>> ranks,
                                                                    CheckpointClusterOptions options) {
  if (ranks.empty()) return Status{ErrorCode::invalid_argument, "a checkpoint cluster needs at least one rank"};
  options.coordinator.world_size = static_cast<int>(ranks.size());
  auto coordinator = spawn_checkpoint_coordinator(system, options.coordinator);
  std::vector<caf::actor> workers;
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    StrategyOptions strategy = options.strategy;
    strategy.rank = static_cast<int>(r);
    auto worker = spawn_worker(system, std::move(ranks[r]), std::move(strategy), coordinator);
    if (!worker.is_ok()) {
      for (auto& w : workers) caf::anon_send_exit(w, caf::exit_reason::user_shutdown);
      caf::anon_send_exit(coordinator, caf::exit_reason::user_shutdown);
      return worker.status().with_context("rank " + std::to_string(r));
    }
    workers.push_back(*worker);
  }
  auto dispatch =
      spawn_worker_dispatch(system, workers, coordinator, {options.coordinator.destination, options.timeout});
  return std::unique_ptr<CheckpointCluster>(
      new CheckpointCluster(system, std::move(coordinator), std::move(workers), std::move(dispatch),
                            options.timeout * kWaitsPerCall));
}

CheckpointCluster::~CheckpointCluster() { (void)shutdown(); }

Status CheckpointCluster::shutdown() {
  if (shut_down_) return Status::ok();
  shut_down_ = true;
  Status st = client_.finalize();
  if (!st.is_ok()) logger()->error("shutting down: the pending checkpoint save did not commit: {}", st.message());
  caf::scoped_actor self{system_};
  std::vector<caf::actor> all = workers_;
  all.push_back(client_.dispatch());
  all.push_back(coordinator_);
  for (const auto& a : all) {
    self->monitor(a);
    self->send_exit(a, caf::exit_reason::user_shutdown);
  }
  for (std::size_t i = 0; i < all.size(); ++i) self->receive([](const caf::down_msg&) {});
  return st;
}

}  // namespace stagehand
