#include "stagehand/checkpoint/metadata/metadata_index.hpp"

#include <algorithm>
#include <mutex>
#include <set>
#include <tuple>

namespace stagehand {

namespace {

/// Whether `chunk` and `block` share an element. @pre both have the block's rank.
bool shares_element(const ChunkMeta& chunk, const ShardedTensorDesc& block) {
  for (std::size_t i = 0; i < block.local_shape.rank(); ++i) {
    const std::int64_t lo = std::max(chunk.offsets[i], block.global_offset[i]);
    const std::int64_t hi =
        std::min(chunk.offsets[i] + chunk.shape[i], block.global_offset[i] + block.local_shape[i]);
    if (lo >= hi) return false;
  }
  return true;
}

/// What identifies one version of a metadata.json without reading all of it.
struct FileIdentity {
  std::string path;
  FileVersion version;
  /// The first bytes, which hold the "checksum" field (the first key): a rewrite within one
  /// tick of the file system's clock with the same size still changes them.
  std::string head;

  friend bool operator==(const FileIdentity&, const FileIdentity&) = default;
};

std::optional<FileIdentity> identify(FileSystem& fs, const std::string& path) {
  auto file = fs.open_file(path);
  if (!file.is_ok()) return std::nullopt;
  auto version = fs.stat_file(path);
  if (!version.is_ok() || !*version) return std::nullopt;
  FileIdentity id{path, **version, std::string(std::min<std::uint64_t>(64, (*file)->size()), '\0')};
  if (!(*file)->read(0, id.head.data(), id.head.size()).is_ok()) return std::nullopt;
  return id;
}

}  // namespace

MetadataIndex::MetadataIndex(CheckpointMetadata metadata) : metadata_(std::move(metadata)) {
  for (const auto& entry : metadata_.tensors) {
    // Not a structured binding: the sort's comparison captures the tensor, and clang before
    // 16 cannot capture one.
    const TensorMeta& tensor = entry.second;
    TensorOrder order;
    const std::size_t rank = tensor.global_shape.rank();
    // Order along the dimension with the most distinct offsets: the one the tensor is split
    // along most finely, where a block meets the fewest chunks.
    std::size_t most = 0;
    for (std::size_t d = 0; d < rank; ++d) {
      std::set<std::int64_t> starts;
      for (const auto& c : tensor.chunks)
        starts.insert(c.offsets[d]);
      if (starts.size() > most) {
        most = starts.size();
        order.dim = d;
      }
    }
    order.by_offset.resize(tensor.chunks.size());
    for (std::uint32_t i = 0; i < order.by_offset.size(); ++i)
      order.by_offset[i] = i;
    if (rank > 0) {
      const std::size_t dim = order.dim;
      std::stable_sort(order.by_offset.begin(), order.by_offset.end(),
                       [&](std::uint32_t a, std::uint32_t b) {
                         return tensor.chunks[a].offsets[dim] < tensor.chunks[b].offsets[dim];
                       });
      for (const auto& c : tensor.chunks)
        order.max_extent = std::max(order.max_extent, c.shape[dim]);
    }
    orders_.emplace(entry.first, std::move(order));
  }
}

std::vector<std::uint32_t> MetadataIndex::overlapping(const TensorMeta& tensor,
                                                      const TensorOrder& order,
                                                      const ShardedTensorDesc& block) const {
  std::vector<std::uint32_t> found;
  const std::size_t rank = tensor.global_shape.rank();
  // A block of another rank fails the loader's shape check before any chunk is looked at.
  if (block.local_shape.rank() != rank || block.global_offset.rank() != rank) return found;
  if (rank == 0) {
    found = order.by_offset;
  } else {
    // A chunk that reaches into [lo, hi) along the dimension starts after lo - max_extent.
    const std::size_t dim = order.dim;
    const std::int64_t lo = block.global_offset[dim];
    const std::int64_t hi = lo + block.local_shape[dim];
    auto offset_of = [&](std::uint32_t i) { return tensor.chunks[i].offsets[dim]; };
    auto first =
        std::upper_bound(order.by_offset.begin(), order.by_offset.end(), lo - order.max_extent,
                         [&](std::int64_t v, std::uint32_t i) { return v < offset_of(i); });
    auto last = std::lower_bound(first, order.by_offset.end(), hi,
                                 [&](std::uint32_t i, std::int64_t v) { return offset_of(i) < v; });
    for (auto it = first; it != last; ++it) {
      if (shares_element(tensor.chunks[*it], block)) found.push_back(*it);
    }
  }
  return found;
}

CheckpointMetadata MetadataIndex::part_for(const StateDict& state) const {
  CheckpointMetadata part;
  part.step = metadata_.step;
  part.trainer_state = metadata_.trainer_state;
  std::map<std::string, std::vector<std::uint32_t>> chosen;
  for (const auto& live : state.tensors) {
    auto tensor = metadata_.tensors.find(live.desc.name);
    if (tensor == metadata_.tensors.end()) continue;
    auto found = overlapping(tensor->second, orders_.at(tensor->first), live.desc);
    auto& indices = chosen[tensor->first];
    indices.insert(indices.end(), found.begin(), found.end());
  }
  for (auto& [name, indices] : chosen) {
    const TensorMeta& saved = metadata_.tensors.at(name);
    std::sort(indices.begin(), indices.end());
    indices.erase(std::unique(indices.begin(), indices.end()), indices.end());
    TensorMeta& t = part.tensors[name];
    t.dtype = saved.dtype;
    t.global_shape = saved.global_shape;
    for (std::uint32_t i : indices) {
      const ChunkMeta& chunk = saved.chunks[i];
      t.chunks.push_back(chunk);
      part.files.try_emplace(chunk.file, metadata_.files.at(chunk.file));
    }
  }
  for (const auto& [name, value] : state.objects) {
    auto object = metadata_.objects.find(name);
    if (object != metadata_.objects.end()) part.objects.insert(*object);
  }
  return part;
}

Result<std::shared_ptr<const MetadataIndex>> shared_metadata_index(
    FileSystem& fs, const std::string& path, const std::function<Result<CheckpointMetadata>()>& read) {
  auto make = [&]() -> Result<std::shared_ptr<const MetadataIndex>> {
    SH_ASSIGN_OR_RETURN(CheckpointMetadata metadata, read());
    return std::shared_ptr<const MetadataIndex>(
        std::make_shared<MetadataIndex>(std::move(metadata)));
  };
  // Held while reading, so that ranks loading the same file at once wait for one read.
  static std::mutex mutex;
  static std::optional<FileIdentity> cached_identity;
  static std::shared_ptr<const MetadataIndex> cached;
  std::lock_guard lock(mutex);
  auto before = identify(fs, path);
  if (before && cached && cached_identity == before) return cached;
  SH_ASSIGN_OR_RETURN(auto index, make());
  // Cached only when the file did not change while it was read.
  if (before && identify(fs, path) == before) {
    cached_identity = before;
    cached = index;
  }
  return index;
}

}  // namespace stagehand
