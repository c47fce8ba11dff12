#pragma once

// What both weight-sync channels (shared memory: shm_channel.hpp, TCP: tcp_channel.hpp) share:
// descriptors in binary form, the checks of names and states, and which parts of a trainer rank's
// sent blocks a receiver's blocks overlap.

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstring>
#include <future>
#include <string>
#include <vector>

#include "stagehand/checkpoint/load/reshard.hpp"
#include "stagehand/checkpoint/save/planner.hpp"
#include "stagehand/core/sharded_tensor.hpp"
#include "stagehand/core/status.hpp"
#include "stagehand/core/thread_pool.hpp"

namespace stagehand::sync_detail {

inline Status invalid(const std::string& why) { return {ErrorCode::invalid_argument, "weight sync: " + why}; }

inline Status check_channel(const std::string& channel) {
  if (channel.empty() || channel.size() > 200 ||
      !std::all_of(channel.begin(), channel.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-';
      })) {
    return invalid("channel name '" + channel + "' must be 1 to 200 of [A-Za-z0-9_.-]");
  }
  return Status::ok();
}

// ---- Descriptors on the wire (a segment, a socket): a small binary form, read with bounds checks.

inline void put(std::string& out, const void* p, std::size_t n) { out.append(static_cast<const char*>(p), n); }

inline void put_shape(std::string& out, const Shape& s) {
  const auto rank = static_cast<std::uint8_t>(s.rank());
  put(out, &rank, 1);
  for (std::size_t i = 0; i < s.rank(); ++i) {
    const std::int64_t d = s[i];
    put(out, &d, 8);
  }
}

inline std::string encode(const std::vector<ShardedTensorDesc>& descs) {
  std::string out;
  for (const auto& d : descs) {
    const auto n = static_cast<std::uint32_t>(d.name.size());
    put(out, &n, 4);
    out += d.name;
    const auto dt = static_cast<std::uint8_t>(d.dtype);
    put(out, &dt, 1);
    put_shape(out, d.global_shape);
    put_shape(out, d.global_offset);
    put_shape(out, d.local_shape);
    put(out, &d.replica_id, 4);
  }
  return out;
}

struct Decoder {
  const char* p;
  const char* end;
  bool ok = true;
  void get(void* dst, std::size_t n) {
    if (!ok || static_cast<std::size_t>(end - p) < n) {
      ok = false;
      return;
    }
    std::memcpy(dst, p, n);
    p += n;
  }
  Shape shape() {
    std::uint8_t rank = 0;
    get(&rank, 1);
    std::vector<std::int64_t> dims(rank);
    for (auto& d : dims) get(&d, 8);
    return Shape(dims);
  }
};

inline Result<std::vector<ShardedTensorDesc>> decode(const char* p, std::size_t n, std::uint32_t count) {
  Decoder in{p, p + n};
  std::vector<ShardedTensorDesc> out(count);
  for (auto& d : out) {
    std::uint32_t len = 0;
    in.get(&len, 4);
    if (!in.ok || len > n) break;
    d.name.resize(len);
    in.get(d.name.data(), len);
    std::uint8_t dt = 0;
    in.get(&dt, 1);
    d.dtype = static_cast<DType>(dt);
    d.global_shape = in.shape();
    d.global_offset = in.shape();
    d.local_shape = in.shape();
    in.get(&d.replica_id, 4);
  }
  if (!in.ok) return Status{ErrorCode::corruption, "weight sync: a trainer rank sent damaged descriptors"};
  return out;
}

inline Status check_state(const StateDict& state, std::uint64_t signature, const std::string& who) {
  if (structure_signature(state) != signature) {
    return invalid(who + "'s state has other tensors or shapes than it was created with");
  }
  return state.validate().with_context("weight sync: " + who);
}


/// One overlap of a trainer rank's sent block with one of a receiver's blocks.
struct Part {
  std::uint32_t sent_index;  // into the rank's sent list
  std::uint32_t block;       // the receiver's block
};

/// The parts trainer rank `rank` (blocks `descs`, sending `sent`) gives a receiver of `blocks`,
/// ordered by sent block; adds each part's elements to `covered` and marks `held` the blocks the
/// rank has a tensor of. Errors: a receiver tensor of another dtype or global shape than the
/// trainer ranks', a sent index outside `descs`.
inline Result<std::vector<Part>> receiver_parts(const std::vector<ShardedTensorDesc>& descs,
                                                const std::vector<std::uint32_t>& sent,
                                                const std::vector<ShardedTensorDesc>& blocks, const std::string& who,
                                                std::vector<std::int64_t>& covered, std::vector<bool>& held) {
  std::vector<Part> parts;
  for (std::uint32_t s = 0; s < sent.size(); ++s) {
    if (sent[s] >= descs.size()) return Status{ErrorCode::corruption, "weight sync: a trainer rank's plan is damaged"};
    const ShardedTensorDesc& from = descs[sent[s]];
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
      parts.push_back({s, j});
    }
  }
  return parts;
}

/// After every rank's receiver_parts: each block held and wholly covered, or the error naming it.
inline Status check_covered(const std::vector<ShardedTensorDesc>& blocks, const std::vector<std::int64_t>& covered,
                            const std::vector<bool>& held, const std::string& who) {
  for (std::size_t j = 0; j < blocks.size(); ++j) {
    if (!held[j]) return invalid(who + "'s tensor '" + blocks[j].name + "' is held by no trainer rank");
    if (covered[j] != blocks[j].local_shape.numel()) {
      return Status{ErrorCode::internal, "weight sync: " + who + "'s block of '" + blocks[j].name + "' is covered by " +
                                             std::to_string(covered[j]) + " of its " +
                                             std::to_string(blocks[j].local_shape.numel()) + " elements"};
    }
  }
  return Status::ok();
}

/// A receive over `n` trainer ranks: `take(i, target)` takes rank i's next version of step >=
/// target (rank 0 of them on the calling thread, the others on `pool`); ranks behind the newest
/// step any returned take again, until all return one step. The first error ends it.
template <class Take>
Result<std::int64_t> receive_agreeing(std::size_t n, ThreadPool* pool, std::int64_t min_step, Take take) {
  std::vector<Result<std::int64_t>> steps(n, Result<std::int64_t>(std::int64_t{-1}));
  std::vector<bool> again(n, true);
  std::int64_t target = min_step;
  for (;;) {
    std::vector<std::future<void>> parts;
    std::size_t here = n;
    for (std::size_t i = 0; i < n; ++i) {
      if (!again[i]) continue;
      if (here == n) {
        here = i;
        continue;
      }
      parts.push_back(pool->submit([&, i] { steps[i] = take(i, target); }));
    }
    if (here < n) steps[here] = take(here, target);
    for (auto& f : parts) f.get();
    std::int64_t newest = target;
    for (auto& s : steps) {
      if (!s.is_ok()) return s.status();
      newest = std::max(newest, *s);
    }
    bool agree = true;
    for (std::size_t i = 0; i < n; ++i) {
      again[i] = *steps[i] != newest;
      agree = agree && !again[i];
    }
    if (agree) return newest;
    target = newest;
  }
}

}  // namespace stagehand::sync_detail
