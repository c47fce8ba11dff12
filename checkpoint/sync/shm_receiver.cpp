// The inference side of the shared-memory weight-sync channel (shm_channel.hpp): connecting to every
// trainer rank's segment and taking versions out of their rings.
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
#include "stagehand/core/thread_pool.hpp"

namespace stagehand {

using namespace shm_detail;

// ---------------------------------------------------------------------------------------------
// Receiver

struct ShmWeightReceiver::Impl {
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
    at(e.min_step).store(min_step, std::memory_order_relaxed);
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
      at(e.have_step).store(step, std::memory_order_relaxed);  // published by the release below
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
    auto parts = receiver_parts(rank.descs, rank.sent, blocks, who, covered, held);
    if (!parts.is_ok()) return parts.status();
    rank.parts = std::move(*parts);
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
  SH_RETURN_IF_ERROR(check_covered(blocks, covered, held, who));
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
      at(e.have_step).store(INT64_MIN, std::memory_order_relaxed);
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
  SH_RETURN_IF_ERROR(check_state(state, m.signature, "receiver '" + m.name + "'"));
  const auto deadline = Clock::now() + timeout;
  // One thread per trainer rank taken from, kept for the receiver's life; the first rank's part
  // on the calling thread.
  if (!m.pool && m.ranks.size() > 1) m.pool = std::make_unique<ThreadPool>(static_cast<int>(m.ranks.size() - 1));
  return receive_agreeing(m.ranks.size(), m.pool.get(), min_step,
                          [&](std::size_t i, std::int64_t target) { return m.take(m.ranks[i], state, target, deadline); });
}

void ShmWeightReceiver::stop() { impl_->stopped.store(true, std::memory_order_release); }

std::int64_t ShmWeightReceiver::newest_pushed_step() const {
  std::int64_t newest = -1;
  for (const auto& r : impl_->ranks) newest = std::max(newest, at(r.seg.header().done_step).load(std::memory_order_acquire));
  for (const auto& s : impl_->others) newest = std::max(newest, at(s.header().done_step).load(std::memory_order_acquire));
  return newest;
}

}  // namespace stagehand
