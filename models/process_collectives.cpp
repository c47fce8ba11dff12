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
        member_(member) {}

  int size() const override { return static_cast<int>(ranks_.size()); }

  Status all_reduce_sum(int, float* data, std::size_t count) override {
    if (ranks_.size() == 1) return Status::ok();
    scratch_.resize(ranks_.size() * count);
    std::vector<void*> into(ranks_.size());
    for (std::size_t m = 0; m < ranks_.size(); ++m)
      into[m] = scratch_.data() + m * count;
    SH_RETURN_IF_ERROR(exchange(data, count * sizeof(float), into));
    std::copy_n(data, count, scratch_.data() + static_cast<std::size_t>(member_) * count);
    // Member order from 0.0f, as HostGroup adds: the same bits whichever group carries the sum.
    std::fill_n(data, count, 0.0f);
    for (std::size_t m = 0; m < ranks_.size(); ++m) {
      const float* part = scratch_.data() + m * count;
      for (std::size_t i = 0; i < count; ++i)
        data[i] += part[i];
    }
    return Status::ok();
  }

  Status all_gather(int, float* full, std::size_t full_count, std::size_t offset,
                    std::size_t count) override {
    if (ranks_.size() == 1) return Status::ok();
    // Each member's region is its own to choose: it travels in front of its floats, and a member
    // receives into room for the whole buffer (one message each way, one copy out).
    constexpr std::size_t kHead = sizeof(Region) / sizeof(float);
    scratch_.resize(kHead + count + ranks_.size() * (kHead + full_count));
    const Region mine{offset, count};
    std::memcpy(scratch_.data(), &mine, sizeof(Region));
    std::copy_n(full + offset, count, scratch_.data() + kHead);
    float* inbox = scratch_.data() + kHead + count;
    std::vector<void*> into(ranks_.size());
    for (std::size_t m = 0; m < ranks_.size(); ++m)
      into[m] = inbox + m * (kHead + full_count);
    SH_RETURN_IF_ERROR(exchange(scratch_.data(), (kHead + count) * sizeof(float), into,
                                (kHead + full_count) * sizeof(float)));
    for (std::size_t m = 0; m < ranks_.size(); ++m) {
      if (static_cast<int>(m) == member_) continue;
      Region region;
      std::memcpy(&region, into[m], sizeof(Region));
      if (region.offset > full_count || region.count > full_count - region.offset) {
        return Status{ErrorCode::internal,
                      "all-gather of the " + describe() + ": rank " + std::to_string(ranks_[m]) +
                          " sent a region outside the " + std::to_string(full_count) + " floats"};
      }
      std::copy_n(static_cast<const float*>(into[m]) + kHead, region.count, full + region.offset);
    }
    return Status::ok();
  }

 private:
  struct Region {
    std::uint64_t offset = 0;
    std::uint64_t count = 0;
  };

  /// Sends `nbytes` at `mine` to every other member and receives each other member m's message
  /// (at most `room` bytes, default `nbytes`) into `into[m]`. Any failure stops every collective
  /// of this process and closes its connections, so the other members fail at once too.
  Status exchange(void* mine, std::size_t nbytes, const std::vector<void*>& into,
                  std::size_t room = 0) {
    SH_RETURN_IF_ERROR(connect());
    const auto deadline = Clock::now() + shared_->timeout;
    const auto slot = static_cast<std::uint64_t>(context_->nextSlot());
    std::vector<std::unique_ptr<UnboundBuffer>> sends(ranks_.size());
    std::vector<std::unique_ptr<UnboundBuffer>> recvs(ranks_.size());
    Status st = Status::ok();
    {
      std::lock_guard<std::mutex> lock(shared_->mutex);
      if (shared_->closed)
        return Status{ErrorCode::aborted, "collectives stopped: " + *shared_->closed};
      for (int m = 0; m < size(); ++m) {
        if (m == member_) continue;
        const auto i = static_cast<std::size_t>(m);
        sends[i] = context_->createUnboundBuffer(mine, nbytes);
        recvs[i] = context_->createUnboundBuffer(into[i], room == 0 ? nbytes : room);
        shared_->pending.insert(sends[i].get());
        shared_->pending.insert(recvs[i].get());
      }
    }
    int current = -1;  // the member whose transfer is being posted or waited for
    try {
      for (current = 0; current < size(); ++current) {
        if (current == member_) continue;
        sends[static_cast<std::size_t>(current)]->send(current, slot);
        recvs[static_cast<std::size_t>(current)]->recv(current, slot);
      }
      for (auto* buffers : {&recvs, &sends}) {
        for (current = 0; current < size() && st.is_ok(); ++current) {
          if (current == member_) continue;
          auto& buffer = (*buffers)[static_cast<std::size_t>(current)];
          const auto left = std::max(
              std::chrono::milliseconds(1),
              std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
          const bool done =
              buffers == &recvs ? buffer->waitRecv(nullptr, left) : buffer->waitSend(nullptr, left);
          if (!done) st = stopped();
        }
      }
    } catch (const std::exception& e) {
      st = failure_with(current, e.what());
    }
    {
      std::lock_guard<std::mutex> lock(shared_->mutex);
      for (auto& b : sends)
        shared_->pending.erase(b.get());
      for (auto& b : recvs)
        shared_->pending.erase(b.get());
    }
    if (!st.is_ok()) give_up(st);
    return st;
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
    } catch (const std::exception& e) {
      Status st{ErrorCode::io_error, "connecting the " + describe() + " over Gloo: " + e.what()};
      give_up(st);
      return st;
    }
    context_ = std::move(context);
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
  std::shared_ptr<gloo::rendezvous::Context> context_;
  std::vector<float> scratch_;
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
