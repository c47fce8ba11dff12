#include "strategy/local_checkpoint_driver.hpp"

#include <caf/all.hpp>

#include "strategy/messages.hpp"

namespace stagehand {

LocalCheckpointDriver::LocalCheckpointDriver(caf::actor_system& system, std::string destination,
                                             caf::actor coordinator, std::vector<caf::actor> strategies,
                                             std::chrono::milliseconds timeout)
    : system_(system),
      destination_(std::move(destination)),
      coordinator_(std::move(coordinator)),
      strategies_(std::move(strategies)),
      timeout_(timeout) {}

LocalCheckpointDriver::~LocalCheckpointDriver() { (void)shutdown(); }

template <class OnReply>
Status LocalCheckpointDriver::fan_out(const caf::message& msg, OnReply on_reply) {
  caf::scoped_actor self{system_};
  std::vector<decltype(self->request(strategies_[0], timeout_, msg))> handles;
  for (const auto& s : strategies_) handles.push_back(self->request(s, timeout_, msg));
  Status first;
  for (std::size_t rank = 0; rank < handles.size(); ++rank) {
    handles[rank].receive(
        on_reply,
        [&](caf::error& err) {
          if (first.is_ok()) first = from_caf_error(err).with_context("rank " + std::to_string(rank));
        });
  }
  return first;
}

Result<SaveTiming> LocalCheckpointDriver::save(std::int64_t step, const std::string& trainer_state_json) {
  auto start = std::chrono::steady_clock::now();
  SH_RETURN_IF_ERROR(finalize());
  caf::scoped_actor self{system_};
  std::string policy_dir;
  Status begun;
  self->request(coordinator_, timeout_, begin_atom::value, step, trainer_state_json)
      .receive([&](std::string& dir) { policy_dir = std::move(dir); },
               [&](caf::error& err) { begun = from_caf_error(err); });
  SH_RETURN_IF_ERROR(begun);
  pending_step_ = step;
  SaveTiming timing;
  Status saved = fan_out(caf::make_message(save_atom::value, step, destination_, policy_dir),
                         [&](double, bool async) { timing.async = async; });
  if (!saved.is_ok()) {
    (void)finalize();
    return saved;
  }
  if (!timing.async) SH_RETURN_IF_ERROR(finalize());
  timing.stall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return timing;
}

Status LocalCheckpointDriver::finalize() {
  Status drained = fan_out(caf::make_message(finalize_atom::value), [](bool) {});
  if (!pending_step_) return drained;
  std::int64_t step = *pending_step_;
  pending_step_.reset();
  Status committed;
  caf::scoped_actor self{system_};
  self->request(coordinator_, timeout_, await_atom::value, step)
      .receive([] {}, [&](caf::error& err) { committed = from_caf_error(err); });
  return drained.is_ok() ? committed : drained;
}

Status LocalCheckpointDriver::load(const std::string& checkpoint_dir) {
  SH_RETURN_IF_ERROR(finalize());
  return fan_out(caf::make_message(load_atom::value, checkpoint_dir), [] {});
}

Status LocalCheckpointDriver::shutdown() {
  if (shut_down_) return Status::ok();
  shut_down_ = true;
  Status st = finalize();
  caf::scoped_actor self{system_};
  for (const auto& s : strategies_) {
    self->monitor(s);
    self->send_exit(s, caf::exit_reason::user_shutdown);
  }
  for (std::size_t i = 0; i < strategies_.size(); ++i) {
    self->receive([](const caf::down_msg&) {});
  }
  self->send_exit(coordinator_, caf::exit_reason::user_shutdown);
  return st;
}

}  // namespace stagehand
