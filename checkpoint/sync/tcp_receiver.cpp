// The inference side of the TCP weight-sync channel (tcp_channel.hpp): the directory from rank 0,
// one connection per trainer rank it takes from, and versions read straight into its tensors.
#include <sys/eventfd.h>

#include <algorithm>
#include <atomic>
#include <mutex>

#include "stagehand/checkpoint/save/global_plan.hpp"
#include "stagehand/checkpoint/save/planner.hpp"
#include "stagehand/checkpoint/sync/tcp_channel.hpp"
#include "stagehand/checkpoint/sync/tcp_wire.hpp"
#include "stagehand/core/thread_pool.hpp"

namespace stagehand {

using namespace tcp_detail;

struct TcpWeightReceiver::Impl {
  struct Rank {
    int rank = 0;
    Endpoint at;
    std::vector<ShardedTensorDesc> descs;
    std::vector<Span> spans;
    std::uint64_t payload = 0;  // bytes of one version: the spans'
    Fd fd;
    std::string who() const { return "trainer rank " + std::to_string(rank) + " (" + at.to_string() + ")"; }
  };
  std::string name;
  std::vector<ShardedTensorDesc> blocks;
  std::uint64_t signature = 0;
  std::vector<Rank> ranks;           // the trainer ranks that send a part of this receiver's blocks
  std::vector<Endpoint> everyone;    // every trainer rank, for newest_pushed_step()
  WeightChannelOptions options;
  std::unique_ptr<ThreadPool> pool;  // made at the first receive(); idle whenever receive() is not running
  Fd stop_fd{::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)};
  std::atomic<bool> stopped{false};

  /// Connects to `r` and says hello with this receiver's blocks.
  Status hello(Rank& r, Clock::time_point deadline) {
    // Every rank listened when rank 0 gave the directory: one that refuses now is gone.
    auto fd = connect_to(r.at, deadline, r.who(), /*retry=*/false, stop_fd.fd);
    if (!fd.is_ok()) {
      if (fd.status().code() == ErrorCode::aborted) return fd.status();
      return Status{ErrorCode::io_error, "weight sync: " + r.who() + " is gone (" + fd.status().message() + ")"};
    }
    Fd conn(*fd);
    Writer w;
    w.pod(kMagic).pod(static_cast<std::int32_t>(getpid())).str(name).descs(blocks);
    const std::string f = frame(kHello, w.out);
    SH_RETURN_IF_ERROR(write_all(conn.fd, f.data(), f.size(), deadline, r.who()));
    auto reply = read_frame(conn.fd, deadline, stop_fd.fd, r.who());
    if (!reply.is_ok()) return reply.status();
    if (reply->type != kHelloOk) return Status{ErrorCode::corruption, "weight sync: " + r.who() + " answered hello with " + std::to_string(reply->type)};
    r.fd = std::move(conn);
    return Status::ok();
  }

  /// Reads a version's payload (`bytes`) into `state`.
  Status read_payload(Rank& r, StateDict& state, std::uint64_t bytes, Clock::time_point deadline,
                      std::vector<std::uint8_t>& scratch) {
    if (bytes != r.payload) return Status{ErrorCode::corruption, "weight sync: " + r.who() + " sent a version of " + std::to_string(bytes) + " bytes, not " + std::to_string(r.payload)};
    for (const Span& s : r.spans) {
      const ShardedTensorDesc& from = r.descs[s.tensor];
      ShardedTensor& to = state.tensors[s.block];
      const std::size_t elem = dtype_size(from.dtype);
      auto* dst = static_cast<std::uint8_t*>(to.tensor.data());
      if (s.direct && !to.tensor.device().is_cuda()) {  // device tensors: through the bucket, then copied in
        SH_RETURN_IF_ERROR(read_all(r.fd.fd, dst + static_cast<std::uint64_t>(*s.direct) * elem, s.bytes(elem), deadline,
                                    stop_fd.fd, r.who()));
        continue;
      }
      const std::int64_t per = std::max<std::int64_t>(1, static_cast<std::int64_t>(options.bucket_bytes / elem));
      if (scratch.size() < static_cast<std::size_t>(std::min(per, s.end - s.first)) * elem) {
        scratch.resize(static_cast<std::size_t>(std::min(per, s.end - s.first)) * elem);
      }
      for (std::int64_t x = s.first; x < s.end; x += per) {
        const std::int64_t y = std::min(s.end, x + per);
        SH_RETURN_IF_ERROR(read_all(r.fd.fd, scratch.data(), static_cast<std::size_t>(y - x) * elem, deadline, stop_fd.fd, r.who()));
        if (!copy_overlap_part(chunk_of(from), to.desc, elem, x, y, scratch.data(), dst, to.tensor.device())) {
          return Status{ErrorCode::internal, "weight sync: a copy into '" + to.desc.name + "' failed"};
        }
      }
    }
    return Status::ok();
  }

  /// Takes the next version of rank `r` whose step is >= `min_step` into `state`.
  Result<std::int64_t> take(Rank& r, StateDict& state, std::int64_t min_step, Clock::time_point deadline) {
    const Clock::time_point hard = deadline + std::max<Clock::duration>(deadline - Clock::now(), std::chrono::seconds(1));
    auto fail = [&](Status st) -> Status {
      r.fd.reset();  // the next receive() connects again
      if (stopped.load()) return {ErrorCode::aborted, "weight sync: receiver '" + name + "' was stopped"};
      return st;
    };
    if (stopped.load()) return fail({ErrorCode::aborted, "stopped"});
    if (r.fd.fd < 0) {
      if (Status st = hello(r, deadline); !st.is_ok()) return fail(st);
    }
    const std::string want = frame(kWant, Writer().pod(min_step).out);
    if (Status st = write_all(r.fd.fd, want.data(), want.size(), deadline, r.who()); !st.is_ok()) return fail(st);
    bool idle_sent = false;
    std::optional<std::int64_t> got;
    std::vector<std::uint8_t> scratch;
    for (;;) {
      auto f = read_frame(r.fd.fd, idle_sent ? hard : deadline, stop_fd.fd, r.who());
      if (!f.is_ok() && f.status().code() == ErrorCode::timeout && !idle_sent) {
        // No version took it in in time: it waits no longer (one that began meanwhile is read to its end).
        const std::string idle = frame(kIdle);
        if (Status st = write_all(r.fd.fd, idle.data(), idle.size(), hard, r.who()); !st.is_ok()) return fail(st);
        idle_sent = true;
        continue;
      }
      if (!f.is_ok()) {
        if (f.status().code() == ErrorCode::io_error) {
          return fail({ErrorCode::aborted, "weight sync: " + r.who() + " dropped receiver '" + name +
                                               "' or its connection broke (" + f.status().message() + ")"});
        }
        return fail(f.status());
      }
      if (f->type == kVersion) {
        Reader in(f->payload);
        const auto version = in.pod<std::uint64_t>();
        const auto step = in.pod<std::int64_t>();
        const auto bytes = in.pod<std::uint64_t>();
        if (Status st = read_payload(r, state, bytes, hard, scratch); !st.is_ok()) {
          if (st.code() == ErrorCode::io_error) {
            return fail({ErrorCode::aborted, "weight sync: " + r.who() + " dropped receiver '" + name + "' from version " +
                                                 std::to_string(version) + ": it took a bucket later than the publisher's receiver timeout, or the connection broke"});
          }
          return fail(st);
        }
        const std::string ack = frame(kGot, Writer().pod(version).out);
        if (Status st = write_all(r.fd.fd, ack.data(), ack.size(), hard, r.who()); !st.is_ok()) return fail(st);
        got = step;
        if (!idle_sent) return step;
        continue;  // the publisher answers the idle after the version: read that too
      }
      if (f->type == kIdleAck && idle_sent) {
        if (got) return *got;
        return Status{ErrorCode::timeout, "weight sync: receiver '" + name + "' waited in vain for a version of " + r.who()};
      }
      return fail({ErrorCode::corruption, "weight sync: " + r.who() + " sent an unexpected message " + std::to_string(f->type)});
    }
  }
};

TcpWeightReceiver::TcpWeightReceiver(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TcpWeightReceiver::~TcpWeightReceiver() = default;

Result<std::unique_ptr<TcpWeightReceiver>> TcpWeightReceiver::connect(const std::string& address, const std::string& name,
                                                                      std::vector<ShardedTensorDesc> blocks,
                                                                      const WeightChannelOptions& options) {
  auto endpoint = parse_endpoint(address);
  if (!endpoint.is_ok()) return endpoint.status();
  const std::string who = "receiver '" + name + "'";
  if (name.empty() || name.size() > 200) return invalid("a receiver's name must be 1 to 200 bytes");
  for (const auto& b : blocks) SH_RETURN_IF_ERROR(b.validate().with_context("weight sync: " + who));
  auto impl = std::make_unique<Impl>();
  Impl& m = *impl;
  m.name = name;
  m.options = options;
  m.signature = structure_signature(blocks);
  const auto deadline = Clock::now() + options.connect_timeout;
  // The directory: rank 0 answers once every rank registered.
  auto fd = connect_to(*endpoint, deadline, "trainer rank 0");
  if (!fd.is_ok()) return fd.status().with_context(who + " connecting");
  Fd conn(*fd);
  const std::string ask = frame(kDirRequest, Writer().pod(kMagic).out);
  SH_RETURN_IF_ERROR(write_all(conn.fd, ask.data(), ask.size(), deadline, "trainer rank 0"));
  auto dir = read_frame(conn.fd, deadline, -1, "trainer rank 0 at " + endpoint->to_string());
  if (!dir.is_ok()) return dir.status().with_context(who + " asking for the directory");
  if (dir->type != kDirectory) return Status{ErrorCode::corruption, "weight sync: trainer rank 0 answered with " + std::to_string(dir->type)};
  Reader r(dir->payload);
  const auto world = r.pod<std::int32_t>();
  if (!r.ok() || world < 1 || world > 1 << 20) return Status{ErrorCode::corruption, "weight sync: trainer rank 0 sent a damaged directory"};
  std::vector<Impl::Rank> all(static_cast<std::size_t>(world));
  std::vector<LocalPlan> locals(static_cast<std::size_t>(world));
  for (int k = 0; k < world; ++k) {
    Impl::Rank& rank = all[static_cast<std::size_t>(k)];
    rank.rank = k;
    rank.at.host = r.str();
    rank.at.port = r.pod<std::int32_t>();
    if (rank.at.host.empty()) rank.at.host = endpoint->host;  // rank 0: where this receiver reached it
    auto descs = r.descs();
    if (!descs.is_ok()) return descs.status();
    rank.descs = std::move(*descs);
    locals[static_cast<std::size_t>(k)].rank = k;
    locals[static_cast<std::size_t>(k)].tensors = rank.descs;
    m.everyone.push_back(rank.at);
  }
  std::vector<const LocalPlan*> plans;
  for (const auto& l : locals) plans.push_back(&l);
  auto global = make_global_plan(plans);  // the plan every trainer rank made: who sends what
  if (!global.is_ok()) return global.status().with_context("weight sync: the trainer ranks' blocks");
  std::vector<std::int64_t> covered(blocks.size(), 0);
  std::vector<bool> held(blocks.size(), false);
  for (int k = 0; k < world; ++k) {
    Impl::Rank& rank = all[static_cast<std::size_t>(k)];
    const auto& sent = global->writes[static_cast<std::size_t>(k)];
    auto parts = receiver_parts(rank.descs, sent, blocks, who, covered, held);
    if (!parts.is_ok()) return parts.status();
    if (parts->empty()) continue;
    rank.spans = spans_of(rank.descs, sent, *parts, blocks);
    for (const Span& s : rank.spans) rank.payload += s.bytes(dtype_size(rank.descs[s.tensor].dtype));
    m.ranks.push_back(std::move(rank));
  }
  SH_RETURN_IF_ERROR(check_covered(blocks, covered, held, who));
  m.blocks = std::move(blocks);
  for (auto& rank : m.ranks) SH_RETURN_IF_ERROR(m.hello(rank, deadline).with_context(who + " connecting"));
  return std::unique_ptr<TcpWeightReceiver>(new TcpWeightReceiver(std::move(impl)));
}

Result<std::int64_t> TcpWeightReceiver::receive(StateDict& state, std::int64_t min_step, std::chrono::milliseconds timeout) {
  Impl& m = *impl_;
  SH_RETURN_IF_ERROR(check_state(state, m.signature, "receiver '" + m.name + "'"));
  const auto deadline = Clock::now() + timeout;
  if (!m.pool && m.ranks.size() > 1) m.pool = std::make_unique<ThreadPool>(static_cast<int>(m.ranks.size() - 1));
  return receive_agreeing(m.ranks.size(), m.pool.get(), min_step,
                          [&](std::size_t i, std::int64_t target) { return m.take(m.ranks[i], state, target, deadline); });
}

void TcpWeightReceiver::stop() {
  impl_->stopped.store(true);
  const std::uint64_t one = 1;
  [[maybe_unused]] const auto n = ::write(impl_->stop_fd.fd, &one, sizeof one);
}

std::int64_t TcpWeightReceiver::newest_pushed_step() const {
  std::int64_t newest = -1;
  for (const Endpoint& e : impl_->everyone) {
    const auto deadline = Clock::now() + std::chrono::seconds(1);
    auto fd = connect_to(e, deadline, "a trainer rank");
    if (!fd.is_ok()) continue;
    Fd conn(*fd);
    const std::string ask = frame(kStatus, Writer().pod(kMagic).out);
    if (!write_all(conn.fd, ask.data(), ask.size(), deadline, "a trainer rank").is_ok()) continue;
    auto reply = read_frame(conn.fd, deadline, -1, "a trainer rank");
    if (!reply.is_ok() || reply->type != kStatusReply) continue;
    Reader in(reply->payload);
    newest = std::max(newest, in.pod<std::int64_t>());
  }
  return newest;
}

}  // namespace stagehand
