#include "actors/process_world.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <set>
#include <thread>

#include "actors/messages.hpp"

namespace stagehand {

namespace {

using Clock = std::chrono::steady_clock;

// -- launch --

Result<int> int_setting(const std::optional<int>& flag, const char* flag_name, const char* env, int fallback,
                        bool* found = nullptr) {
  if (flag) {
    if (found != nullptr) *found = true;
    return *flag;
  }
  const char* text = std::getenv(env);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  long value = std::strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || value < 0 || value > 1000000) {
    return Status{ErrorCode::config_error, std::string(env) + "='" + text + "' is not a non-negative integer (or set " +
                                               flag_name + ")"};
  }
  if (found != nullptr) *found = true;
  return static_cast<int>(value);
}

// -- collectives --

/// Receives other ranks' collective contributions into the inbox.
caf::behavior collective_endpoint(caf::event_based_actor*, std::shared_ptr<CollectiveInbox> inbox) {
  return {
      [inbox](collective_atom, std::int32_t group, std::int64_t seq, std::int32_t from, std::uint64_t offset,
              std::vector<float>& data) {
        inbox->deliver({group, seq, from}, {offset, std::move(data)});
      },
  };
}

// -- world --

struct Joined {
  caf::actor worker;
  caf::actor endpoint;
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
        [this](join_atom, std::int32_t rank, std::int32_t world_size, const std::string& version, caf::actor worker,
               caf::actor endpoint) {
          on_join(rank, world_size, version, std::move(worker), std::move(endpoint));
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
        [this](await_atom, caf::actor worker0, caf::actor endpoint0, caf::actor coordinator)
            -> caf::result<std::vector<caf::actor>, std::vector<caf::actor>> {
          joined_[0] = Joined{std::move(worker0), std::move(endpoint0), caf::actor{}};
          coordinator_ = std::move(coordinator);
          waiter_ = make_response_promise<std::vector<caf::actor>, std::vector<caf::actor>>();
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
  void on_join(std::int32_t rank, std::int32_t world_size, const std::string& version, caf::actor worker,
               caf::actor endpoint) {
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
    joined_[static_cast<std::size_t>(rank)] = Joined{std::move(worker), std::move(endpoint), member};
    try_complete();
  }

  void try_complete() {
    if (complete_ || failure_ || !waiter_) return;
    for (const auto& j : joined_) {
      if (!j) return;
    }
    complete_ = true;
    std::vector<caf::actor> workers;
    std::vector<caf::actor> endpoints;
    for (const auto& j : joined_) {
      workers.push_back(j->worker);
      endpoints.push_back(j->endpoint);
    }
    for (std::size_t r = 1; r < joined_.size(); ++r) send(joined_[r]->member, peers_atom::value, endpoints, coordinator_);
    waiter_->deliver(std::move(workers), std::move(endpoints));
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
  caf::actor coordinator_;
  std::optional<caf::typed_response_promise<std::vector<caf::actor>, std::vector<caf::actor>>> waiter_;
  std::optional<Status> failure_;
  bool complete_ = false;
};

}  // namespace

Result<LaunchInfo> read_launch_info(const LaunchFlags& flags) {
  LaunchInfo info;
  bool has_world = false;
  SH_ASSIGN_OR_RETURN(info.world_size, int_setting(flags.world_size, "--world-size", "WORLD_SIZE", 1, &has_world));
  SH_ASSIGN_OR_RETURN(info.rank, int_setting(flags.rank, "--rank", "RANK", 0));
  SH_ASSIGN_OR_RETURN(info.local_rank, int_setting(flags.local_rank, "--local-rank", "LOCAL_RANK", info.rank));
  SH_ASSIGN_OR_RETURN(info.master_port, int_setting(flags.master_port, "--master-port", "MASTER_PORT", 29500));
  if (flags.master_addr) {
    info.master_addr = *flags.master_addr;
  } else if (const char* addr = std::getenv("MASTER_ADDR"); addr != nullptr && *addr != '\0') {
    info.master_addr = addr;
  }
  if (has_world && info.world_size < 1) {
    return Status{ErrorCode::config_error, "WORLD_SIZE (--world-size) must be at least 1"};
  }
  if (info.rank >= info.world_size) {
    return Status{ErrorCode::config_error, "RANK=" + std::to_string(info.rank) + " must be below WORLD_SIZE=" +
                                               std::to_string(info.world_size)};
  }
  if (info.multi_process() && (info.master_port < 1 || info.master_port > 65535)) {
    return Status{ErrorCode::config_error, "MASTER_PORT=" + std::to_string(info.master_port) + " is not a TCP port"};
  }
  return info;
}

void register_wire_types(caf::actor_system_config& config) {
  config.load<caf::io::middleman>();
  config.add_message_type<std::vector<float>>("std::vector<float>");
  config.add_message_type<std::vector<std::int32_t>>("std::vector<int32_t>");
}

// -- CollectiveInbox --

void CollectiveInbox::deliver(Key key, Part part) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    parts_[key] = std::move(part);
  }
  arrived_.notify_all();
}

Result<std::map<std::int32_t, CollectiveInbox::Part>> CollectiveInbox::take(std::int32_t group, std::int64_t seq,
                                                                             const std::vector<int>& senders,
                                                                             std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto all_there = [&] {
    return std::all_of(senders.begin(), senders.end(),
                       [&](int s) { return parts_.count({group, seq, static_cast<std::int32_t>(s)}) != 0; });
  };
  bool ready = arrived_.wait_for(lock, timeout, [&] { return closed_.has_value() || all_there(); });
  if (closed_) return Status{ErrorCode::aborted, "collective stopped: " + *closed_};
  if (!ready) {
    std::string missing;
    for (int s : senders) {
      if (parts_.count({group, seq, static_cast<std::int32_t>(s)}) == 0) {
        missing += (missing.empty() ? "" : ", ") + std::to_string(s);
      }
    }
    return Status{ErrorCode::timeout, "collective of group " + std::to_string(group) + ": no contribution from rank(s) " +
                                          missing + " within " + std::to_string(timeout.count() / 1000) + " s"};
  }
  std::map<std::int32_t, Part> out;
  for (int s : senders) {
    auto it = parts_.find({group, seq, static_cast<std::int32_t>(s)});
    out[static_cast<std::int32_t>(s)] = std::move(it->second);
    parts_.erase(it);
  }
  return out;
}

void CollectiveInbox::set_peers(std::vector<caf::actor> endpoints) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    peers_ = std::move(endpoints);
  }
  arrived_.notify_all();
}

Result<std::vector<caf::actor>> CollectiveInbox::peers(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  arrived_.wait_for(lock, timeout, [&] { return closed_.has_value() || peers_.has_value(); });
  if (closed_) return Status{ErrorCode::aborted, "collective stopped: " + *closed_};
  if (!peers_) return Status{ErrorCode::timeout, "the other ranks' endpoints did not arrive in time"};
  return *peers_;
}

void CollectiveInbox::close(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!closed_) closed_ = reason;
  }
  arrived_.notify_all();
}

// -- ProcessCollectives --

/// One group whose members (ranks, in member order) are in other processes.
class ProcessCollectives::Group final : public Collective {
 public:
  Group(std::int32_t id, std::vector<int> ranks, int own_rank, std::shared_ptr<CollectiveInbox> inbox,
        std::chrono::milliseconds timeout)
      : id_(id), ranks_(std::move(ranks)), own_rank_(own_rank), inbox_(std::move(inbox)), timeout_(timeout) {
    for (int r : ranks_) {
      if (r != own_rank_) others_.push_back(r);
    }
  }

  int size() const override { return static_cast<int>(ranks_.size()); }

  Status all_reduce_sum(int member, float* data, std::size_t count) override {
    if (ranks_.size() == 1) return Status::ok();
    SH_ASSIGN_OR_RETURN(auto parts, exchange(std::vector<float>(data, data + count), 0));
    std::vector<float> sum(count, 0.0f);
    for (std::size_t m = 0; m < ranks_.size(); ++m) {
      const float* contribution = static_cast<int>(m) == member ? data : parts[ranks_[m]].data.data();
      if (static_cast<int>(m) != member && parts[ranks_[m]].data.size() != count) {
        return Status{ErrorCode::internal, "collective of group " + std::to_string(id_) + ": rank " +
                                               std::to_string(ranks_[m]) + " sent a different length"};
      }
      for (std::size_t i = 0; i < count; ++i) sum[i] += contribution[i];
    }
    std::copy(sum.begin(), sum.end(), data);
    return Status::ok();
  }

  Status all_gather(int, float* full, std::size_t offset, std::size_t count) override {
    if (ranks_.size() == 1) return Status::ok();
    SH_ASSIGN_OR_RETURN(auto parts, exchange(std::vector<float>(full + offset, full + offset + count), offset));
    for (auto& [rank, part] : parts) std::copy(part.data.begin(), part.data.end(), full + part.offset);
    return Status::ok();
  }

 private:
  Result<std::map<std::int32_t, CollectiveInbox::Part>> exchange(const std::vector<float>& mine, std::uint64_t offset) {
    const std::int64_t seq = ++seq_;
    if (peers_.empty()) {
      // Set once per world: fetched at the first collective, then kept.
      SH_ASSIGN_OR_RETURN(peers_, inbox_->peers(timeout_));
    }
    for (int r : others_) {
      if (static_cast<std::size_t>(r) >= peers_.size() || !peers_[static_cast<std::size_t>(r)]) {
        return Status{ErrorCode::internal, "no collective endpoint for rank " + std::to_string(r)};
      }
      caf::anon_send(peers_[static_cast<std::size_t>(r)], collective_atom::value, id_, seq,
                     static_cast<std::int32_t>(own_rank_), offset, mine);
    }
    return inbox_->take(id_, seq, others_, timeout_);
  }

  std::int32_t id_;
  std::vector<int> ranks_;
  int own_rank_;
  std::vector<int> others_;
  std::shared_ptr<CollectiveInbox> inbox_;
  std::chrono::milliseconds timeout_;
  std::vector<caf::actor> peers_;
  std::int64_t seq_ = 0;
};

ProcessCollectives::ProcessCollectives(caf::actor_system& system, std::chrono::milliseconds timeout)
    : system_(system),
      timeout_(timeout),
      inbox_(std::make_shared<CollectiveInbox>()),
      endpoint_(system.spawn(collective_endpoint, inbox_)) {}

ProcessCollectives::~ProcessCollectives() {
  close("shutting down");
  caf::anon_send_exit(endpoint_, caf::exit_reason::user_shutdown);
}

void ProcessCollectives::set_peers(std::vector<caf::actor> endpoints) { inbox_->set_peers(std::move(endpoints)); }

void ProcessCollectives::close(const std::string& reason) { inbox_->close(reason); }

RankGroups ProcessCollectives::groups(const ParallelLayout& layout, int rank) {
  const int tp = layout.tensor_parallel;
  const int dp = layout.data_parallel;
  std::vector<int> tensor_ranks;
  for (int t = 0; t < tp; ++t) tensor_ranks.push_back(layout.data_index(rank) * tp + t);
  std::vector<int> data_ranks;
  for (int d = 0; d < dp; ++d) data_ranks.push_back(d * tp + layout.tensor_index(rank));
  // Group ids: tensor groups 0..dp-1, data groups dp..dp+tp-1.
  auto tensor_id = static_cast<std::int32_t>(layout.data_index(rank));
  auto data_id = static_cast<std::int32_t>(dp + layout.tensor_index(rank));
  return {std::make_shared<Group>(tensor_id, tensor_ranks, rank, inbox_, timeout_),
          std::make_shared<Group>(data_id, data_ranks, rank, inbox_, timeout_)};
}

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

Result<std::pair<std::vector<caf::actor>, std::vector<caf::actor>>> WorldHost::gather(caf::actor worker0,
                                                                                      caf::actor endpoint0,
                                                                                      caf::actor coordinator) {
  caf::scoped_actor self{system_};
  std::pair<std::vector<caf::actor>, std::vector<caf::actor>> out;
  Status st;
  self->request(world_, info_.join_timeout + std::chrono::seconds(5), await_atom::value, worker0, endpoint0, coordinator)
      .receive(
          [&](std::vector<caf::actor>& workers, std::vector<caf::actor>& endpoints) {
            out = {std::move(workers), std::move(endpoints)};
          },
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

Result<JoinedWorld> WorldMember::join(caf::actor worker, caf::actor endpoint) {
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
             info_.wire_version, worker, endpoint);
  Result<JoinedWorld> out = Status{ErrorCode::internal, "no answer"};
  // Rank 0 knows which ranks are missing and says so when its own limit passes: wait a little
  // longer than that for its answer.
  auto remaining = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()) +
                   std::chrono::seconds(10);
  self->receive(
      [&](peers_atom, std::vector<caf::actor>& endpoints, caf::actor& coordinator) {
        out = JoinedWorld{std::move(endpoints), std::move(coordinator)};
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
