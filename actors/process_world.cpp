#include "stagehand/actors/process_world.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include <thread>

#include "stagehand/actors/messages.hpp"

namespace stagehand {

namespace {

using Clock = std::chrono::steady_clock;

// -- world --

struct Joined {
  caf::actor worker;
  caf::actor member;
};

/// Rank 0's published actor: collects joins, checks them, completes the world.
class WorldActor : public caf::event_based_actor {
 public:
  WorldActor(caf::actor_config& cfg, LaunchInfo info)
      : caf::event_based_actor(cfg), info_(std::move(info)), joined_(static_cast<std::size_t>(info_.world_size)) {}

  caf::behavior make_behavior() override {
    set_down_handler([this](const caf::down_msg& down) {
      for (std::size_t r = 1; r < joined_.size(); ++r) {
        if (joined_[r] && joined_[r]->member.address() == down.source && !complete_) {
          fail("rank " + std::to_string(r) + " went away before every rank had joined");
        }
      }
    });
    delayed_send(this, info_.join_timeout, timeout_atom::value);
    return {
        [this](join_atom, std::int32_t rank, std::int32_t world_size, const std::string& version, caf::actor worker) {
          on_join(rank, world_size, version, std::move(worker));
        },
        [this](timeout_atom) {
          if (complete_ || failure_) return;
          std::string missing;
          for (std::size_t r = 1; r < joined_.size(); ++r) {
            if (!joined_[r]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
          }
          fail("rank(s) " + missing + " of WORLD_SIZE=" + std::to_string(info_.world_size) + " did not join rank 0 at " +
               info_.master() + " within " + std::to_string(info_.join_timeout.count() / 1000) +
               " s: were they started, with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE?");
        },
        [this](await_atom, caf::actor worker0, caf::actor rendezvous, caf::actor coordinator)
            -> caf::result<std::vector<caf::actor>> {
          joined_[0] = Joined{std::move(worker0), caf::actor{}};
          rendezvous_ = std::move(rendezvous);
          coordinator_ = std::move(coordinator);
          waiter_ = make_response_promise<std::vector<caf::actor>>();
          if (failure_) {
            waiter_->deliver(to_caf_error(*failure_));
          } else {
            try_complete();
          }
          return *waiter_;
        },
        [this](shutdown_atom, std::int32_t code) {
          for (std::size_t r = 1; r < joined_.size(); ++r) {
            if (joined_[r]) send(joined_[r]->member, shutdown_atom::value, code);
          }
          quit();
        },
    };
  }

 private:
  void on_join(std::int32_t rank, std::int32_t world_size, const std::string& version, caf::actor worker) {
    auto member = caf::actor_cast<caf::actor>(current_sender());
    std::string who = "the process joining as rank " + std::to_string(rank);
    std::string problem;
    if (version != info_.wire_version) {
      problem = who + " speaks " + version + ", rank 0 speaks " + info_.wire_version +
                " (every process must run the same Stagehand build)";
    } else if (world_size != info_.world_size) {
      problem = who + " was started with WORLD_SIZE=" + std::to_string(world_size) + ", rank 0 with WORLD_SIZE=" +
                std::to_string(info_.world_size);
    } else if (rank <= 0 || rank >= info_.world_size) {
      problem = who + ": RANK must be in 1.." + std::to_string(info_.world_size - 1) + " for processes joining rank 0";
    } else if (joined_[static_cast<std::size_t>(rank)]) {
      problem = who + ": rank " + std::to_string(rank) + " has already joined (two processes with RANK=" +
                std::to_string(rank) + "?)";
    } else if (complete_ || failure_) {
      problem = who + ": the world is already " + (complete_ ? "complete" : "failed");
    }
    if (!problem.empty()) {
      if (member) send(member, join_error_atom::value, problem);
      fail(problem);
      return;
    }
    monitor(member);
    joined_[static_cast<std::size_t>(rank)] = Joined{std::move(worker), member};
    try_complete();
  }

  void try_complete() {
    if (complete_ || failure_ || !waiter_) return;
    for (const auto& j : joined_) {
      if (!j) return;
    }
    complete_ = true;
    std::vector<caf::actor> workers;
    for (const auto& j : joined_) workers.push_back(j->worker);
    for (std::size_t r = 1; r < joined_.size(); ++r) send(joined_[r]->member, peers_atom::value, rendezvous_, coordinator_);
    waiter_->deliver(std::move(workers));
  }

  void fail(const std::string& why) {
    if (failure_) return;
    failure_ = Status{ErrorCode::aborted, why};
    for (std::size_t r = 1; r < joined_.size(); ++r) {
      if (joined_[r]) send(joined_[r]->member, join_error_atom::value, why);
    }
    if (waiter_) waiter_->deliver(to_caf_error(*failure_));
  }

  LaunchInfo info_;
  std::vector<std::optional<Joined>> joined_;
  caf::actor rendezvous_;
  caf::actor coordinator_;
  std::optional<caf::typed_response_promise<std::vector<caf::actor>>> waiter_;
  std::optional<Status> failure_;
  bool complete_ = false;
};

}  // namespace

// -- WorldHost --

Result<std::unique_ptr<WorldHost>> WorldHost::open(caf::actor_system& system, const LaunchInfo& info) {
  auto world = system.spawn<WorldActor>(info);
  auto port = system.middleman().publish(world, static_cast<std::uint16_t>(info.master_port), nullptr, true);
  if (!port) {
    caf::anon_send_exit(world, caf::exit_reason::user_shutdown);
    return Status{ErrorCode::io_error, "rank 0 cannot listen on MASTER_PORT=" + std::to_string(info.master_port) + ": " +
                                           system.render(port.error())};
  }
  return std::unique_ptr<WorldHost>(new WorldHost(system, info, world, *port));
}

WorldHost::~WorldHost() {
  if (world_) caf::anon_send_exit(world_, caf::exit_reason::user_shutdown);
}

Result<std::vector<caf::actor>> WorldHost::gather(caf::actor worker0, caf::actor rendezvous, caf::actor coordinator) {
  caf::scoped_actor self{system_};
  std::vector<caf::actor> out;
  Status st;
  self->request(world_, info_.join_timeout + std::chrono::seconds(5), await_atom::value, worker0, rendezvous, coordinator)
      .receive([&](std::vector<caf::actor>& workers) { out = std::move(workers); },
               [&](caf::error& err) { st = from_caf_error(err); });
  if (!st.is_ok()) return st;
  return out;
}

void WorldHost::shutdown(int code) {
  if (!world_) return;
  caf::anon_send(world_, shutdown_atom::value, static_cast<std::int32_t>(code));
  world_ = nullptr;
}

// -- WorldMember --

WorldMember::WorldMember(caf::actor_system& system, LaunchInfo info)
    : system_(system), info_(std::move(info)), self_(std::make_unique<caf::scoped_actor>(system)) {}

WorldMember::~WorldMember() = default;

Result<JoinedWorld> WorldMember::join(caf::actor worker) {
  const auto deadline = Clock::now() + info_.join_timeout;
  std::string last_error;
  while (!world_) {
    auto world = system_.middleman().remote_actor(info_.master_addr, static_cast<std::uint16_t>(info_.master_port));
    if (world) {
      world_ = *world;
      break;
    }
    last_error = system_.render(world.error());
    if (Clock::now() >= deadline) {
      return Status{ErrorCode::timeout, "rank " + std::to_string(info_.rank) + " cannot reach rank 0 at " +
                                            info_.master() + " within " +
                                            std::to_string(info_.join_timeout.count() / 1000) + " s (" + last_error +
                                            "): is rank 0 running, with this MASTER_ADDR and MASTER_PORT?"};
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  auto& self = *self_;
  self->monitor(world_);
  self->send(world_, join_atom::value, static_cast<std::int32_t>(info_.rank), static_cast<std::int32_t>(info_.world_size),
             info_.wire_version, worker);
  Result<JoinedWorld> out = Status{ErrorCode::internal, "no answer"};
  // Rank 0 knows which ranks are missing and says so when its own limit passes: wait a little
  // longer than that for its answer.
  auto remaining = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()) +
                   std::chrono::seconds(10);
  self->receive(
      [&](peers_atom, caf::actor& rendezvous, caf::actor& coordinator) {
        out = JoinedWorld{std::move(rendezvous), std::move(coordinator)};
      },
      [&](join_error_atom, const std::string& why) { out = Status{ErrorCode::aborted, "rank 0 stopped the start: " + why}; },
      [&](const caf::down_msg&) {
        out = Status{ErrorCode::aborted, "rank 0 at " + info_.master() + " went away before the world was complete"};
      },
      caf::after(remaining) >>
          [&] {
            out = Status{ErrorCode::timeout, "rank 0 at " + info_.master() + " did not complete the world within " +
                                                 std::to_string(info_.join_timeout.count() / 1000) + " s"};
          });
  return out;
}

int WorldMember::serve(std::string& lost) {
  int code = 1;
  bool done = false;
  auto& self = *self_;
  self->receive_while([&] { return !done; })(
      [&](shutdown_atom, std::int32_t c) {
        code = c;
        done = true;
      },
      [&](join_error_atom, const std::string& why) {
        lost = "rank 0 gave up: " + why;
        done = true;
      },
      [&](const caf::down_msg&) {
        lost = "lost rank 0 at " + info_.master();
        done = true;
      });
  return code;
}

}  // namespace stagehand
