#include "stagehand/actors/process_world.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <spdlog/spdlog.h>

#include <optional>
#include <set>
#include <thread>

#include "stagehand/actors/messages.hpp"
#include "stagehand/core/log.hpp"

namespace stagehand {

namespace {

using Clock = std::chrono::steady_clock;

std::string seconds(std::chrono::milliseconds limit) { return std::to_string(limit.count() / 1000) + " s"; }

/// One process of the world other than rank 0's.
struct Member {
  caf::actor actor;
  int first_rank = 0;
  std::vector<worker_actor> workers;
  bool left = false;
  bool gone = false;

  std::string ranks() const {
    const int last = first_rank + static_cast<int>(workers.size()) - 1;
    return last == first_rank ? "rank " + std::to_string(first_rank)
                              : "ranks " + std::to_string(first_rank) + "-" + std::to_string(last);
  }
};

/// Rank 0's published actor: collects joins, checks them, completes the world, then watches
/// the members.
class WorldActor : public caf::event_based_actor {
 public:
  WorldActor(caf::actor_config& cfg, LaunchInfo info)
      : caf::event_based_actor(cfg), info_(std::move(info)), owner_(static_cast<std::size_t>(info_.world_size), -1) {}

  caf::behavior make_behavior() override {
    set_down_handler([this](const caf::down_msg& down) { on_down(down); });
    delayed_send(this, info_.join_timeout, timeout_atom::value);
    return {
        [this](join_atom, std::int32_t first, std::int32_t world_size, const std::string& version,
               const std::string& job, std::vector<worker_actor>& workers) {
          on_join(first, world_size, version, job, std::move(workers));
        },
        // The join of stagehand-wire/3 and before (no job): refused by its version, named.
        [this](join_atom, std::int32_t first, std::int32_t world_size, const std::string& version,
               std::vector<worker_actor>& workers) { on_join(first, world_size, version, "", std::move(workers)); },
        [this](timeout_atom) {
          if (complete_ || failure_) return;
          std::string missing;
          for (std::size_t r = 0; r < owner_.size(); ++r) {
            if (owner_[r] < 0) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
          }
          fail("rank(s) " + missing + " of WORLD_SIZE=" + std::to_string(info_.world_size) + " did not join rank 0 at " +
               info_.master() + " within " + seconds(info_.join_timeout) +
               ": were they started, with the same MASTER_ADDR, port and WORLD_SIZE?");
        },
        [this](await_atom, std::vector<worker_actor>& local, caf::actor& rendezvous, coordinator_actor& coordinator)
            -> caf::result<std::vector<worker_actor>> {
          local_ = std::move(local);
          rendezvous_ = std::move(rendezvous);
          coordinator_ = std::move(coordinator);
          if (failure_) return to_caf_error(*failure_);
          waiter_ = make_response_promise<std::vector<worker_actor>>();
          auto promise = *waiter_;
          for (std::size_t r = 0; r < local_.size() && r < owner_.size(); ++r) owner_[r] = kHost;
          try_complete();
          return promise;
        },
        [this](leave_atom) {
          if (auto* m = member_of(current_sender())) m->left = true;
          check_leaves();
        },
        [this](leave_atom, await_atom) -> caf::result<bool> {
          leave_waiter_ = make_response_promise<bool>();
          auto promise = *leave_waiter_;
          check_leaves();
          return promise;
        },
        [this](shutdown_atom, std::int32_t code) {
          for (auto& m : members_) {
            if (!m.gone) send(m.actor, shutdown_atom::value, code);
          }
          quit();
        },
    };
  }

  void on_exit() override {
    // A waiting promise holds this actor (and through it every Worker's handle): answered now.
    const Status stopped{ErrorCode::aborted, "the world of processes was shut down"};
    if (waiter_) waiter_->deliver(to_caf_error(stopped));
    if (leave_waiter_) leave_waiter_->deliver(to_caf_error(stopped));
    waiter_.reset();
    leave_waiter_.reset();
    members_.clear();
    local_.clear();
    coordinator_ = nullptr;
    rendezvous_ = nullptr;
  }

 private:
  static constexpr int kHost = 1 << 30;

  Member* member_of(const caf::strong_actor_ptr& from) {
    for (auto& m : members_) {
      if (caf::actor_cast<caf::strong_actor_ptr>(m.actor) == from) return &m;
    }
    return nullptr;
  }

  void on_join(std::int32_t first, std::int32_t world_size, const std::string& version, const std::string& job,
               std::vector<worker_actor> workers) {
    auto joiner = caf::actor_cast<caf::actor>(current_sender());
    const int count = static_cast<int>(workers.size());
    std::string who = "the process joining as rank " + std::to_string(first);
    if (version == info_.wire_version && job != info_.job) {
      // A process of another job: refused, and this job's start goes on (its own rank may still
      // come).
      const std::string stranger = who + " belongs to another job ('" + job + "'; rank 0 at " + info_.master() +
                                   " runs '" + info_.job +
                                   "'): every process of a job passes the same checkpoint root, and two jobs on "
                                   "one host need their own ports (STAGEHAND_PORT)";
      logger()->warn("{}", stranger);
      if (joiner) send(joiner, join_error_atom::value, stranger);
      return;
    }
    std::string problem;
    if (version != info_.wire_version) {
      problem = who + " speaks " + version + ", rank 0 speaks " + info_.wire_version +
                " (every process must run the same Stagehand build)";
    } else if (world_size != info_.world_size) {
      problem = who + " was started with WORLD_SIZE=" + std::to_string(world_size) + ", rank 0 with WORLD_SIZE=" +
                std::to_string(info_.world_size);
    } else if (first <= 0 || count < 1 || first + count > info_.world_size) {
      problem = who + ": its ranks must lie in 1.." + std::to_string(info_.world_size - 1) +
                " for processes joining rank 0";
    } else if (complete_ || failure_) {
      problem = who + ": the world is already " + (complete_ ? "complete" : "failed");
    } else {
      for (int r = first; r < first + count; ++r) {
        if (owner_[static_cast<std::size_t>(r)] >= 0) {
          problem = who + ": rank " + std::to_string(r) + " has already joined (two processes with RANK=" +
                    std::to_string(r) + "?)";
          break;
        }
      }
    }
    if (!problem.empty()) {
      if (joiner) send(joiner, join_error_atom::value, problem);
      fail(problem);
      return;
    }
    monitor(joiner);
    for (int r = first; r < first + count; ++r) owner_[static_cast<std::size_t>(r)] = static_cast<int>(members_.size());
    members_.push_back(Member{std::move(joiner), first, std::move(workers), false, false});
    try_complete();
  }

  void try_complete() {
    if (complete_ || failure_ || !waiter_) return;
    for (int owner : owner_) {
      if (owner < 0) return;
    }
    complete_ = true;
    std::vector<worker_actor> workers(owner_.size());
    for (std::size_t r = 0; r < local_.size(); ++r) workers[r] = local_[r];
    for (const auto& m : members_) {
      for (std::size_t i = 0; i < m.workers.size(); ++i) workers[static_cast<std::size_t>(m.first_rank) + i] = m.workers[i];
      send(m.actor, peers_atom::value, rendezvous_, coordinator_);
    }
    waiter_->deliver(std::move(workers));
    waiter_.reset();
  }

  void on_down(const caf::down_msg& down) {
    for (auto& m : members_) {
      if (m.actor.address() != down.source || m.gone) continue;
      m.gone = true;
      if (!complete_) {
        fail(m.ranks() + " went away before every rank had joined");
      } else if (!m.left && coordinator_) {
        for (std::size_t i = 0; i < m.workers.size(); ++i) {
          send(coordinator_, rank_down_atom::value, static_cast<std::int32_t>(m.first_rank + static_cast<int>(i)),
               std::string("its process exited or cannot be reached"));
        }
      }
    }
    check_leaves();
  }

  void check_leaves() {
    if (!leave_waiter_) return;
    for (const auto& m : members_) {
      if (!m.left && !m.gone) return;
    }
    leave_waiter_->deliver(true);
    leave_waiter_.reset();
  }

  void fail(const std::string& why) {
    if (failure_) return;
    failure_ = Status{ErrorCode::aborted, why};
    for (auto& m : members_) send(m.actor, join_error_atom::value, why);
    if (waiter_) {
      waiter_->deliver(to_caf_error(*failure_));
      waiter_.reset();
    }
  }

  LaunchInfo info_;
  /// Per rank: kHost (this process), the index of its member, or -1 when it has not joined.
  std::vector<int> owner_;
  std::vector<Member> members_;
  std::vector<worker_actor> local_;
  caf::actor rendezvous_;
  coordinator_actor coordinator_;
  std::optional<caf::typed_response_promise<std::vector<worker_actor>>> waiter_;
  std::optional<caf::typed_response_promise<bool>> leave_waiter_;
  std::optional<Status> failure_;
  bool complete_ = false;
};

}  // namespace

Result<caf::actor> connect_remote_actor(caf::actor_system& system, const std::string& host, std::uint16_t port,
                                        std::chrono::milliseconds limit) {
  caf::scoped_actor self{system};
  Result<caf::actor> out = Status{ErrorCode::internal, "no answer"};
  self->request(system.middleman().actor_handle(), limit, caf::connect_atom::value, host, port)
      .receive(
          [&](const caf::node_id&, caf::strong_actor_ptr& ptr, const std::set<std::string>&) {
            if (ptr) {
              out = caf::actor_cast<caf::actor>(std::move(ptr));
            } else {
              out = Status{ErrorCode::not_found, "nothing is published at " + host + ":" + std::to_string(port)};
            }
          },
          [&](caf::error& err) {
            out = err == caf::sec::request_timeout
                      ? Status{ErrorCode::timeout, host + ":" + std::to_string(port) + " did not answer within " +
                                                       std::to_string(limit.count()) + " ms"}
                      : Status{ErrorCode::io_error, system.render(err)};
          });
  return out;
}

// -- WorldHost --

Result<std::unique_ptr<WorldHost>> WorldHost::open(caf::actor_system& system, const LaunchInfo& info) {
  auto world = system.spawn<WorldActor>(info);
  auto port = system.middleman().publish(world, static_cast<std::uint16_t>(info.master_port), nullptr, true);
  if (!port) {
    caf::anon_send_exit(world, caf::exit_reason::user_shutdown);
    return Status{ErrorCode::io_error, "rank 0 cannot listen on port " + std::to_string(info.master_port) + ": " +
                                           system.render(port.error())};
  }
  return std::unique_ptr<WorldHost>(new WorldHost(system, info, world, *port));
}

WorldHost::~WorldHost() { shutdown(1); }

Result<std::vector<worker_actor>> WorldHost::gather(std::vector<worker_actor> local, caf::actor rendezvous,
                                                    coordinator_actor coordinator) {
  caf::scoped_actor self{system_};
  std::vector<worker_actor> out;
  Status st;
  self->request(world_, info_.join_timeout + std::chrono::seconds(5), await_atom::value, std::move(local),
                std::move(rendezvous), std::move(coordinator))
      .receive([&](std::vector<worker_actor>& workers) { out = std::move(workers); },
               [&](caf::error& err) { st = from_caf_error(err); });
  if (!st.is_ok()) return st;
  return out;
}

Status WorldHost::await_leaves(std::chrono::milliseconds limit) {
  if (!world_) return Status::ok();
  caf::scoped_actor self{system_};
  Status st;
  self->request(world_, limit, leave_atom::value, await_atom::value)
      .receive([](bool) {},
               [&](caf::error& err) {
                 st = err == caf::sec::request_timeout
                          ? Status{ErrorCode::timeout, "not every process closed its side of the world within " +
                                                           seconds(limit)}
                          : from_caf_error(err);
               });
  return st;
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

Result<JoinedWorld> WorldMember::join(std::vector<worker_actor> local) {
  const auto deadline = Clock::now() + info_.join_timeout;
  std::string last_error;
  const auto port = static_cast<std::uint16_t>(info_.master_port);
  while (!world_) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      return Status{ErrorCode::timeout, "rank " + std::to_string(info_.rank) + " cannot reach rank 0 at " +
                                            info_.master() + " within the join limit of " +
                                            seconds(info_.join_timeout) + " (" + last_error +
                                            "): is rank 0 running, with this MASTER_ADDR and port?"};
    }
    // Each attempt bounded, so that a port that accepts and never answers cannot hold the join.
    auto world = connect_remote_actor(system_, info_.master_addr, port, std::min(left, std::chrono::milliseconds(5000)));
    if (world.is_ok()) {
      world_ = *world;
      break;
    }
    last_error = world.status().message();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  auto& self = *self_;
  self->monitor(world_);
  self->send(world_, join_atom::value, static_cast<std::int32_t>(info_.rank),
             static_cast<std::int32_t>(info_.world_size), info_.wire_version, info_.job, std::move(local));
  Result<JoinedWorld> out = Status{ErrorCode::internal, "no answer"};
  // Rank 0 knows which ranks are missing and says so when its own limit passes: wait a little
  // longer than that for its answer.
  auto remaining =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()) + std::chrono::seconds(10);
  self->receive(
      [&](peers_atom, caf::actor& rendezvous, coordinator_actor& coordinator) {
        out = JoinedWorld{std::move(rendezvous), std::move(coordinator)};
      },
      [&](join_error_atom, const std::string& why) { out = Status{ErrorCode::aborted, "rank 0 stopped the start: " + why}; },
      [&](const caf::down_msg&) {
        out = Status{ErrorCode::aborted, "rank 0 at " + info_.master() + " went away before the world was complete"};
      },
      caf::after(remaining) >>
          [&] {
            out = Status{ErrorCode::timeout, "rank 0 at " + info_.master() + " did not complete the world within " +
                                                 seconds(info_.join_timeout)};
          });
  return out;
}

int WorldMember::serve(std::string& lost, const std::atomic<bool>* stop) {
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
      },
      caf::after(std::chrono::milliseconds(100)) >>
          [&] {
            if (stop != nullptr && stop->load()) {
              lost = "stop requested";
              done = true;
            }
          });
  return code;
}

void WorldMember::leave() {
  if (world_) (*self_)->send(world_, leave_atom::value);
}

}  // namespace stagehand
