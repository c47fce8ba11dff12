#include "stagehand/checkpoint/metadata/metadata_validation.hpp"

#include <algorithm>
#include <optional>
#include <vector>

#include "stagehand/checkpoint/format/block_bytes.hpp"
#include "stagehand/checkpoint/format/layout.hpp"
#include "stagehand/core/sharded_tensor.hpp"

namespace stagehand {

namespace {

/// Elements of a shape whose byte size checked_nbytes accepted (unlike Shape::numel, no
/// intermediate product can overflow when a later dimension is 0).
std::uint64_t elements(const Shape& shape) {
  return *checked_nbytes(shape, 1);
}

/// Whether two blocks share an element (a block with an empty dimension shares none).
/// @pre both have the same rank
bool blocks_overlap(const ChunkMeta& a, const ChunkMeta& b) {
  for (std::size_t i = 0; i < a.shape.rank(); ++i) {
    if (std::max(a.offsets[i], b.offsets[i]) >=
        std::min(a.offsets[i] + a.shape[i], b.offsets[i] + b.shape[i])) {
      return false;
    }
  }
  return true;
}


}  // namespace

std::optional<std::string> tiling_error(const TensorMeta& t) {
  std::vector<const ChunkMeta*> chunks;
  for (const auto& c : t.chunks)
    chunks.push_back(&c);
  std::sort(chunks.begin(), chunks.end(),
            [](const ChunkMeta* a, const ChunkMeta* b) { return a->offsets < b->offsets; });
  for (std::size_t i = 1; i < chunks.size(); ++i) {
    // Equal offsets mean equal chunk keys, even for chunks that hold no element.
    if (chunks[i]->offsets == chunks[i - 1]->offsets)
      return "two chunks at " + chunks[i]->offsets.to_string();
  }
  std::erase_if(chunks, [](const ChunkMeta* c) { return elements(c->shape) == 0; });
  const std::size_t rank = t.global_shape.rank();
  if (rank > 0 && chunks.size() > 1) {
    // Sweep along the dimension with the most distinct offsets, comparing only chunks whose
    // ranges along it meet: in a grid of chunks, each meets only its own slab.
    std::size_t sweep = 0;
    std::size_t most = 0;
    for (std::size_t d = 0; d < rank; ++d) {
      std::vector<std::int64_t> starts;
      for (const auto* c : chunks)
        starts.push_back(c->offsets[d]);
      std::sort(starts.begin(), starts.end());
      auto distinct =
          static_cast<std::size_t>(std::unique(starts.begin(), starts.end()) - starts.begin());
      if (distinct > most) {
        most = distinct;
        sweep = d;
      }
    }
    std::sort(chunks.begin(), chunks.end(), [sweep](const ChunkMeta* a, const ChunkMeta* b) {
      return a->offsets[sweep] < b->offsets[sweep];
    });
    for (std::size_t i = 0; i < chunks.size(); ++i) {
      const std::int64_t end = chunks[i]->offsets[sweep] + chunks[i]->shape[sweep];
      for (std::size_t j = i + 1; j < chunks.size() && chunks[j]->offsets[sweep] < end; ++j) {
        if (blocks_overlap(*chunks[i], *chunks[j])) {
          return "chunks at " + chunks[i]->offsets.to_string() + " and " +
                 chunks[j]->offsets.to_string() + " overlap";
        }
      }
    }
  }
  // Disjoint blocks inside the global shape cover all of it exactly when their sizes add up.
  std::uint64_t covered = 0;
  for (const auto* c : chunks)
    covered += elements(c->shape);
  if (covered != elements(t.global_shape)) {
    return "its chunks hold " + std::to_string(covered) + " of its " +
           std::to_string(elements(t.global_shape)) + " elements";
  }
  return std::nullopt;
}

Status validate_metadata(const CheckpointMetadata& m, const std::string& source) {
  auto bad = [&](const std::string& why) {
    return Status{ErrorCode::corruption, "'" + source + "': " + why};
  };
  if (m.step < 0) return bad("step " + std::to_string(m.step) + " is negative");
  for (const auto& [name, f] : m.files) {
    // Files are opened as policy/<name>: a path would reach outside the checkpoint.
    if (!is_plain_file_name(name)) return bad("file '" + name + "' is not a plain file name");
  }
  for (const auto& [name, t] : m.tensors) {
    const std::string tensor = "tensor '" + name + "'";
    if (name.empty() || name.find('@') != std::string::npos) {
      return bad(tensor +
                 ": a tensor name must be non-empty and free of '@' (it starts every chunk key)");
    }
    if (!checked_nbytes(t.global_shape, dtype_size(t.dtype))) {
      return bad(tensor + ": global shape " + t.global_shape.to_string() + " of " +
                 std::string(dtype_name(t.dtype)) + " holds more bytes than an int64 counts");
    }
    const std::size_t rank = t.global_shape.rank();
    for (const auto& c : t.chunks) {
      // Named only in an error: a checkpoint of many ranks has hundreds of thousands of chunks.
      auto chunk_name = [&] { return tensor + " chunk " + c.offsets.to_string(); };
      if (c.offsets.rank() != rank || c.shape.rank() != rank) {
        return bad(chunk_name() + ": offsets " + c.offsets.to_string() + " and shape " +
                   c.shape.to_string() + " do not both have the rank of the global shape " +
                   t.global_shape.to_string());
      }
      for (std::size_t i = 0; i < rank; ++i) {
        if (c.offsets[i] > t.global_shape[i] || c.shape[i] > t.global_shape[i] - c.offsets[i]) {
          return bad(chunk_name() + " of shape " + c.shape.to_string() +
                     " lies outside the global shape " + t.global_shape.to_string());
        }
      }
      // Inside the global shape, so its size fits too.
      const std::uint64_t nbytes = *checked_nbytes(c.shape, dtype_size(t.dtype));
      if (c.end < c.begin || c.end - c.begin != nbytes) {
        return bad(chunk_name() + ": byte_range " + range_string(c.begin, c.end) +
                   " does not hold the " + std::to_string(nbytes) + " bytes of " +
                   std::string(dtype_name(t.dtype)) + " " + c.shape.to_string());
      }
      auto file = m.files.find(c.file);
      if (file == m.files.end())
        return bad(chunk_name() + ": its file '" + c.file + "' is not listed in files");
      if (c.end > file->second.size) {
        return bad(chunk_name() + ": byte_range " + range_string(c.begin, c.end) +
                   " runs past the " + std::to_string(file->second.size) + " bytes of '" + c.file +
                   "'");
      }
    }
    if (auto why = tiling_error(t)) return bad(tensor + ": " + *why);
  }
  return Status::ok();
}

Status check_chunk_in_header(const ParsedSafetensors& header, const std::string& path,
                             const std::string& tensor, DType dtype, const ChunkMeta& chunk) {
  const std::string key = chunk_key(tensor, chunk.offsets);
  auto bad = [&](const std::string& why) {
    return Status{ErrorCode::corruption, "'" + path + "': tensor '" + tensor + "' chunk " +
                                             chunk.offsets.to_string() + ": " + why};
  };
  const SafetensorsEntry* e = header.find(key);
  if (e == nullptr) return bad("the header has no entry '" + key + "'");
  if (e->dtype != dtype) {
    return bad("header entry '" + key + "' has dtype " + std::string(dtype_name(e->dtype)) +
               ", the metadata says " + std::string(dtype_name(dtype)));
  }
  if (!(e->shape == chunk.shape)) {
    return bad("header entry '" + key + "' has shape " + e->shape.to_string() +
               ", the metadata says " + chunk.shape.to_string());
  }
  if (e->begin + header.data_start != chunk.begin || e->end + header.data_start != chunk.end) {
    return bad("header entry '" + key + "' has bytes " +
               range_string(e->begin + header.data_start, e->end + header.data_start) +
               " of the file, the metadata's byte_range is " +
               range_string(chunk.begin, chunk.end));
  }
  return Status::ok();
}

}  // namespace stagehand
