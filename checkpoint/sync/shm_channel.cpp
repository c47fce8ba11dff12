#include "stagehand/checkpoint/sync/shm_channel.hpp"

#include "stagehand/core/thread_pool.hpp"

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
#include "stagehand/core/thread_pool.hpp"

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

Result<PushReport> ShmWeightPublisher::push(std::int64_t step, const StateDict& state, int wait_for) {
  Impl& m = *impl_;
  SH_RETURN_IF_ERROR(check_host_state(state, m.signature, "trainer rank " + std::to_string(m.rank)));
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
      std::memcpy(dst + (x - begin), static_cast<const char*>(t.tensor.data()) + (x - o), y - x);
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

// ---------------------------------------------------------------------------------------------
// Receiver

struct ShmWeightReceiver::Impl {
  struct Part {
    std::uint32_t sent_index;  // into the rank's sent list
    std::uint32_t block;       // this receiver's block
  };
  struct Rank {
    int rank = 0;
    Mapping seg;
    std::vector<ShardedTensorDesc> descs;
    std::vector<std::uint32_t> sent;
    std::vector<std::uint64_t> offsets;
    std::vector<Part> parts;
    std::vector<bool> bucket_needed;
    std::uint32_t entry = 0;
  };
  std::string name;
  std::vector<ShardedTensorDesc> blocks;
  std::uint64_t signature = 0;
  std::vector<Rank> ranks;  // only the trainer ranks that send a part of this receiver's blocks
  std::vector<Mapping> others;
  WeightChannelOptions options;
  std::unique_ptr<ThreadPool> pool;  // made at the first receive(); idle whenever receive() is not running
  std::atomic<bool> stopped{false};

  ~Impl() {
    for (Rank& r : ranks) {
      ReceiverEntry& e = r.seg.entry(r.entry);
      at(e.want).store(kIdle, std::memory_order_release);
      at(e.used).store(0, std::memory_order_release);
      bump(r.seg.header().ack_word);
    }
  }

  /// Takes the next version of rank `r` whose step is >= `min_step` into `state`.
  Result<std::int64_t> take(Rank& r, StateDict& state, std::int64_t min_step, Clock::time_point deadline) {
    const auto now = Clock::now();
    const Clock::time_point hard_deadline = deadline + std::max<Clock::duration>(deadline - now, std::chrono::seconds(1));
    Header& h = r.seg.header();
    ReceiverEntry& e = r.seg.entry(r.entry);
    const std::string who = "trainer rank " + std::to_string(r.rank);
    auto leave = [&](Status st) {
      at(e.want).store(kIdle, std::memory_order_release);
      bump(h.ack_word);
      return st;
    };
    // Why waiting must stop, if it must.
    auto stop = [&](const char* waiting_for) -> std::optional<Status> {
      if (at(h.closed).load(std::memory_order_acquire) != 0) {
        return Status{ErrorCode::io_error, "weight sync: " + who + " closed the channel"};
      }
      if (process_gone(h.pid)) {
        return Status{ErrorCode::io_error, "weight sync: " + who + " (pid " + std::to_string(h.pid) + ") is gone"};
      }
      if (at(e.want).load(std::memory_order_acquire) == kDropped) {
        return Status{ErrorCode::aborted, "weight sync: " + who + " dropped receiver '" + name +
                                              "' from version " + std::to_string(at(h.version).load()) +
                                              ": it took a bucket later than the publisher's receiver timeout"};
      }
      if (stopped.load(std::memory_order_acquire)) {
        return Status{ErrorCode::aborted, "weight sync: receiver '" + name + "' was stopped"};
      }
      if (Clock::now() >= deadline) {
        // Before a version took it in, it leaves; once one did, it takes part to the version's
        // end (the publisher drops it if it is too slow), up to a second timeout's length.
        std::uint64_t expected = kWant;
        if (at(e.want).load(std::memory_order_acquire) == kWant) {
          at(e.want).compare_exchange_strong(expected, kIdle, std::memory_order_acq_rel);
        }
        const std::uint64_t w = at(e.want).load(std::memory_order_acquire);
        const bool taken_in = w != kWant && w != kIdle && w != kDropped;
        if (taken_in && Clock::now() < hard_deadline) return std::nullopt;
        return Status{ErrorCode::timeout, "weight sync: receiver '" + name + "' waited in vain for " +
                                                        waiting_for + " of " + who};
      }
      return std::nullopt;
    };
    at(e.want).store(kWant, std::memory_order_release);
    bump(h.ack_word);  // a push waiting for receivers to join sees this one at once
    for (;;) {
      // Wait until a version takes this receiver in.
      std::uint64_t version = 0;
      for (;;) {
        const std::uint32_t seen = at(h.data_word).load(std::memory_order_acquire);
        const std::uint64_t w = at(e.want).load(std::memory_order_acquire);
        if (w != kWant && w != kDropped && w != kIdle && at(h.version).load(std::memory_order_acquire) >= w) {
          version = w;
          break;
        }
        if (auto st = stop("a version")) return leave(*st);
        futex_wait(h.data_word, seen, milliseconds(5));
      }
      const std::uint64_t first = at(h.first_seq).load(std::memory_order_relaxed);
      const std::uint64_t n_buckets = at(h.n_buckets).load(std::memory_order_relaxed);
      const std::int64_t step = at(h.step).load(std::memory_order_relaxed);
      if (step < min_step) {  // not new enough: let it pass and wait for the next
        at(e.acked).store(first + n_buckets - 1, std::memory_order_release);
        std::uint64_t expected = version;
        at(e.want).compare_exchange_strong(expected, kWant, std::memory_order_acq_rel);
        bump(h.ack_word);
        continue;
      }
      const std::uint64_t bucket = h.bucket_bytes;
      std::size_t next_part = 0;
      for (std::uint64_t b = 0; b < n_buckets; ++b) {
        const std::uint64_t seq = first + b;
        if (r.bucket_needed[b]) {
          for (;;) {
            const std::uint32_t seen = at(h.data_word).load(std::memory_order_acquire);
            if (at(r.seg.slot(seq).seq).load(std::memory_order_acquire) == seq) break;
            if (auto st = stop("a bucket")) return leave(*st);
            futex_wait(h.data_word, seen, milliseconds(5));
          }
          const std::uint64_t begin = b * bucket, end = std::min(begin + bucket, h.stream_bytes);
          const char* src = r.seg.ring(seq);
          // Parts are ordered by their sent block's offset: skip those wholly before this bucket.
          while (next_part < r.parts.size() &&
                 r.offsets[r.parts[next_part].sent_index] + r.descs[r.sent[r.parts[next_part].sent_index]].nbytes() <= begin) {
            ++next_part;
          }
          for (std::size_t p = next_part; p < r.parts.size(); ++p) {
            const Part& part = r.parts[p];
            const ShardedTensorDesc& from = r.descs[r.sent[part.sent_index]];
            const std::uint64_t o = r.offsets[part.sent_index], n = from.nbytes();
            if (o >= end) break;
            const std::uint64_t x = std::max(o, begin), y = std::min(o + n, end);
            if (x >= y) continue;
            const std::size_t elem = dtype_size(from.dtype);
            ShardedTensor& to = state.tensors[part.block];
            if (!copy_overlap_part(chunk_of(from), to.desc, elem, static_cast<std::int64_t>((x - o) / elem),
                                   static_cast<std::int64_t>((y - o) / elem),
                                   reinterpret_cast<const std::uint8_t*>(src + (x - begin)),
                                   static_cast<std::uint8_t*>(to.tensor.data()), to.tensor.device())) {
              return leave({ErrorCode::internal, "weight sync: a copy into '" + to.desc.name + "' failed"});
            }
          }
        }
        at(e.acked).store(seq, std::memory_order_release);
        bump(h.ack_word);
      }
      if (auto st = stop("nothing"); st && st->code() == ErrorCode::aborted) return leave(*st);
      std::uint64_t expected = version;
      at(e.want).compare_exchange_strong(expected, kIdle, std::memory_order_acq_rel);
      bump(h.ack_word);
      return step;
    }
  }
};

ShmWeightReceiver::ShmWeightReceiver(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ShmWeightReceiver::~ShmWeightReceiver() = default;

Result<std::unique_ptr<ShmWeightReceiver>> ShmWeightReceiver::connect(const std::string& channel,
                                                                      const std::string& name,
                                                                      std::vector<ShardedTensorDesc> blocks,
                                                                      const WeightChannelOptions& options) {
  SH_RETURN_IF_ERROR(check_channel(channel));
  const std::string who = "receiver '" + name + "'";
  if (name.empty() || name.size() >= sizeof(ReceiverEntry::name)) {
    return invalid("a receiver's name must be 1 to " + std::to_string(sizeof(ReceiverEntry::name) - 1) + " bytes");
  }
  for (const auto& b : blocks) SH_RETURN_IF_ERROR(b.validate().with_context("weight sync: " + who));
  auto impl = std::make_unique<Impl>();
  impl->name = name;
  impl->options = options;
  impl->signature = structure_signature(blocks);
  const auto deadline = Clock::now() + options.connect_timeout;
  auto first = wait_segment(segment_name(channel, 0), 2, deadline, "trainer rank 0");
  if (!first.is_ok()) return first.status().with_context(who + " connecting");
  const int world = first->header().world;
  const std::uint64_t plan_signature = first->header().plan_signature;
  std::vector<std::int64_t> covered(blocks.size(), 0);
  std::vector<bool> held(blocks.size(), false);
  for (int r = 0; r < world; ++r) {
    Impl::Rank rank;
    rank.rank = r;
    if (r == 0) {
      rank.seg = std::move(*first);
    } else {
      auto seg = wait_segment(segment_name(channel, r), 2, deadline, "trainer rank " + std::to_string(r));
      if (!seg.is_ok()) return seg.status().with_context(who + " connecting");
      rank.seg = std::move(*seg);
    }
    const Header& h = rank.seg.header();
    if (h.world != world || h.plan_signature != plan_signature) {
      return invalid("trainer rank " + std::to_string(r) + " belongs to another run of channel '" + channel +
                     "' than trainer rank 0 (other world or blocks)");
    }
    auto descs = decode(rank.seg.at_offset(h.descs_offset), h.descs_bytes, h.n_descs);
    if (!descs.is_ok()) return descs.status();
    rank.descs = std::move(*descs);
    rank.sent.resize(h.n_sent);
    std::memcpy(rank.sent.data(), rank.seg.at_offset(h.sent_offset), 4 * rank.sent.size());
    for (std::uint32_t k : rank.sent) {
      if (k >= rank.descs.size()) return Status{ErrorCode::corruption, "weight sync: trainer rank " + std::to_string(r) + "'s segment is damaged"};
    }
    std::uint64_t stream = 0;
    rank.offsets = stream_offsets(rank.descs, rank.sent, &stream);
    if (stream != h.stream_bytes) return Status{ErrorCode::corruption, "weight sync: trainer rank " + std::to_string(r) + "'s segment is damaged"};
    for (std::uint32_t s = 0; s < rank.sent.size(); ++s) {
      const ShardedTensorDesc& from = rank.descs[rank.sent[s]];
      for (std::uint32_t j = 0; j < blocks.size(); ++j) {
        const ShardedTensorDesc& block = blocks[j];
        if (from.name != block.name) continue;
        if (from.dtype != block.dtype || from.global_shape != block.global_shape) {
          return invalid(who + "'s tensor '" + block.name + "' is " + std::string(dtype_name(block.dtype)) + " " +
                         block.global_shape.to_string() + ", the trainer ranks' " +
                         std::string(dtype_name(from.dtype)) + " " + from.global_shape.to_string());
        }
        held[j] = true;
        const std::int64_t n = overlap_numel(chunk_of(from), block);
        if (n == 0) continue;
        covered[j] += n;
        rank.parts.push_back({s, j});
      }
    }
    if (rank.parts.empty()) {
      impl->others.push_back(std::move(rank.seg));
      continue;
    }
    const std::uint64_t n_buckets = (h.stream_bytes + h.bucket_bytes - 1) / h.bucket_bytes;
    rank.bucket_needed.assign(n_buckets, false);
    for (const auto& part : rank.parts) {
      const std::uint64_t o = rank.offsets[part.sent_index], n = rank.descs[rank.sent[part.sent_index]].nbytes();
      if (n == 0) continue;
      for (std::uint64_t b = o / h.bucket_bytes; b <= (o + n - 1) / h.bucket_bytes; ++b) rank.bucket_needed[b] = true;
    }
    impl->ranks.push_back(std::move(rank));
  }
  for (std::size_t j = 0; j < blocks.size(); ++j) {
    if (!held[j]) return invalid(who + "'s tensor '" + blocks[j].name + "' is held by no trainer rank");
    if (covered[j] != blocks[j].local_shape.numel()) {
      return Status{ErrorCode::internal, "weight sync: " + who + "'s block of '" + blocks[j].name + "' is covered by " +
                                             std::to_string(covered[j]) + " of its " +
                                             std::to_string(blocks[j].local_shape.numel()) + " elements"};
    }
  }
  // Register with each rank that sends a part.
  for (auto& rank : impl->ranks) {
    Header& h = rank.seg.header();
    bool taken = false;
    for (std::uint32_t i = 0; i < h.max_receivers && !taken; ++i) {
      ReceiverEntry& e = rank.seg.entry(i);
      std::uint32_t free_entry = 0;
      if (!at(e.used).compare_exchange_strong(free_entry, 2, std::memory_order_acq_rel)) continue;
      e.pid = static_cast<std::int32_t>(getpid());
      std::memset(e.name, 0, sizeof e.name);
      std::memcpy(e.name, name.data(), name.size());
      at(e.want).store(kIdle, std::memory_order_relaxed);
      at(e.used).store(1, std::memory_order_release);
      rank.entry = i;
      taken = true;
    }
    if (!taken) {
      // The entries of ranks registered so far are freed by ~Impl: only those in `ranks` before this one.
      auto& ranks = impl->ranks;
      ranks.erase(std::find_if(ranks.begin(), ranks.end(), [&](const Impl::Rank& x) { return &x == &rank; }), ranks.end());
      return Status{ErrorCode::unsupported, "weight sync: trainer rank " + std::to_string(h.rank) + " serves " +
                                                       std::to_string(h.max_receivers) + " receivers already"};
    }
  }
  impl->blocks = std::move(blocks);
  return std::unique_ptr<ShmWeightReceiver>(new ShmWeightReceiver(std::move(impl)));
}

Result<std::int64_t> ShmWeightReceiver::receive(StateDict& state, std::int64_t min_step,
                                                std::chrono::milliseconds timeout) {
  Impl& m = *impl_;
  SH_RETURN_IF_ERROR(check_host_state(state, m.signature, "receiver '" + m.name + "'"));
  const auto deadline = Clock::now() + timeout;
  std::vector<Result<std::int64_t>> steps(m.ranks.size(), Result<std::int64_t>(std::int64_t{-1}));
  std::vector<bool> again(m.ranks.size(), true);
  std::int64_t target = min_step;
  // One thread per trainer rank taken from, kept for the receiver's life; the first rank's part
  // on the calling thread.
  if (!m.pool && m.ranks.size() > 1) m.pool = std::make_unique<ThreadPool>(static_cast<int>(m.ranks.size() - 1));
  for (;;) {
    std::vector<std::future<void>> parts;
    std::size_t here = m.ranks.size();
    for (std::size_t i = 0; i < m.ranks.size(); ++i) {
      if (!again[i]) continue;
      if (here == m.ranks.size()) {
        here = i;
        continue;
      }
      parts.push_back(m.pool->submit([&, i] { steps[i] = m.take(m.ranks[i], state, target, deadline); }));
    }
    if (here < m.ranks.size()) steps[here] = m.take(m.ranks[here], state, target, deadline);
    for (auto& f : parts) f.get();
    std::int64_t newest = target;
    for (auto& s : steps) {
      if (!s.is_ok()) return s.status();
      newest = std::max(newest, *s);
    }
    // Every rank's part of one step: those behind take their next version of at least that step.
    bool agree = true;
    for (std::size_t i = 0; i < m.ranks.size(); ++i) {
      again[i] = *steps[i] != newest;
      agree = agree && !again[i];
    }
    if (agree) return newest;
    target = newest;
  }
}

void ShmWeightReceiver::stop() { impl_->stopped.store(true, std::memory_order_release); }

std::int64_t ShmWeightReceiver::newest_pushed_step() const {
  std::int64_t newest = -1;
  for (const auto& r : impl_->ranks) newest = std::max(newest, at(r.seg.header().done_step).load(std::memory_order_acquire));
  for (const auto& s : impl_->others) newest = std::max(newest, at(s.header().done_step).load(std::memory_order_acquire));
  return newest;
}

}  // namespace stagehand
