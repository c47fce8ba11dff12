#pragma once

// The shared-memory segment of a weight-sync channel (the internals of shm_publisher.cpp and
// shm_receiver.cpp): its layout, the futex waits, descriptors in binary form, mapping and waiting
// for a rank's segment.

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <climits>
#include <csignal>
#include <cstring>
#include <ctime>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "stagehand/checkpoint/save/planner.hpp"
#include "stagehand/checkpoint/sync/channel_wire.hpp"
#include "stagehand/core/sharded_tensor.hpp"
#include "stagehand/core/status.hpp"

namespace stagehand::shm_detail {

using namespace sync_detail;

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// ---- The segment: plain integers in shared memory, read and written through std::atomic_ref.

constexpr char kMagic[8] = {'S', 'H', 'W', 'S', 'Y', 'N', 'C', '2'};
constexpr std::uint64_t kAlign = 64;
/// ReceiverEntry::want: not waiting, waiting for the next version, dropped by the publisher;
/// any other value is the version the receiver takes part in.
constexpr std::uint64_t kIdle = 0, kWant = ~0ull, kDropped = ~0ull - 1;

struct Header {
  char magic[8];
  std::int32_t rank, world, pid;
  std::uint32_t n_slots, max_receivers, n_descs, n_sent;
  std::uint64_t bucket_bytes, entries_offset, slots_offset, descs_offset, descs_bytes, sent_offset, ring_offset,
      total_bytes, stream_bytes, plan_signature;
  std::uint32_t ready;  // 1: descriptors written; 2: the sent blocks written too
  std::uint32_t closed;
  std::uint32_t data_word;  // futex, bumped by the publisher: a version begun, a bucket written, closed
  std::uint32_t ack_word;   // futex, bumped by receivers: a bucket taken, a version left
  std::uint64_t version, first_seq, n_buckets;
  std::int64_t step, done_step;
};

struct ReceiverEntry {
  std::uint32_t used;
  std::int32_t pid;
  std::uint64_t want;
  std::uint64_t acked;     // the last bucket sequence number taken
  std::int64_t min_step;   // while it waits: the least step it takes (written before `want`)
  std::int64_t have_step;  // the last step it took from this rank (INT64_MIN: none; before `want`)
  char name[88];
};
static_assert(sizeof(ReceiverEntry) == 128);

struct Slot {
  std::uint64_t seq;  // the bucket sequence number it holds (0: none yet)
  std::uint64_t pad[7];
};

template <class T>
inline std::atomic_ref<T> at(T& x) {
  return std::atomic_ref<T>(x);
}

inline std::uint64_t align_up(std::uint64_t n, std::uint64_t a) { return (n + a - 1) / a * a; }

inline void futex_wait(std::uint32_t& word, std::uint32_t seen, milliseconds most) {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(most.count() / 1000);
  ts.tv_nsec = static_cast<long>((most.count() % 1000) * 1000000);
  syscall(SYS_futex, &word, FUTEX_WAIT, seen, &ts, nullptr, 0);
}

inline void bump(std::uint32_t& word) {
  at(word).fetch_add(1, std::memory_order_acq_rel);
  syscall(SYS_futex, &word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

inline bool process_gone(std::int32_t pid) { return pid > 0 && kill(pid, 0) == -1 && errno == ESRCH; }

inline std::string segment_name(const std::string& channel, int rank) {
  return "/stagehand-" + channel + "-s" + std::to_string(rank);
}

// ---- A mapped segment.

struct Mapping {
  void* base = nullptr;
  std::size_t size = 0;
  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  Mapping(Mapping&& o) noexcept : base(std::exchange(o.base, nullptr)), size(std::exchange(o.size, 0)) {}
  Mapping& operator=(Mapping&& o) noexcept {
    if (this != &o) {
      if (base) munmap(base, size);
      base = std::exchange(o.base, nullptr);
      size = std::exchange(o.size, 0);
    }
    return *this;
  }
  ~Mapping() {
    if (base) munmap(base, size);
  }
  Header& header() const { return *static_cast<Header*>(base); }
  char* at_offset(std::uint64_t off) const { return static_cast<char*>(base) + off; }
  ReceiverEntry& entry(std::uint32_t i) const {
    return reinterpret_cast<ReceiverEntry*>(at_offset(header().entries_offset))[i];
  }
  Slot& slot(std::uint64_t seq) const {
    return reinterpret_cast<Slot*>(at_offset(header().slots_offset))[seq % header().n_slots];
  }
  char* ring(std::uint64_t seq) const {
    return at_offset(header().ring_offset) + (seq % header().n_slots) * header().bucket_bytes;
  }
};

/// Opens `name` once it exists and its publisher has written up to `ready`; nullopt on timeout.
inline Result<std::optional<Mapping>> open_segment(const std::string& name, std::uint32_t ready) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) {
    if (errno == ENOENT) return std::optional<Mapping>{};
    return Status{ErrorCode::io_error, "weight sync: opening " + name + ": " + std::strerror(errno)};
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) < sizeof(Header)) {
    close(fd);
    return std::optional<Mapping>{};  // being created: its size is not set yet
  }
  Mapping m;
  m.size = static_cast<std::size_t>(st.st_size);
  m.base = mmap(nullptr, m.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (m.base == MAP_FAILED) {
    m.base = nullptr;
    return Status{ErrorCode::io_error, "weight sync: mapping " + name + ": " + std::strerror(errno)};
  }
  if (std::memcmp(m.header().magic, kMagic, sizeof kMagic) != 0 ||
      at(m.header().ready).load(std::memory_order_acquire) < ready || at(m.header().closed).load() != 0 ||
      m.header().total_bytes != m.size) {
    return std::optional<Mapping>{};
  }
  return std::optional<Mapping>{std::move(m)};
}

inline Result<Mapping> wait_segment(const std::string& name, std::uint32_t ready, Clock::time_point deadline,
                             const std::string& who) {
  for (;;) {
    auto m = open_segment(name, ready);
    if (!m.is_ok()) return m.status();
    if (*m) return std::move(**m);
    if (Clock::now() >= deadline) {
      return Status{ErrorCode::timeout, "weight sync: " + who + " (" + name + ") did not come up in time"};
    }
    std::this_thread::sleep_for(milliseconds(5));
  }
}

/// Where each sent block lies in a version's stream of bytes (each at a multiple of 64).
inline std::vector<std::uint64_t> stream_offsets(const std::vector<ShardedTensorDesc>& descs,
                                          const std::vector<std::uint32_t>& sent, std::uint64_t* total) {
  std::vector<std::uint64_t> offsets;
  std::uint64_t at_byte = 0;
  for (std::uint32_t k : sent) {
    offsets.push_back(at_byte);
    at_byte = align_up(at_byte + descs[k].nbytes(), kAlign);
  }
  *total = at_byte;
  return offsets;
}

}  // namespace stagehand::shm_detail
