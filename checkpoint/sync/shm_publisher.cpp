// The trainer side of the shared-memory weight-sync channel (shm_channel.hpp): a rank's segment, its
// plan, and pushes through its ring.
#include "stagehand/checkpoint/sync/shm_channel.hpp"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstring>
#include <ctime>
#include <optional>
#include <thread>

#include "stagehand/checkpoint/load/reshard.hpp"
#include "stagehand/checkpoint/save/global_plan.hpp"
#include "stagehand/checkpoint/save/planner.hpp"
#include "stagehand/checkpoint/sync/shm_segment.hpp"
#include "stagehand/core/device.hpp"

namespace stagehand {

using namespace shm_detail;

// ---------------------------------------------------------------------------------------------
// Publisher

struct ShmWeightPublisher::Impl {
  std::string name;
  int rank = 0;
  std::vector<ShardedTensorDesc> blocks;
  std::uint64_t signature = 0;
  std::vector<std::uint32_t> sent;
  std::vector<std::uint64_t> offsets;
  WeightChannelOptions options;
  Mapping seg;
  std::uint64_t next_seq = 1;

  ~Impl() {
    if (seg.base) {
      at(seg.header().closed).store(1, std::memory_order_release);
      bump(seg.header().data_word);
      shm_unlink(name.c_str());
    }
  }
};

ShmWeightPublisher::ShmWeightPublisher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ShmWeightPublisher::~ShmWeightPublisher() = default;

std::uint64_t ShmWeightPublisher::sent_bytes() const {
  std::uint64_t total = 0;
  for (std::uint32_t k : impl_->sent) total += impl_->blocks[k].nbytes();
  return total;
}

namespace {

/// Whether entry `e`, waiting now, is a late receiver of `step`: it waits for at most `step` and
/// has not got `step` from this rank.
bool late_for(ReceiverEntry& e, std::int64_t step) {
  return at(e.min_step).load(std::memory_order_relaxed) <= step && at(e.have_step).load(std::memory_order_relaxed) < step;
}

}  // namespace

int ShmWeightPublisher::late_receivers(std::int64_t step) const {
  int n = 0;
  for (std::uint32_t i = 0; i < impl_->seg.header().max_receivers; ++i) {
    ReceiverEntry& e = impl_->seg.entry(i);
    if (at(e.used).load(std::memory_order_acquire) == 1 && at(e.want).load(std::memory_order_acquire) == kWant &&
        late_for(e, step)) {
      ++n;
    }
  }
  return n;
}

Result<PushReport> ShmWeightPublisher::push(std::int64_t step, const StateDict& state, int wait_for) {
  return push_version(step, state, wait_for, false);
}

Result<PushReport> ShmWeightPublisher::push_late(std::int64_t step, const StateDict& state) {
  return push_version(step, state, 0, true);
}

int ShmWeightPublisher::waiting_receivers() const {
  int n = 0;
  for (std::uint32_t i = 0; i < impl_->seg.header().max_receivers; ++i) {
    ReceiverEntry& e = impl_->seg.entry(i);
    if (at(e.used).load(std::memory_order_acquire) == 1 && at(e.want).load(std::memory_order_acquire) == kWant) ++n;
  }
  return n;
}

Result<std::unique_ptr<ShmWeightPublisher>> ShmWeightPublisher::create(const std::string& channel, int rank,
                                                                       int world,
                                                                       std::vector<ShardedTensorDesc> blocks,
                                                                       const WeightChannelOptions& options) {
  SH_RETURN_IF_ERROR(check_channel(channel));
  if (world < 1 || rank < 0 || rank >= world) {
    return invalid("trainer rank " + std::to_string(rank) + " is outside a world of " + std::to_string(world));
  }
  if (options.buckets < 2 || options.bucket_bytes < kAlign || options.max_receivers < 1 ||
      options.max_receivers > 4096) {
    return invalid("options need buckets >= 2, bucket_bytes >= 64 and max_receivers in [1, 4096]");
  }
  for (const auto& b : blocks) SH_RETURN_IF_ERROR(b.validate().with_context("weight sync: trainer rank " + std::to_string(rank)));
  auto impl = std::make_unique<Impl>();
  impl->name = segment_name(channel, rank);
  impl->rank = rank;
  impl->options = options;
  impl->options.bucket_bytes = align_up(options.bucket_bytes, kAlign);
  impl->signature = structure_signature(blocks);

  const std::string encoded = encode(blocks);
  const std::uint64_t entries_offset = 4096;
  const std::uint64_t slots_offset = entries_offset + sizeof(ReceiverEntry) * static_cast<std::uint64_t>(options.max_receivers);
  const std::uint64_t descs_offset = slots_offset + sizeof(Slot) * static_cast<std::uint64_t>(options.buckets);
  const std::uint64_t sent_offset = align_up(descs_offset + encoded.size(), 8);
  const std::uint64_t ring_offset = align_up(sent_offset + 4 * blocks.size(), 4096);
  const std::uint64_t total = ring_offset + impl->options.bucket_bytes * static_cast<std::uint64_t>(options.buckets);

  // One left by a process that died (or a publisher of another run) is replaced: the name is this rank's.
  shm_unlink(impl->name.c_str());
  const int fd = shm_open(impl->name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return Status{ErrorCode::io_error, "weight sync: creating " + impl->name + ": " + std::strerror(errno)};
  if (ftruncate(fd, static_cast<off_t>(total)) != 0) {
    const std::string why = std::strerror(errno);
    close(fd);
    shm_unlink(impl->name.c_str());
    return Status{ErrorCode::no_space, "weight sync: sizing " + impl->name + " to " + std::to_string(total) + " bytes: " + why};
  }
  impl->seg.size = total;
  impl->seg.base = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (impl->seg.base == MAP_FAILED) {
    impl->seg.base = nullptr;
    shm_unlink(impl->name.c_str());
    return Status{ErrorCode::io_error, "weight sync: mapping " + impl->name + ": " + std::strerror(errno)};
  }
  Header& h = impl->seg.header();
  h.rank = rank;
  h.world = world;
  h.pid = static_cast<std::int32_t>(getpid());
  h.n_slots = static_cast<std::uint32_t>(options.buckets);
  h.max_receivers = static_cast<std::uint32_t>(options.max_receivers);
  h.n_descs = static_cast<std::uint32_t>(blocks.size());
  h.bucket_bytes = impl->options.bucket_bytes;
  h.entries_offset = entries_offset;
  h.slots_offset = slots_offset;
  h.descs_offset = descs_offset;
  h.descs_bytes = encoded.size();
  h.sent_offset = sent_offset;
  h.ring_offset = ring_offset;
  h.total_bytes = total;
  h.done_step = -1;
  std::memcpy(impl->seg.at_offset(descs_offset), encoded.data(), encoded.size());
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  at(h.ready).store(1, std::memory_order_release);

  // Every rank's descriptors, then the save's global plan: which blocks this rank sends.
  const auto deadline = Clock::now() + options.connect_timeout;
  std::vector<LocalPlan> locals(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) {
    locals[static_cast<std::size_t>(r)].rank = r;
    if (r == rank) {
      locals[static_cast<std::size_t>(r)].tensors = blocks;
      continue;
    }
    auto peer = wait_segment(segment_name(channel, r), 1, deadline, "trainer rank " + std::to_string(r));
    if (!peer.is_ok()) return peer.status().with_context("trainer rank " + std::to_string(rank) + " waiting for its peers");
    if (peer->header().world != world) {
      return invalid("trainer rank " + std::to_string(r) + " has a world of " + std::to_string(peer->header().world) +
                     ", trainer rank " + std::to_string(rank) + " of " + std::to_string(world));
    }
    auto descs = decode(peer->at_offset(peer->header().descs_offset), peer->header().descs_bytes, peer->header().n_descs);
    if (!descs.is_ok()) return descs.status();
    locals[static_cast<std::size_t>(r)].tensors = std::move(*descs);
  }
  std::vector<const LocalPlan*> plans;
  std::uint64_t plan_signature = 0x9e3779b97f4a7c15ull;
  for (const auto& l : locals) {
    plans.push_back(&l);
    plan_signature = (plan_signature ^ structure_signature(l.tensors)) * 0x100000001b3ull;
  }
  auto global = make_global_plan(plans);
  if (!global.is_ok()) return global.status().with_context("weight sync: the trainer ranks' blocks");
  impl->sent = global->writes[static_cast<std::size_t>(rank)];
  impl->blocks = std::move(blocks);
  impl->offsets = stream_offsets(impl->blocks, impl->sent, &h.stream_bytes);
  std::memcpy(impl->seg.at_offset(sent_offset), impl->sent.data(), 4 * impl->sent.size());
  h.n_sent = static_cast<std::uint32_t>(impl->sent.size());
  h.plan_signature = plan_signature;
  at(h.ready).store(2, std::memory_order_release);
  return std::unique_ptr<ShmWeightPublisher>(new ShmWeightPublisher(std::move(impl)));
}

Result<PushReport> ShmWeightPublisher::push_version(std::int64_t step, const StateDict& state, int wait_for,
                                                    bool late_only) {
  Impl& m = *impl_;
  SH_RETURN_IF_ERROR(check_state(state, m.signature, "trainer rank " + std::to_string(m.rank)));
  Header& h = m.seg.header();
  const std::uint64_t bucket = h.bucket_bytes;
  const std::uint64_t n_buckets = (h.stream_bytes + bucket - 1) / bucket;
  const std::uint64_t version = at(h.version).load() + 1;
  const std::uint64_t first = m.next_seq;
  m.next_seq += n_buckets;

  // Who takes part: every receiver waiting now, and those that come while the push waits for
  // `wait_for` of them (at most the receiver timeout; none when this rank sends nothing).
  struct Part {
    std::uint32_t entry;
    std::int32_t pid;
    std::string name;
    bool dropped = false;
  };
  std::vector<Part> parts;
  std::vector<bool> joined(h.max_receivers, false);
  const auto join_until = Clock::now() + m.options.receiver_timeout;
  const bool waits = wait_for > 0 && !m.sent.empty();
  for (;;) {
    const std::uint32_t seen = at(h.ack_word).load(std::memory_order_acquire);
    for (std::uint32_t i = 0; i < h.max_receivers; ++i) {
      ReceiverEntry& e = m.seg.entry(i);
      if (joined[i] || at(e.used).load(std::memory_order_acquire) == 0) continue;
      if (late_only && !late_for(e, step)) continue;  // the exchange below takes it only if it waits
      at(e.acked).store(first - 1, std::memory_order_relaxed);
      std::uint64_t want = kWant;
      if (at(e.want).compare_exchange_strong(want, version, std::memory_order_acq_rel)) {
        joined[i] = true;
        parts.push_back({i, e.pid, std::string(e.name, strnlen(e.name, sizeof e.name))});
      }
    }
    if (!waits || static_cast<int>(parts.size()) >= wait_for || Clock::now() >= join_until) break;
    futex_wait(h.ack_word, seen, milliseconds(5));
  }
  at(h.first_seq).store(first, std::memory_order_relaxed);
  at(h.n_buckets).store(n_buckets, std::memory_order_relaxed);
  at(h.step).store(step, std::memory_order_relaxed);
  at(h.version).store(version, std::memory_order_release);
  bump(h.data_word);

  PushReport report;
  report.version = version;
  report.step = step;
  report.bytes = sent_bytes();
  if (waits && static_cast<int>(parts.size()) < wait_for) {
    report.dropped.push_back(std::to_string(wait_for - static_cast<int>(parts.size())) + " of the " +
                             std::to_string(wait_for) + " receivers awaited did not wait for a version within " +
                             std::to_string(m.options.receiver_timeout.count()) + " ms");
  }
  // Waits until every taking part receiver took bucket `seq` (or left, or is dropped).
  auto wait_taken = [&](std::uint64_t seq) {
    const auto started = Clock::now();
    for (;;) {
      const std::uint32_t seen = at(h.ack_word).load(std::memory_order_acquire);
      bool all = true;
      for (Part& p : parts) {
        if (p.dropped) continue;
        ReceiverEntry& e = m.seg.entry(p.entry);
        if (at(e.want).load(std::memory_order_acquire) != version) continue;  // it left the version
        if (at(e.acked).load(std::memory_order_acquire) >= seq) continue;
        std::string why;
        if (process_gone(p.pid)) {
          why = "'" + p.name + "' (pid " + std::to_string(p.pid) + ") died";
        } else if (Clock::now() - started >= m.options.receiver_timeout) {
          why = "'" + p.name + "' (pid " + std::to_string(p.pid) + ") took no bucket for " +
                std::to_string(m.options.receiver_timeout.count()) + " ms";
        } else {
          all = false;
          continue;
        }
        std::uint64_t expected = version;
        if (at(e.want).compare_exchange_strong(expected, kDropped, std::memory_order_acq_rel)) {
          p.dropped = true;
          report.dropped.push_back(why);
          if (process_gone(p.pid)) at(e.used).store(0, std::memory_order_release);  // free for another
        }
      }
      if (all) return;
      futex_wait(h.ack_word, seen, milliseconds(5));
    }
  };
  for (std::uint64_t b = 0; b < n_buckets; ++b) {
    const std::uint64_t seq = first + b;
    if (b >= h.n_slots) wait_taken(seq - h.n_slots);
    const std::uint64_t begin = b * bucket, end = std::min(begin + bucket, h.stream_bytes);
    char* dst = m.seg.ring(seq);
    // The sent blocks this bucket holds a part of (offsets ascending).
    auto it = std::upper_bound(m.offsets.begin(), m.offsets.end(), begin);
    std::size_t k = it == m.offsets.begin() ? 0 : static_cast<std::size_t>(it - m.offsets.begin() - 1);
    for (; k < m.sent.size() && m.offsets[k] < end; ++k) {
      const ShardedTensor& t = state.tensors[m.sent[k]];
      const std::uint64_t o = m.offsets[k], n = t.desc.nbytes();
      const std::uint64_t x = std::max(o, begin), y = std::min(o + n, end);
      if (x >= y) continue;
      // A memcpy for host tensors; device ones through the copy engine.
      if (!copy_to_host(t.tensor.device(), static_cast<const char*>(t.tensor.data()) + (x - o), dst + (x - begin), y - x)) {
        // The receivers taking part are dropped from the version (their receive() says so).
        for (const Part& p : parts) {
          std::uint64_t expected = version;
          at(m.seg.entry(p.entry).want).compare_exchange_strong(expected, kDropped, std::memory_order_acq_rel);
        }
        bump(h.data_word);
        return Status{ErrorCode::internal, "weight sync: trainer rank " + std::to_string(m.rank) + ": copying '" +
                                               t.desc.name + "' from " + t.tensor.device().to_string() + " failed"};
      }
    }
    at(m.seg.slot(seq).seq).store(seq, std::memory_order_release);
    bump(h.data_word);
  }
  if (n_buckets > 0) wait_taken(first + n_buckets - 1);
  for (const Part& p : parts) {
    if (!p.dropped && at(m.seg.entry(p.entry).acked).load(std::memory_order_acquire) + 1 >= first + n_buckets) {
      report.delivered.push_back(p.name);
    }
  }
  at(h.done_step).store(step, std::memory_order_release);
  bump(h.data_word);
  return report;
}

}  // namespace stagehand
