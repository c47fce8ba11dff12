#include "stagehand/models/process_collectives.hpp"

#include <arpa/inet.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <caf/all.hpp>

#include <algorithm>
#include <array>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>

#include "stagehand/actors/messages.hpp"

namespace stagehand {

namespace {

using Clock = std::chrono::steady_clock;
using gloo::transport::UnboundBuffer;

std::string seconds_text(std::chrono::milliseconds d) {
  return std::to_string(d.count() / 1000) + " s";
}

// -- rendezvous --

/// Rank 0's key-value store for Gloo's rendezvous: a get waits (without polling) until the key is
/// set; the asker's own time limit ends the wait.
class RendezvousStore : public caf::event_based_actor {
 public:
  using caf::event_based_actor::event_based_actor;

  caf::behavior make_behavior() override {
    return {
        [this](rdv_set_atom, const std::string& key, std::string& value) {
          auto waiting = waiting_.find(key);
          if (waiting != waiting_.end()) {
            for (auto& promise : waiting->second)
              promise.deliver(value);
            waiting_.erase(waiting);
          }
          values_[key] = std::move(value);
        },
        [this](rdv_get_atom, const std::string& key) -> caf::result<std::string> {
          if (auto it = values_.find(key); it != values_.end()) return it->second;
          auto promise = make_response_promise<std::string>();
          waiting_[key].push_back(promise);
          return promise;
        },
    };
  }

 private:
  std::map<std::string, std::string> values_;
  std::map<std::string, std::vector<caf::typed_response_promise<std::string>>> waiting_;
};

/// Gloo's view of the rendezvous store actor. Gloo reports a failed rendezvous by exception; so
/// does this store (caught where the group connects).
class ActorStore final : public gloo::rendezvous::Store {
 public:
  ActorStore(caf::actor_system& system, caf::actor store, std::chrono::milliseconds timeout)
      : system_(system), store_(std::move(store)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    caf::scoped_actor self{system_};
    std::optional<caf::error> failed;
    self->request(store_, timeout_, rdv_set_atom::value, key, std::string(data.begin(), data.end()))
        .receive([] {}, [&](caf::error& err) { failed = std::move(err); });
    if (failed)
      throw std::runtime_error("publishing '" + key + "' at rank 0: " + system_.render(*failed));
  }

  std::vector<char> get(const std::string& key) override { return fetch(key, timeout_); }

  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    for (const auto& key : keys)
      fetch(key, timeout);
  }

 private:
  std::vector<char> fetch(const std::string& key, std::chrono::milliseconds timeout) {
    caf::scoped_actor self{system_};
    std::optional<caf::error> failed;
    std::vector<char> out;
    self->request(store_, timeout, rdv_get_atom::value, key)
        .receive([&](std::string& value) { out.assign(value.begin(), value.end()); },
                 [&](caf::error& err) { failed = std::move(err); });
    if (failed) {
      throw std::runtime_error("'" + key + "' was not published at rank 0 within " +
                               seconds_text(timeout) + " (" + system_.render(*failed) + ")");
    }
    return out;
  }

  caf::actor_system& system_;
  caf::actor store_;
  std::chrono::milliseconds timeout_;
};

/// This host's address on the route to rank 0 (a connected UDP socket sends nothing): the address
/// the other ranks reach this one at, on one host (127.0.0.1) or several.
std::string local_address_towards(const std::string& master_addr) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(master_addr.c_str(), "9", &hints, &found) != 0 || found == nullptr)
    return master_addr;
  std::string out = master_addr;
  int fd = ::socket(found->ai_family, SOCK_DGRAM, 0);
  sockaddr_storage local{};
  socklen_t length = sizeof(local);
  char text[INET6_ADDRSTRLEN] = {};
  if (fd >= 0 && ::connect(fd, found->ai_addr, found->ai_addrlen) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0) {
    const void* addr =
        local.ss_family == AF_INET6
            ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr)
            : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr);
    if (::inet_ntop(local.ss_family, addr, text, sizeof(text)) != nullptr) out = text;
  }
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(found);
  return out;
}

}  // namespace

// -- shared state of one process's groups --

/// What the groups of one process share: the rendezvous, the Gloo device, and the stop.
struct ProcessCollectives::Shared {
  caf::actor_system* system = nullptr;
  std::string master_addr;
  std::chrono::milliseconds timeout{0};

  std::mutex mutex;
  std::condition_variable changed;
  caf::actor store;
  std::optional<std::string> closed;
  std::shared_ptr<gloo::transport::Device> device;
  /// Transfers in flight, aborted by close().
  std::set<UnboundBuffer*> pending;

  /// Waits for the rendezvous store; an error once closed or when the limit passed.
  Result<caf::actor> await_store() {
    std::unique_lock<std::mutex> lock(mutex);
    changed.wait_for(lock, timeout, [&] { return closed.has_value() || store; });
    if (closed) return Status{ErrorCode::aborted, "collectives stopped: " + *closed};
    if (!store)
      return Status{ErrorCode::timeout,
                    "the rendezvous at rank 0 was not announced within " + seconds_text(timeout)};
    return store;
  }

  /// The process's one Gloo device, listening on this host's address towards rank 0 (or on the
  /// interface GLOO_SOCKET_IFNAME names, as in PyTorch).
  std::shared_ptr<gloo::transport::Device> gloo_device() {
    std::lock_guard<std::mutex> lock(mutex);
    if (!device) {
      gloo::transport::tcp::attr attr;
      if (const char* iface = std::getenv("GLOO_SOCKET_IFNAME");
          iface != nullptr && *iface != '\0') {
        attr.iface = iface;
      } else {
        attr.hostname = local_address_towards(master_addr);
      }
      device = gloo::transport::tcp::CreateDevice(attr);
    }
    return device;
  }

  void close(const std::string& reason) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!closed) closed = reason;
    for (auto* buffer : pending) {
      buffer->abortWaitRecv();
      buffer->abortWaitSend();
    }
    changed.notify_all();
  }
};

namespace {

/// One group of ranks in separate processes, over its own Gloo context.
class GlooGroup final : public Collective {
 public:
  GlooGroup(std::shared_ptr<ProcessCollectives::Shared> shared, std::string name,
            std::vector<int> ranks, int member)
      : shared_(std::move(shared)),
        name_(std::move(name)),
        ranks_(std::move(ranks)),
        member_(member),
        heads_(ranks_.size()),
        parts_(ranks_.size()),
        large_(ranks_.size()) {}

  ~GlooGroup() override {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    for (auto& buffers : inbox_) {
      for (auto& buffer : buffers)
        shared_->pending.erase(buffer.get());
    }
  }

  int size() const override { return static_cast<int>(ranks_.size()); }

  Status all_reduce_sum(int, float* data, std::size_t count) override {
    if (ranks_.size() == 1) return Status::ok();
    SH_RETURN_IF_ERROR(exchange({0, count}, data));
    for (std::size_t m = 0; m < ranks_.size(); ++m) {
      if (static_cast<int>(m) != member_ && heads_[m].count != count) {
        return Status{ErrorCode::internal, "all-reduce of the " + describe() + ": rank " +
                                               std::to_string(ranks_[m]) + " sent " +
                                               std::to_string(heads_[m].count) + " floats, not " +
                                               std::to_string(count)};
      }
    }
    // Member order from 0.0f, as HostGroup adds: the same bits whichever group carries the sum.
    sum_.assign(count, 0.0f);
    for (std::size_t m = 0; m < ranks_.size(); ++m) {
      const float* part = static_cast<int>(m) == member_ ? data : parts_[m];
      for (std::size_t i = 0; i < count; ++i)
        sum_[i] += part[i];
    }
    std::copy(sum_.begin(), sum_.end(), data);
    return Status::ok();
  }

  Status all_gather(int, float* full, std::size_t full_count, std::size_t offset,
                    std::size_t count) override {
    if (ranks_.size() == 1) return Status::ok();
    // Each member's region is its own to choose: it travels in front of its floats.
    SH_RETURN_IF_ERROR(exchange({offset, count}, full + offset));
    for (std::size_t m = 0; m < ranks_.size(); ++m) {
      if (static_cast<int>(m) == member_) continue;
      const Head& head = heads_[m];
      if (head.offset > full_count || head.count > full_count - head.offset) {
        return Status{ErrorCode::internal,
                      "all-gather of the " + describe() + ": rank " + std::to_string(ranks_[m]) +
                          " sent a region outside the " + std::to_string(full_count) + " floats"};
      }
      std::copy_n(parts_[m], head.count, full + head.offset);
    }
    return Status::ok();
  }

 private:
  /// What a member sends: its region of the buffer (offset 0 in a reduction), then its floats.
  struct Head {
    std::uint64_t offset;
    std::uint64_t count;
  };
  static constexpr std::size_t kHeadFloats = sizeof(Head) / sizeof(float);
  /// The room of each receive posted ahead. A message that fits arrives in one transfer; a larger
  /// one sends its head there and its floats in a second transfer straight after.
  static constexpr std::size_t kRoomFloats = 16384;

  static bool fits(std::uint64_t count) { return count <= kRoomFloats - kHeadFloats; }
  /// Collective `seq` uses slot 2 seq (the head, and the floats that fit) and 2 seq + 1 (the rest).
  static std::uint64_t slot_of(std::uint64_t seq) { return 2 * seq; }

  /// Sends `mine` and its floats at `payload` to every other member, and leaves each other member
  /// m's head in heads_[m] and its floats at parts_[m] (valid until the next collective).
  ///
  /// Gloo's TCP transport moves a message once the receiver has posted its receive, so each
  /// member keeps the receive of its next collective posted (two alternating inboxes per member):
  /// a message then goes out as soon as it is sent, one trip instead of a notice and a trip.
  /// Any failure stops every collective of this process and closes its connections, so the other
  /// members fail at once too.
  Status exchange(Head mine, const float* payload) {
    SH_RETURN_IF_ERROR(connect());
    const auto deadline = Clock::now() + shared_->timeout;
    const std::uint64_t seq = seq_++;
    const std::size_t parity = seq % 2;
    const bool inline_floats = fits(mine.count);
    outbox_.resize(kHeadFloats + (inline_floats ? mine.count : 0));
    std::memcpy(outbox_.data(), &mine, sizeof(Head));
    if (inline_floats) std::copy_n(payload, mine.count, outbox_.data() + kHeadFloats);
    std::vector<std::unique_ptr<UnboundBuffer>> transfers;  // sends, then receives of large floats
    auto track = [&](std::unique_ptr<UnboundBuffer> buffer) {
      std::lock_guard<std::mutex> lock(shared_->mutex);
      shared_->pending.insert(buffer.get());
      transfers.push_back(std::move(buffer));
      return transfers.back().get();
    };
    auto wait_left = [&] {
      return std::max(
          std::chrono::milliseconds(1),
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
    };
    Status st = Status::ok();
    int current = -1;  // the member whose transfer is being posted or waited for
    try {
      if (auto closed = stopped_reason())
        return Status{ErrorCode::aborted, "collectives stopped: " + *closed};
      std::vector<UnboundBuffer*> sends;
      for (current = 0; current < size(); ++current) {
        if (current == member_) continue;
        sends.push_back(
            track(context_->createUnboundBuffer(outbox_.data(), outbox_.size() * sizeof(float))));
        sends.back()->send(current, slot_of(seq));
        if (!inline_floats) {
          sends.push_back(track(context_->createUnboundBuffer(const_cast<float*>(payload),
                                                              mine.count * sizeof(float))));
          sends.back()->send(current, slot_of(seq) + 1);
        }
      }
      std::vector<std::pair<int, UnboundBuffer*>> large;
      for (current = 0; current < size() && st.is_ok(); ++current) {
        if (current == member_) continue;
        const auto m = static_cast<std::size_t>(current);
        if (!inbox_[m][parity]->waitRecv(nullptr, wait_left())) {
          st = stopped();
          break;
        }
        const float* message = inbox_memory(m, parity);
        std::memcpy(&heads_[m], message, sizeof(Head));
        if (fits(heads_[m].count)) {
          parts_[m] = message + kHeadFloats;
          continue;
        }
        large_[m].resize(heads_[m].count);
        large.emplace_back(current, track(context_->createUnboundBuffer(
                                        large_[m].data(), large_[m].size() * sizeof(float))));
        large.back().second->recv(current, slot_of(seq) + 1);
        parts_[m] = large_[m].data();
      }
      for (auto& [member, buffer] : large) {
        current = member;
        if (st.is_ok() && !buffer->waitRecv(nullptr, wait_left())) st = stopped();
      }
      current = -1;
      for (auto* buffer : sends) {
        if (st.is_ok() && !buffer->waitSend(nullptr, wait_left())) st = stopped();
      }
      if (st.is_ok()) post_inbox(seq + 1);
    } catch (const std::exception& e) {
      st = failure_with(current, e.what());
    }
    {
      std::lock_guard<std::mutex> lock(shared_->mutex);
      for (auto& buffer : transfers)
        shared_->pending.erase(buffer.get());
    }
    if (!st.is_ok()) give_up(st);
    return st;
  }

  float* inbox_memory(std::size_t member, std::size_t parity) {
    return inbox_memory_.data() + (member * 2 + parity) * kRoomFloats;
  }

  /// Posts the receive of collective `seq` from every other member into its inbox of that parity.
  void post_inbox(std::uint64_t seq) {
    for (int m = 0; m < size(); ++m) {
      if (m == member_) continue;
      inbox_[static_cast<std::size_t>(m)][seq % 2]->recv(m, slot_of(seq), 0,
                                                         kRoomFloats * sizeof(float));
    }
  }

  std::optional<std::string> stopped_reason() {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    return shared_->closed;
  }

  /// Connects this group's context at its first collective (every member reaches it).
  Status connect() {
    if (context_) return Status::ok();
    SH_ASSIGN_OR_RETURN(auto store, shared_->await_store());
    auto context = std::make_shared<gloo::rendezvous::Context>(member_, size());
    context->setTimeout(shared_->timeout);
    try {
      ActorStore actor_store(*shared_->system, std::move(store), shared_->timeout);
      gloo::rendezvous::PrefixStore prefixed(name_, actor_store);
      auto device = shared_->gloo_device();
      context->connectFullMesh(prefixed, device);
      context_ = std::move(context);
      inbox_memory_.assign(ranks_.size() * 2 * kRoomFloats, 0.0f);
      inbox_.resize(ranks_.size());
      for (int m = 0; m < size(); ++m) {
        if (m == member_) continue;
        for (std::size_t parity = 0; parity < 2; ++parity) {
          auto buffer = context_->createUnboundBuffer(
              inbox_memory(static_cast<std::size_t>(m), parity), kRoomFloats * sizeof(float));
          std::lock_guard<std::mutex> lock(shared_->mutex);
          shared_->pending.insert(buffer.get());
          inbox_[static_cast<std::size_t>(m)][parity] = std::move(buffer);
        }
      }
      post_inbox(0);
    } catch (const std::exception& e) {
      Status st{ErrorCode::io_error, "connecting the " + describe() + " over Gloo: " + e.what()};
      give_up(st);
      return st;
    }
    return Status::ok();
  }

  Status failure_with(int member, const std::string& what) {
    const std::string who = member >= 0 && member < size()
                                ? "rank " + std::to_string(ranks_[static_cast<std::size_t>(member)])
                                : "a member";
    if (what.find("Timed out") != std::string::npos) {
      return {ErrorCode::timeout, "collective of the " + describe() + ": " + who +
                                      " did not take part within " +
                                      seconds_text(shared_->timeout) + " (gloo: " + what + ")"};
    }
    return {ErrorCode::aborted, "collective of the " + describe() + ": " + who +
                                    " died or dropped out (its connection closed; gloo: " + what +
                                    ")"};
  }

  Status stopped() {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    return {ErrorCode::aborted, "collectives stopped: " + shared_->closed.value_or("aborted")};
  }

  /// A half-done collective leaves the members out of step: stop this process's collectives and
  /// close this group's connections, so that members still waiting on this rank fail now rather
  /// than at their time limit.
  void give_up(const Status& why) {
    shared_->close(why.message());
    if (context_) context_->closeConnections();
  }

  std::string describe() const {
    std::string out = name_ + " group (ranks";
    for (int r : ranks_)
      out += " " + std::to_string(r);
    return out + ")";
  }

  std::shared_ptr<ProcessCollectives::Shared> shared_;
  std::string name_;
  std::vector<int> ranks_;
  int member_;
  std::vector<Head> heads_;
  std::vector<const float*> parts_;
  /// Floats of messages too large for an inbox, by member.
  std::vector<std::vector<float>> large_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  std::uint64_t seq_ = 0;
  /// Two receives posted ahead per member (alternating by collective), over inbox_memory_.
  std::vector<std::array<std::unique_ptr<UnboundBuffer>, 2>> inbox_;
  std::vector<float> inbox_memory_;
  std::vector<float> outbox_;
  std::vector<float> sum_;
};

}  // namespace

// -- ProcessCollectives --

ProcessCollectives::ProcessCollectives(caf::actor_system& system, std::string master_addr,
                                       std::chrono::milliseconds timeout)
    : system_(system), shared_(std::make_shared<Shared>()) {
  shared_->system = &system;
  shared_->master_addr = std::move(master_addr);
  shared_->timeout = timeout;
}

ProcessCollectives::~ProcessCollectives() {
  close("shutting down");
  if (store_) caf::anon_send_exit(store_, caf::exit_reason::user_shutdown);
}

caf::actor ProcessCollectives::host_rendezvous() {
  if (!store_) store_ = system_.spawn<RendezvousStore>();
  return store_;
}

void ProcessCollectives::set_rendezvous(caf::actor store) {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  shared_->store = std::move(store);
  shared_->changed.notify_all();
}

void ProcessCollectives::close(const std::string& reason) {
  shared_->close(reason);
}

RankGroups ProcessCollectives::groups(const ParallelLayout& layout, int rank) {
  const int tp = layout.tensor_parallel;
  const int dp = layout.data_parallel;
  std::vector<int> tensor_ranks;
  for (int t = 0; t < tp; ++t)
    tensor_ranks.push_back(layout.data_index(rank) * tp + t);
  std::vector<int> data_ranks;
  for (int d = 0; d < dp; ++d)
    data_ranks.push_back(d * tp + layout.tensor_index(rank));
  return {std::make_shared<GlooGroup>(shared_,
                                      "tensor-parallel " + std::to_string(layout.data_index(rank)),
                                      std::move(tensor_ranks), layout.tensor_index(rank)),
          std::make_shared<GlooGroup>(shared_,
                                      "data-parallel " + std::to_string(layout.tensor_index(rank)),
                                      std::move(data_ranks), layout.data_index(rank))};
}

}  // namespace stagehand
