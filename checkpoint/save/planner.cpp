#include "stagehand/checkpoint/save/planner.hpp"

#include <algorithm>
#include <numeric>

#include "stagehand/checkpoint/format/format.hpp"

namespace stagehand {

std::uint64_t SavePlan::data_bytes() const {
  return std::accumulate(buckets.begin(), buckets.end(), std::uint64_t{0},
                         [](std::uint64_t sum, const PlannedBucket& b) { return sum + b.data_bytes; });
}

std::uint64_t SavePlan::file_bytes() const {
  return std::accumulate(buckets.begin(), buckets.end(), std::uint64_t{0},
                         [](std::uint64_t sum, const PlannedBucket& b) { return sum + b.file_size(); });
}

namespace {

/// structure_signature over `count` descriptors, the i-th being desc(i).
template <class Desc>
std::uint64_t signature_of(std::size_t count, Desc desc) {
  Xxh3Stream hash;
  auto add_shape = [&hash](const Shape& s) {
    std::uint64_t rank = s.rank();
    hash.update(&rank, sizeof(rank));
    hash.update(s.dims().data(), s.rank() * sizeof(std::int64_t));
  };
  for (std::size_t i = 0; i < count; ++i) {
    const ShardedTensorDesc& d = desc(i);
    hash.update(d.name.data(), d.name.size() + 1);
    hash.update(&d.dtype, sizeof(d.dtype));
    add_shape(d.global_shape);
    add_shape(d.global_offset);
    add_shape(d.local_shape);
    hash.update(&d.replica_id, sizeof(d.replica_id));
  }
  return hash.digest();
}

/// plan_save over `count` descriptors, the i-th being desc(i).
template <class Desc>
SavePlan plan_of(int rank, std::size_t count, Desc desc, int bucket_count) {
  SavePlan plan;
  plan.rank = rank;
  plan.signature = signature_of(count, desc);

  // With their keys while the plan is made (they order items of one size and go into the
  // headers); the plan keeps only the headers.
  struct Keyed {
    PlannedItem item;
    std::string key;
  };
  std::vector<Keyed> items;
  for (std::size_t i = 0; i < count; ++i) {
    const ShardedTensorDesc& d = desc(i);
    if (d.replica_id != 0) continue;
    items.push_back({{i, d.nbytes(), 0}, d.chunk_key()});
  }
  std::sort(items.begin(), items.end(), [](const Keyed& a, const Keyed& b) {
    return a.item.nbytes != b.item.nbytes ? a.item.nbytes > b.item.nbytes : a.key < b.key;
  });

  plan.buckets.resize(static_cast<std::size_t>(bucket_count));
  for (int b = 0; b < bucket_count; ++b) {
    plan.buckets[static_cast<std::size_t>(b)].index = b;
    plan.buckets[static_cast<std::size_t>(b)].file_name = CheckpointLayout::bucket_file_name(rank, b);
  }
  std::vector<std::vector<SafetensorsEntry>> entries(plan.buckets.size());
  for (auto& [item, key] : items) {
    auto lightest = std::min_element(
        plan.buckets.begin(), plan.buckets.end(),
        [](const PlannedBucket& a, const PlannedBucket& b) { return a.data_bytes < b.data_bytes; });
    item.data_offset = lightest->data_bytes;
    lightest->data_bytes += item.nbytes;
    const ShardedTensorDesc& d = desc(item.tensor_index);
    entries[static_cast<std::size_t>(lightest - plan.buckets.begin())].push_back(
        {std::move(key), d.dtype, d.local_shape, item.data_offset, item.data_offset + item.nbytes});
    lightest->items.push_back(item);
  }
  items.clear();
  items.shrink_to_fit();
  for (std::size_t b = 0; b < plan.buckets.size(); ++b) {
    plan.buckets[b].header = make_safetensors_header(entries[b]);
    std::vector<SafetensorsEntry>().swap(entries[b]);
  }
  return plan;
}

}  // namespace

std::uint64_t structure_signature(const std::vector<ShardedTensorDesc>& descs) {
  return signature_of(descs.size(), [&](std::size_t i) -> const ShardedTensorDesc& { return descs[i]; });
}

std::uint64_t structure_signature(const StateDict& state) {
  return signature_of(state.tensors.size(), [&](std::size_t i) -> const ShardedTensorDesc& { return state.tensors[i].desc; });
}

std::vector<int> balance_writers(const std::vector<ReplicatedChunk>& chunks, std::vector<std::uint64_t> base_bytes) {
  std::vector<std::size_t> order(chunks.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return chunks[a].bytes != chunks[b].bytes ? chunks[a].bytes > chunks[b].bytes : chunks[a].key < chunks[b].key;
  });
  std::vector<int> writers(chunks.size(), -1);
  for (std::size_t i : order) {
    int best = -1;
    for (int r : chunks[i].holders) {
      const auto ri = static_cast<std::size_t>(r);
      if (best < 0 || base_bytes[ri] < base_bytes[static_cast<std::size_t>(best)]) best = r;
    }
    writers[i] = best;
    if (best >= 0) base_bytes[static_cast<std::size_t>(best)] += chunks[i].bytes;
  }
  return writers;
}

SavePlan plan_save(int rank, const std::vector<ShardedTensorDesc>& descs, int bucket_count) {
  return plan_of(rank, descs.size(), [&](std::size_t i) -> const ShardedTensorDesc& { return descs[i]; }, bucket_count);
}

SavePlan plan_save(int rank, const StateDict& state, int bucket_count) {
  return plan_of(
      rank, state.tensors.size(), [&](std::size_t i) -> const ShardedTensorDesc& { return state.tensors[i].desc; },
      bucket_count);
}

}  // namespace stagehand
