#include "stagehand/checkpoint/metadata/gather.hpp"

#include <algorithm>
#include <set>
#include <span>
#include <string_view>
#include <unordered_map>

namespace stagehand {

namespace {

/// A DescriptorOf that finds rank r's descriptor in `by_rank[r]` with `find` (null: none).
template <class Holder, class Find>
DescriptorOf per_rank(std::vector<const Holder*> by_rank, Find find) {
  return [by_rank = std::move(by_rank), find](int rank, std::uint32_t tensor) -> const ShardedTensorDesc* {
    if (rank < 0 || static_cast<std::size_t>(rank) >= by_rank.size()) return nullptr;
    const Holder* holder = by_rank[static_cast<std::size_t>(rank)];
    return holder != nullptr ? find(*holder, tensor) : nullptr;
  };
}

}  // namespace

DescriptorOf descriptors_by_rank(std::vector<const std::vector<ShardedTensorDesc>*> by_rank) {
  return per_rank(std::move(by_rank), [](const std::vector<ShardedTensorDesc>& descs, std::uint32_t i) {
    return i < descs.size() ? &descs[i] : nullptr;
  });
}

DescriptorOf descriptors_of_states(std::vector<const StateDict*> by_rank) {
  return per_rank(std::move(by_rank), [](const StateDict& state, std::uint32_t i) {
    return i < state.tensors.size() ? &state.tensors[i].desc : nullptr;
  });
}

Result<GatheredMetadata> gather_reports(std::int64_t step, const std::vector<RankSaveReport>& reports,
                                        int world_size, const DescriptorOf& descriptor_of) {
  GatheredMetadata m;
  m.step = step;
  std::set<int> ranks;
  for (const auto& r : reports) {
    if (!r.status.is_ok())
      return r.status.with_context("rank " + std::to_string(r.rank) + " failed");
    if (r.step != step) {
      return Status{ErrorCode::internal, "rank " + std::to_string(r.rank) + " reported step " +
                                             std::to_string(r.step) + " for step " +
                                             std::to_string(step)};
    }
    if (r.rank < 0 || r.rank >= world_size || !ranks.insert(r.rank).second) {
      return Status{ErrorCode::internal,
                    "rank " + std::to_string(r.rank) + " reported twice or is outside the world"};
    }
  }
  if (static_cast<int>(ranks.size()) != world_size) {
    for (int rank = 0; rank < world_size; ++rank) {
      if (ranks.count(rank) == 0) {
        return Status{ErrorCode::aborted, "rank " + std::to_string(rank) + " did not report"};
      }
    }
  }
  // In rank order, so that the chunks of a tensor split by rank arrive already sorted.
  std::vector<const RankSaveReport*> by_rank;
  by_rank.reserve(reports.size());
  for (const auto& r : reports)
    by_rank.push_back(&r);
  std::sort(by_rank.begin(), by_rank.end(),
            [](const RankSaveReport* a, const RankSaveReport* b) { return a->rank < b->rank; });
  // One pass over the reports in the order they lie in memory: each chunk finds its tensor by
  // hash and is checked against the one before it; a second places every chunk in one vector,
  // tensor after tensor in name order (no vector per tensor: with 100,000 tensors those and a
  // map of whole entries held ~25 MB for the commit).
  struct Gathering {
    const ShardedTensorDesc* desc = nullptr;
    /// The last chunk's offsets so far, to see whether they came sorted.
    const Shape* last = nullptr;
    std::uint32_t count = 0;
    /// Elements the chunks hold, to be compared with the global shape's.
    std::int64_t covered = 0;
    bool sorted = true;
  };
  std::vector<Gathering> gathering;
  std::unordered_map<std::string_view, std::uint32_t> by_name;
  /// Every chunk's tensor and descriptor, in the order of the pass (resolved once).
  struct Placed {
    std::uint32_t tensor;
    const ShardedTensorDesc* desc;
  };
  std::vector<Placed> placed;
  for (const RankSaveReport* report : by_rank) {
    const RankSaveReport& r = *report;
    for (const auto& [name, value] : r.objects) {
      if (!is_valid_utf8(name) || !is_valid_utf8(value)) {
        return Status{ErrorCode::invalid_argument,
                      "object '" + name + "' of rank " + std::to_string(r.rank) +
                          ": its name and value must be UTF-8 text (JSON holds no other)"};
      }
      auto [it, inserted] = m.objects.emplace(name, value);
      if (!inserted && it->second != value) {
        return Status{
            ErrorCode::invalid_argument,
            "object '" + name + "' differs between ranks; give per-rank objects per-rank names"};
      }
    }
    for (const auto& b : r.buckets) {
      if (!m.files.emplace(b.file, FileMeta{b.size, b.xxh3}).second) {
        return Status{ErrorCode::internal, "file '" + b.file + "' reported twice"};
      }
      for (const auto& c : b.chunks) {
        const ShardedTensorDesc* d = descriptor_of(r.rank, c.tensor);
        if (d == nullptr) {
          return Status{ErrorCode::internal, "rank " + std::to_string(r.rank) + " reported a chunk of its tensor " +
                                                 std::to_string(c.tensor) + ", which its plan does not hold"};
        }
        auto [found, inserted] = by_name.try_emplace(d->name, static_cast<std::uint32_t>(gathering.size()));
        if (inserted) {
          if (!is_valid_utf8(d->name)) {
            return Status{ErrorCode::invalid_argument,
                          "tensor '" + d->name + "': its name must be UTF-8 text (JSON holds no other)"};
          }
          gathering.push_back({d, nullptr, 0, 0, true});
        }
        Gathering& t = gathering[found->second];
        if (t.desc->dtype != d->dtype || !(t.desc->global_shape == d->global_shape)) {
          return Status{ErrorCode::invalid_argument, "tensor '" + d->name +
                                                         "' has a different dtype or global shape on rank " +
                                                         std::to_string(r.rank)};
        }
        if (t.last != nullptr && !(*t.last < d->global_offset)) t.sorted = false;
        t.last = &d->global_offset;
        ++t.count;
        t.covered += d->local_shape.numel();
        placed.push_back({found->second, d});
      }
    }
  }
  by_name = {};
  // In name order, so that of several bad tensors the first by name is the one reported.
  std::vector<std::uint32_t> by_order(gathering.size());
  for (std::uint32_t i = 0; i < by_order.size(); ++i) by_order[i] = i;
  std::sort(by_order.begin(), by_order.end(), [&](std::uint32_t a, std::uint32_t b) {
    return gathering[a].desc->name < gathering[b].desc->name;
  });
  // Each tensor's first place in m.chunks; filled in the pass's order (chunks that came sorted
  // stay so).
  std::vector<std::size_t> next(gathering.size());
  std::size_t at = 0;
  for (std::uint32_t t : by_order) {
    next[t] = at;
    at += gathering[t].count;
  }
  m.chunks.resize(at);
  std::size_t k = 0;
  for (const RankSaveReport* report : by_rank) {
    for (const auto& b : report->buckets) {
      for (const auto& c : b.chunks) {
        const Placed& p = placed[k++];
        m.chunks[next[p.tensor]++] = {&c, p.desc, &b.file};
      }
    }
  }
  placed = {};
  m.tensors.reserve(gathering.size());
  at = 0;
  for (std::uint32_t index : by_order) {
    const Gathering& t = gathering[index];
    const std::string name(t.desc->name);
    const std::span<GatheredChunk> chunks(m.chunks.data() + at, t.count);
    at += t.count;
    auto offsets = [](const GatheredChunk& c) -> const Shape& { return c.desc->global_offset; };
    if (!t.sorted) {
      std::sort(chunks.begin(), chunks.end(),
                [&](const GatheredChunk& a, const GatheredChunk& b) { return offsets(a) < offsets(b); });
      for (std::size_t i = 1; i < chunks.size(); ++i) {
        if (offsets(chunks[i]) == offsets(chunks[i - 1])) {
          return Status{ErrorCode::invalid_argument, "tensor '" + name + "' has two chunks at " +
                                                         offsets(chunks[i]).to_string() + " with replica id 0"};
        }
      }
    }
    if (t.covered != t.desc->global_shape.numel()) {
      return Status{ErrorCode::invalid_argument, "tensor '" + name + "': the saved chunks hold " +
                                                     std::to_string(t.covered) + " of its " +
                                                     std::to_string(t.desc->global_shape.numel()) +
                                                     " elements (a block with no replica 0?)"};
    }
    m.tensors.push_back({t.desc, chunks});
  }
  return m;
}

}  // namespace stagehand
