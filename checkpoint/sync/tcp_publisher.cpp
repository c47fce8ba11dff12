// The trainer side of the TCP weight-sync channel (tcp_channel.hpp): registration with rank 0,
// the plan, and one thread per rank that owns every connection and drives each push.
#include <sys/eventfd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <condition_variable>
#include <future>
#include <map>
#include <mutex>

#include "stagehand/checkpoint/save/global_plan.hpp"
#include "stagehand/checkpoint/save/planner.hpp"
#include "stagehand/checkpoint/sync/tcp_channel.hpp"
#include "stagehand/checkpoint/sync/tcp_span_cursor.hpp"
#include "stagehand/checkpoint/sync/tcp_wire.hpp"

namespace stagehand {

using namespace tcp_detail;

namespace {

/// The directory's payload: every rank's host (empty: the one the asker reached rank 0 at), port
/// and descriptors.
struct Registered {
  std::string host;
  int port = 0;
  std::vector<ShardedTensorDesc> descs;
  bool present = false;
};

std::string directory_payload(const std::vector<Registered>& ranks) {
  Writer w;
  w.pod(static_cast<std::int32_t>(ranks.size()));
  for (const auto& r : ranks) w.str(r.host).pod(static_cast<std::int32_t>(r.port)).descs(r.descs);
  return std::move(w.out);
}

std::string error_frame(const std::string& message) { return frame(kError, Writer().str(message).out); }

}  // namespace

struct TcpWeightPublisher::Impl {
  struct Conn {
    Fd fd;
    enum Role { unknown, peer, dir, receiver, status } role = unknown;
    std::string in, out;
    std::string name, host;
    std::int32_t pid = 0;
    std::vector<Span> spans;
    std::uint64_t payload = 0;  // bytes of one version: the spans'
    bool waiting = false;
    std::int64_t min_step = 0;
    std::int64_t got_step = INT64_MIN;  // the last step it acknowledged
    // A version under way: the cursor into `spans`, the last bucket's progress.
    bool in_version = false, sent_all = false, idle_after = false, drop = false;
    SpanCursor cursor;
    std::uint64_t since_progress = 0;
    Clock::time_point progress;
    std::string who() const { return "'" + name + "' (pid " + std::to_string(pid) + " on " + host + ")"; }
  };
  struct Job {
    std::int64_t step = 0;
    const StateDict* state = nullptr;
    int wait_for = 0;
    bool late_only = false;  // push_late(): only receivers that wait for at most `step` without it
    std::uint64_t version = 0;
    bool joining = true;
    Clock::time_point join_until;
    std::vector<Conn*> parts;
    PushReport report;
    std::promise<Result<PushReport>> done;
  };

  int rank = 0, world = 1;
  WeightChannelOptions options;
  std::vector<ShardedTensorDesc> blocks;
  std::uint64_t signature = 0;
  std::vector<std::uint32_t> sent;
  Fd listener;
  int port = 0;
  Fd wake{::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)};
  std::vector<std::unique_ptr<Conn>> conns;
  // Rank 0: who registered, and the plan once all did.
  std::vector<Registered> registry;
  std::optional<Status> planned;  // set once the plan is made (ok) or refused
  std::mutex mutex;                // guards `planned` (rank 0's, while create() waits) and `pending`
  std::condition_variable cv;
  std::unique_ptr<Job> pending;    // handed over by push()
  std::unique_ptr<Job> job;        // the push under way: the loop thread's only
  std::atomic<bool> stopping{false};
  std::atomic<int> waiting{0};
  /// The min_step and last acknowledged step of each receiver counted in `waiting` (guarded by
  /// waiting_mutex).
  mutable std::mutex waiting_mutex;
  std::vector<std::pair<std::int64_t, std::int64_t>> waiting_steps;
  std::atomic<std::int64_t> done_step{-1};
  std::uint64_t next_version = 1;
  std::thread loop;

  ~Impl() {
    stopping = true;
    poke();
    if (loop.joinable()) loop.join();
  }

  void poke() {
    const std::uint64_t one = 1;
    [[maybe_unused]] const auto n = ::write(wake.fd, &one, sizeof one);
  }

  Status make_plan(const std::vector<std::vector<ShardedTensorDesc>>& all) {
    std::vector<LocalPlan> locals(all.size());
    std::vector<const LocalPlan*> plans;
    for (std::size_t r = 0; r < all.size(); ++r) {
      locals[r].rank = static_cast<int>(r);
      locals[r].tensors = all[r];
    }
    for (const auto& l : locals) plans.push_back(&l);
    auto global = make_global_plan(plans);
    if (!global.is_ok()) return global.status().with_context("weight sync: the trainer ranks' blocks");
    sent = global->writes[static_cast<std::size_t>(rank)];
    return Status::ok();
  }

  // ---- Rank 0's registry: complete once every rank registered; then the plan.
  void registry_changed() {
    if (planned || !std::all_of(registry.begin(), registry.end(), [](const Registered& r) { return r.present; })) return;
    std::vector<std::vector<ShardedTensorDesc>> all;
    for (const auto& r : registry) all.push_back(r.descs);
    Status st = make_plan(all);
    {
      std::lock_guard<std::mutex> lock(mutex);
      planned = st;
    }
    cv.notify_all();
    for (auto& c : conns) {
      if (c->role == Conn::peer || c->role == Conn::dir) c->out += st.is_ok() ? frame(kDirectory, directory_payload(registry)) : error_frame(st.message());
    }
  }

  void handle(Conn& c, Frame f) {
    Reader r(f.payload);
    const bool planned_ok = [&] {
      std::lock_guard<std::mutex> lock(mutex);
      return planned && planned->is_ok();
    }();
    switch (f.type) {
      case kPeer: {
        if (r.pod<std::uint64_t>() != kMagic) break;
        const auto peer_rank = r.pod<std::int32_t>(), peer_world = r.pod<std::int32_t>(), peer_port = r.pod<std::int32_t>();
        auto descs = r.descs();
        if (!descs.is_ok() || rank != 0) {
          c.out += error_frame("weight sync: register with trainer rank 0, not rank " + std::to_string(rank));
          break;
        }
        if (peer_world != world || peer_rank <= 0 || peer_rank >= world) {
          c.out += error_frame("weight sync: trainer rank " + std::to_string(peer_rank) + " of a world of " +
                               std::to_string(peer_world) + " registered with rank 0 of a world of " + std::to_string(world));
          break;
        }
        Registered& reg = registry[static_cast<std::size_t>(peer_rank)];
        if (planned && structure_signature(reg.descs) != structure_signature(*descs)) {
          c.out += error_frame("weight sync: trainer rank " + std::to_string(peer_rank) +
                               " came back with other blocks than the plan was made with");
          break;
        }
        reg = {peer_host(c.fd.fd), peer_port, std::move(*descs), true};
        c.role = Conn::peer;
        if (planned) c.out += planned->is_ok() ? frame(kDirectory, directory_payload(registry)) : error_frame(planned->message());
        registry_changed();
        return;
      }
      case kDirRequest:
        if (r.pod<std::uint64_t>() != kMagic) break;
        if (rank != 0) {
          c.out += error_frame("weight sync: trainer rank " + std::to_string(rank) + " is not rank 0: ask rank 0 for the directory");
        } else if (planned) {
          c.out += planned->is_ok() ? frame(kDirectory, directory_payload(registry)) : error_frame(planned->message());
        } else {
          c.role = Conn::dir;  // answered once every rank registered
        }
        return;
      case kHello: {
        if (r.pod<std::uint64_t>() != kMagic) break;
        c.pid = r.pod<std::int32_t>();
        c.name = r.str();
        c.host = peer_host(c.fd.fd);
        auto descs = r.descs();
        if (!descs.is_ok() || !planned_ok) {
          c.out += error_frame("weight sync: trainer rank " + std::to_string(rank) + " has no plan yet");
          break;
        }
        const int receivers = static_cast<int>(std::count_if(conns.begin(), conns.end(), [](const auto& x) { return x->role == Conn::receiver; }));
        if (receivers >= options.max_receivers) {
          c.out += error_frame("weight sync: trainer rank " + std::to_string(rank) + " serves " +
                               std::to_string(options.max_receivers) + " receivers already");
          break;
        }
        std::vector<std::int64_t> covered(descs->size(), 0);
        std::vector<bool> held(descs->size(), false);
        auto parts = receiver_parts(blocks, sent, *descs, "receiver '" + c.name + "'", covered, held);
        if (!parts.is_ok()) {
          c.out += error_frame(parts.status().message());
          break;
        }
        for (const auto& d : *descs) {
          if (!d.validate().is_ok()) {
            c.out += error_frame("weight sync: receiver '" + c.name + "' sent an invalid block of '" + d.name + "'");
            return;
          }
        }
        c.spans = spans_of(blocks, sent, *parts, *descs);
        for (const Span& s : c.spans) c.payload += s.bytes(dtype_size(blocks[s.tensor].dtype));
        c.role = Conn::receiver;
        c.out += frame(kHelloOk);
        return;
      }
      case kWant:
        if (c.role != Conn::receiver || c.in_version) break;
        c.waiting = true;
        c.min_step = r.pod<std::int64_t>();
        return;
      case kIdle:
        if (c.role != Conn::receiver) break;
        if (c.in_version && !c.sent_all) {
          c.idle_after = true;  // answered after the payload
        } else {
          c.waiting = false;
          c.out += frame(kIdleAck);
        }
        return;
      case kGot:
        if (c.role != Conn::receiver || !c.in_version) break;
        if (job && r.pod<std::uint64_t>() == job->version && c.sent_all) {
          // Delivered: it may ask for the next version at once (its WANT may follow in this read).
          job->report.delivered.push_back(c.name);
          c.got_step = job->step;
          c.in_version = c.idle_after = false;
        }
        return;
      case kStatus:
        if (r.pod<std::uint64_t>() != kMagic) break;
        c.role = Conn::status;
        c.out += frame(kStatusReply, Writer().pod(done_step.load()).out);
        return;
      default:
        break;
    }
    if (c.role == Conn::unknown) c.drop = true;  // not one of ours: closed once its answer is out
  }

  // Reads and handles what arrived on `c`; false when it closed or broke.
  bool read_from(Conn& c) {
    char buf[64 << 10];
    bool open = true;
    for (;;) {
      const ssize_t n = ::recv(c.fd.fd, buf, sizeof buf, 0);
      if (n > 0) {
        c.in.append(buf, static_cast<std::size_t>(n));
        continue;
      }
      open = n < 0 && (errno == EAGAIN || errno == EINTR);
      break;
    }
    while (c.in.size() >= 8) {
      std::uint32_t head[2];
      std::memcpy(head, c.in.data(), 8);
      if (head[1] > kMaxFrame) return false;
      if (c.in.size() < 8 + head[1]) break;
      Frame f{static_cast<Msg>(head[0]), c.in.substr(8, head[1])};
      c.in.erase(0, 8 + head[1]);
      handle(c, std::move(f));
    }
    return open;
  }

  // Writes what `c` has to send; false when it broke.
  bool write_to(Conn& c) {
    while (!c.out.empty()) {
      const ssize_t n = ::send(c.fd.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
      if (n > 0) {
        c.out.erase(0, static_cast<std::size_t>(n));
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) return true;
      return false;
    }
    if (!c.in_version || c.sent_all || !job) return true;
    const StateDict& state = *job->state;
    for (;;) {
      iovec iov[64];
      std::string error;
      const int n_iov = c.cursor.next(c.spans, state, options.bucket_bytes, iov, 64, &error);
      if (n_iov < 0) {
        job->report.dropped.push_back(c.who() + " not served: " + error);
        c.in_version = false;
        c.drop = true;
        return true;
      }
      if (n_iov == 0) break;
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = static_cast<std::size_t>(n_iov);
      const ssize_t w = ::sendmsg(c.fd.fd, &msg, MSG_NOSIGNAL);
      if (w < 0) return errno == EAGAIN || errno == EINTR;
      c.since_progress += static_cast<std::uint64_t>(w);
      c.cursor.advance(c.spans, state, static_cast<std::uint64_t>(w));
    }
    if (c.since_progress >= options.bucket_bytes) {
      c.progress = Clock::now();
      c.since_progress = 0;
    }
    if (c.cursor.done(c.spans)) {
      c.sent_all = true;
      c.cursor.release();
      c.progress = Clock::now();
      if (c.idle_after) c.out += frame(kIdleAck);
    }
    return true;
  }

  void take_in(Conn& c) {
    Job& j = *job;
    c.out += frame(kVersion, Writer().pod(j.version).pod(j.step).pod(c.payload).out);
    c.waiting = false;
    c.in_version = true;
    c.sent_all = c.idle_after = false;
    c.cursor.restart();
    c.since_progress = 0;
    c.progress = Clock::now();
    j.parts.push_back(&c);
  }

  // Advances the push under way, if any.
  void drive(Clock::time_point now) {
    if (!job) return;
    Job& j = *job;
    if (j.joining) {
      for (auto& c : conns) {
        if (c->role == Conn::receiver && c->waiting && !c->in_version && !c->drop && c->min_step <= j.step &&
            (!j.late_only || c->got_step < j.step)) {
          take_in(*c);
        }
      }
      // Ready: those taken in, and those waiting for a later step (one taken in that got the
      // version and waits again for the next is counted once).
      int ready = static_cast<int>(j.parts.size());
      for (const auto& c : conns) {
        if (c->role == Conn::receiver && c->waiting && std::find(j.parts.begin(), j.parts.end(), c.get()) == j.parts.end()) ++ready;
      }
      const bool waits = j.wait_for > 0 && !sent.empty();
      if (waits && ready < j.wait_for && now < j.join_until) return;
      j.joining = false;
      if (waits && ready < j.wait_for) {
        j.report.dropped.push_back(std::to_string(j.wait_for - ready) + " of the " + std::to_string(j.wait_for) +
                                   " receivers awaited did not wait for a version within " +
                                   std::to_string(options.receiver_timeout.count()) + " ms");
      }
    }
    bool all = true;
    for (Conn* c : j.parts) {
      if (!c->in_version) continue;  // delivered or dropped
      if (now - c->progress >= options.receiver_timeout) {
        j.report.dropped.push_back(c->who() + (c->sent_all ? " did not acknowledge the version within "
                                                            : " took no bucket for ") +
                                   std::to_string(options.receiver_timeout.count()) + " ms");
        c->in_version = false;
        c->drop = true;
        continue;
      }
      all = false;
    }
    if (!all) return;
    done_step = j.step;
    j.done.set_value(std::move(j.report));
    job.reset();
  }

  void close_conn(Conn& c, const char* why) {
    if (c.in_version && job) {
      job->report.dropped.push_back(c.who() + " " + why + " mid-version");
      c.in_version = false;
    }
    c.drop = true;
  }

  void count_waiting() {
    std::vector<std::pair<std::int64_t, std::int64_t>> steps;
    for (const auto& c : conns) {
      if (c->role == Conn::receiver && c->waiting && !c->drop) steps.emplace_back(c->min_step, c->got_step);
    }
    std::lock_guard<std::mutex> lock(waiting_mutex);
    waiting = static_cast<int>(steps.size());
    waiting_steps = std::move(steps);
  }

  void run() {
    std::vector<pollfd> fds;
    while (!stopping.load()) {
      if (!job) {
        std::lock_guard<std::mutex> lock(mutex);
        job = std::move(pending);
      }
      fds.clear();
      fds.push_back({listener.fd, POLLIN, 0});
      fds.push_back({wake.fd, POLLIN, 0});
      for (auto& c : conns) {
        short ev = POLLIN;
        if (!c->out.empty() || (c->in_version && !c->sent_all)) ev |= POLLOUT;
        fds.push_back({c->fd.fd, ev, 0});
      }
      const bool busy = job != nullptr;
      ::poll(fds.data(), fds.size(), busy ? 5 : 200);
      const auto now = Clock::now();
      if (fds[1].revents & POLLIN) {
        std::uint64_t n;
        [[maybe_unused]] const auto r = ::read(wake.fd, &n, sizeof n);
      }
      if (fds[0].revents & POLLIN) {
        for (;;) {
          const int fd = ::accept(listener.fd, nullptr, nullptr);
          if (fd < 0) break;
          set_socket_options(fd);
          auto c = std::make_unique<Conn>();
          c->fd = Fd(fd);
          conns.push_back(std::move(c));
        }
      }
      for (std::size_t i = 0; i + 2 < fds.size() && i < conns.size(); ++i) {
        Conn& c = *conns[i];
        const short rev = fds[i + 2].revents;
        if (rev & (POLLIN | POLLHUP | POLLERR)) {
          if (!read_from(c)) close_conn(c, "closed its connection");
        }
      }
      drive(now);
      // Counted before anything is written: a receiver that reads its IDLE_ACK is no longer counted.
      count_waiting();
      for (auto& c : conns) {
        if (!c->drop && !write_to(*c)) close_conn(*c, "broke its connection");
      }
      drive(Clock::now());
      // Dropped connections go once nothing is left to say to them (a refusal) or at once.
      // A dropped connection is closed; a refusal queued on it goes out first (one try).
      conns.erase(std::remove_if(conns.begin(), conns.end(),
                                 [&](const std::unique_ptr<Conn>& c) {
                                   if (!c->drop) return false;
                                   if (!c->out.empty()) write_to(*c);
                                   if (job) {
                                     auto& p = job->parts;
                                     p.erase(std::remove(p.begin(), p.end(), c.get()), p.end());
                                   }
                                   return true;
                                 }),
                  conns.end());
      count_waiting();
    }
    std::lock_guard<std::mutex> lock(mutex);
    for (auto* j : {&job, &pending}) {
      if (*j) (*j)->done.set_value(Status{ErrorCode::aborted, "weight sync: the publisher was closed mid-push"});
    }
  }
};

TcpWeightPublisher::TcpWeightPublisher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TcpWeightPublisher::~TcpWeightPublisher() = default;

std::uint64_t TcpWeightPublisher::sent_bytes() const {
  std::uint64_t total = 0;
  for (std::uint32_t k : impl_->sent) total += impl_->blocks[k].nbytes();
  return total;
}

int TcpWeightPublisher::waiting_receivers() const { return impl_->waiting.load(); }

int TcpWeightPublisher::late_receivers(std::int64_t step) const {
  std::lock_guard<std::mutex> lock(impl_->waiting_mutex);
  return static_cast<int>(std::count_if(impl_->waiting_steps.begin(), impl_->waiting_steps.end(), [step](const auto& s) {
    return s.first <= step && s.second < step;
  }));
}

int TcpWeightPublisher::port() const { return impl_->port; }

Result<std::unique_ptr<TcpWeightPublisher>> TcpWeightPublisher::create(const std::string& address, int rank, int world,
                                                                       std::vector<ShardedTensorDesc> blocks,
                                                                       const WeightChannelOptions& options) {
  auto endpoint = parse_endpoint(address);
  if (!endpoint.is_ok()) return endpoint.status();
  if (world < 1 || rank < 0 || rank >= world) {
    return invalid("trainer rank " + std::to_string(rank) + " is outside a world of " + std::to_string(world));
  }
  if (options.bucket_bytes < 64 || options.max_receivers < 1 || options.max_receivers > 4096) {
    return invalid("options need bucket_bytes >= 64 and max_receivers in [1, 4096]");
  }
  for (const auto& b : blocks) SH_RETURN_IF_ERROR(b.validate().with_context("weight sync: trainer rank " + std::to_string(rank)));
  auto impl = std::make_unique<Impl>();
  Impl& m = *impl;
  m.rank = rank;
  m.world = world;
  m.options = options;
  m.signature = structure_signature(blocks);
  m.blocks = blocks;
  const auto deadline = Clock::now() + options.connect_timeout;
  const std::string who = "trainer rank " + std::to_string(rank);
  auto listener = listen_on(rank == 0 ? *endpoint : Endpoint{"0.0.0.0", 0}, &m.port);
  if (!listener.is_ok()) return listener.status().with_context(who);
  m.listener = Fd(*listener);
  if (rank == 0) {
    m.registry.resize(static_cast<std::size_t>(world));
    m.registry[0] = {"", m.port, blocks, true};
    m.registry_changed();  // a world of 1 is complete at once
    m.loop = std::thread([&m] { m.run(); });
    std::unique_lock<std::mutex> lock(m.mutex);
    if (!m.cv.wait_until(lock, deadline, [&] { return m.planned.has_value(); })) {
      lock.unlock();
      m.stopping = true;
      m.poke();
      m.loop.join();
      std::string missing;
      for (int r = 1; r < world; ++r) {
        if (!m.registry[static_cast<std::size_t>(r)].present) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
      return Status{ErrorCode::timeout, "weight sync: trainer rank(s) " + missing + " did not register with trainer rank 0 at " +
                                            endpoint->to_string() + " within " + std::to_string(options.connect_timeout.count()) + " ms"};
    }
    if (!m.planned->is_ok()) return *m.planned;
  } else {
    auto fd = connect_to(*endpoint, deadline, "trainer rank 0");
    if (!fd.is_ok()) return fd.status().with_context(who + " registering");
    Fd conn(*fd);
    Writer w;
    w.pod(kMagic).pod(static_cast<std::int32_t>(rank)).pod(static_cast<std::int32_t>(world)).pod(static_cast<std::int32_t>(m.port)).descs(blocks);
    const std::string hello = frame(kPeer, w.out);
    SH_RETURN_IF_ERROR(write_all(conn.fd, hello.data(), hello.size(), deadline, "trainer rank 0"));
    auto reply = read_frame(conn.fd, deadline, -1, "trainer rank 0");
    if (!reply.is_ok()) {
      if (reply.status().code() == ErrorCode::timeout) {
        return Status{ErrorCode::timeout, "weight sync: " + who + " waited in vain for every trainer rank to register with rank 0 at " +
                                              endpoint->to_string()};
      }
      return reply.status().with_context(who + " registering");
    }
    Reader r(reply->payload);
    const auto n = r.pod<std::int32_t>();
    if (reply->type != kDirectory || n != world) return Status{ErrorCode::corruption, "weight sync: trainer rank 0 sent a damaged directory"};
    std::vector<std::vector<ShardedTensorDesc>> all;
    for (int k = 0; k < n; ++k) {
      r.str();
      r.pod<std::int32_t>();
      auto descs = r.descs();
      if (!descs.is_ok()) return descs.status();
      all.push_back(std::move(*descs));
    }
    SH_RETURN_IF_ERROR(m.make_plan(all));
    m.planned = Status::ok();
    m.loop = std::thread([&m] { m.run(); });
  }
  return std::unique_ptr<TcpWeightPublisher>(new TcpWeightPublisher(std::move(impl)));
}

Result<PushReport> TcpWeightPublisher::push(std::int64_t step, const StateDict& state, int wait_for) {
  return push_version(step, state, wait_for, false);
}

Result<PushReport> TcpWeightPublisher::push_late(std::int64_t step, const StateDict& state) {
  return push_version(step, state, 0, true);
}

Result<PushReport> TcpWeightPublisher::push_version(std::int64_t step, const StateDict& state, int wait_for,
                                                    bool late_only) {
  Impl& m = *impl_;
  SH_RETURN_IF_ERROR(check_state(state, m.signature, "trainer rank " + std::to_string(m.rank)));
  auto job = std::make_unique<Impl::Job>();
  job->step = step;
  job->state = &state;
  job->wait_for = wait_for;
  job->late_only = late_only;
  job->version = m.next_version++;
  job->join_until = Clock::now() + m.options.receiver_timeout;
  job->report.version = job->version;
  job->report.step = step;
  job->report.bytes = sent_bytes();
  auto done = job->done.get_future();
  {
    std::lock_guard<std::mutex> lock(m.mutex);
    if (m.pending) return Status{ErrorCode::unsupported, "weight sync: a push is under way on this rank already"};
    m.pending = std::move(job);
  }
  m.poke();
  return done.get();
}

}  // namespace stagehand
