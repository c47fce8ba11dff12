#include "strategy/loader.hpp"

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>

#include "core/host_buffer.hpp"
#include "strategy/commit.hpp"
#include "strategy/storage.hpp"

namespace fs = std::filesystem;

namespace stagehand {

namespace {

/// Copies the overlap of a saved chunk and a live block (both row-major) from `src` to `dst`.
/// @return the number of elements copied.
std::int64_t copy_overlap(const ChunkMeta& chunk, const ShardedTensorDesc& block, std::size_t elem,
                          const std::uint8_t* src, std::uint8_t* dst) {
  const std::size_t rank = block.local_shape.rank();
  if (rank == 0) {
    std::copy_n(src, elem, dst);
    return 1;
  }
  Shape lo = Shape::zeros(rank);
  Shape hi = Shape::zeros(rank);
  for (std::size_t i = 0; i < rank; ++i) {
    lo[i] = std::max(chunk.offsets[i], block.global_offset[i]);
    hi[i] = std::min(chunk.offsets[i] + chunk.shape[i], block.global_offset[i] + block.local_shape[i]);
    if (lo[i] >= hi[i]) return 0;
  }
  Shape src_stride = Shape::zeros(rank);
  Shape dst_stride = Shape::zeros(rank);
  src_stride[rank - 1] = 1;
  dst_stride[rank - 1] = 1;
  for (std::size_t i = rank - 1; i > 0; --i) {
    src_stride[i - 1] = src_stride[i] * chunk.shape[i];
    dst_stride[i - 1] = dst_stride[i] * block.local_shape[i];
  }
  const std::size_t row = static_cast<std::size_t>(hi[rank - 1] - lo[rank - 1]) * elem;
  std::int64_t copied = 0;
  Shape idx = lo;
  for (;;) {
    std::int64_t s = 0;
    std::int64_t d = 0;
    for (std::size_t i = 0; i < rank; ++i) {
      s += (idx[i] - chunk.offsets[i]) * src_stride[i];
      d += (idx[i] - block.global_offset[i]) * dst_stride[i];
    }
    std::copy_n(src + static_cast<std::size_t>(s) * elem, row, dst + static_cast<std::size_t>(d) * elem);
    copied += hi[rank - 1] - lo[rank - 1];
    // Advance the outer index (every dimension but the last), odometer style.
    std::size_t i = rank - 1;
    for (;;) {
      if (i == 0) return copied;
      --i;
      if (++idx[i] < hi[i]) break;
      idx[i] = lo[i];
    }
  }
}

bool overlaps(const ChunkMeta& chunk, const ShardedTensorDesc& block) {
  for (std::size_t i = 0; i < block.local_shape.rank(); ++i) {
    if (std::max(chunk.offsets[i], block.global_offset[i]) >=
        std::min(chunk.offsets[i] + chunk.shape[i], block.global_offset[i] + block.local_shape[i])) {
      return false;
    }
  }
  return true;
}

/// Opens each data file once, checking its size against the metadata.
class FileCache {
 public:
  FileCache(std::string dir, const CheckpointMetadata& m) : dir_(std::move(dir)), metadata_(m) {}

  Result<const ReadOnlyFile*> get(const std::string& name) {
    auto it = open_.find(name);
    if (it != open_.end()) return &it->second;
    auto meta = metadata_.files.find(name);
    std::string path = dir_ + "/" + name;
    if (meta == metadata_.files.end()) {
      return Status{ErrorCode::corruption, "'" + path + "' is not listed in the metadata"};
    }
    SH_ASSIGN_OR_RETURN(ReadOnlyFile file, ReadOnlyFile::open(path));
    SH_ASSIGN_OR_RETURN(std::uint64_t size, file_size(path));
    if (size != meta->second.size) {
      return Status{ErrorCode::corruption, "'" + path + "' has " + std::to_string(size) +
                                               " bytes, the metadata says " +
                                               std::to_string(meta->second.size) + " (truncated?)"};
    }
    return &open_.emplace(name, std::move(file)).first->second;
  }

 private:
  std::string dir_;
  const CheckpointMetadata& metadata_;
  std::map<std::string, ReadOnlyFile> open_;
};

}  // namespace

Result<std::string> resolve_checkpoint(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    return Status{ErrorCode::not_found, "checkpoint path '" + path + "' is not a folder"};
  }
  std::string name = fs::path(path).lexically_normal().filename().string();
  if (name.empty()) name = fs::path(path).lexically_normal().parent_path().filename().string();
  if (name.size() > 4 && name.substr(name.size() - 4) == ".tmp") {
    return Status{ErrorCode::invalid_argument,
                  "'" + path + "' is an uncommitted checkpoint being written (.tmp)"};
  }
  if (fs::exists(CheckpointLayout::policy_dir(path) + "/" + kMetadataFile, ec)) return path;
  SH_ASSIGN_OR_RETURN(auto step, read_tracker(path));
  if (!step) {
    return Status{ErrorCode::not_found, "'" + path + "' holds neither a committed checkpoint nor a " +
                                            kTrackerFile};
  }
  std::string dir = CheckpointLayout{path}.step_dir(*step);
  if (!fs::exists(CheckpointLayout::policy_dir(dir) + "/" + kMetadataFile, ec)) {
    return Status{ErrorCode::corruption, "the tracker in '" + path + "' names step " +
                                             std::to_string(*step) + ", but '" + dir +
                                             "' is not a committed checkpoint"};
  }
  return dir;
}

Result<CheckpointMetadata> read_checkpoint_metadata(const std::string& checkpoint_dir) {
  std::string path = CheckpointLayout::policy_dir(checkpoint_dir) + "/" + kMetadataFile;
  SH_ASSIGN_OR_RETURN(std::string text, read_small_file(path));
  return metadata_from_json(text, path);
}

Status load_checkpoint(const std::string& checkpoint_dir, StateDict& state) {
  SH_ASSIGN_OR_RETURN(CheckpointMetadata metadata, read_checkpoint_metadata(checkpoint_dir));
  SH_RETURN_IF_ERROR(state.validate());
  const std::string policy = CheckpointLayout::policy_dir(checkpoint_dir);
  FileCache files(policy, metadata);
  std::vector<HostBuffer> staged;
  std::vector<std::uint8_t> chunk_bytes;
  for (const auto& live : state.tensors) {
    const ShardedTensorDesc& block = live.desc;
    auto fail = [&](const std::string& why) {
      return Status{ErrorCode::invalid_argument,
                    "tensor '" + block.name + "' in '" + checkpoint_dir + "': " + why};
    };
    auto found = metadata.tensors.find(block.name);
    if (found == metadata.tensors.end()) return fail("not in the checkpoint");
    const TensorMeta& saved = found->second;
    if (saved.dtype != block.dtype) {
      return fail("saved as " + std::string(dtype_name(saved.dtype)) + ", live as " +
                  std::string(dtype_name(block.dtype)));
    }
    if (!(saved.global_shape == block.global_shape)) {
      return fail("saved with global shape " + saved.global_shape.to_string() + ", live " +
                  block.global_shape.to_string());
    }
    HostBuffer buffer(block.nbytes(), false, nullptr);
    if (block.nbytes() > 0 && !buffer.valid()) {
      return Status{ErrorCode::no_space, "cannot allocate " + std::to_string(block.nbytes()) +
                                             " bytes to load '" + block.name + "'"};
    }
    const std::size_t elem = dtype_size(block.dtype);
    std::int64_t covered = 0;
    for (const auto& chunk : saved.chunks) {
      if (chunk.offsets.rank() != block.local_shape.rank()) return fail("chunk rank mismatch");
      if (block.local_shape.numel() == 0 || !overlaps(chunk, block)) continue;
      auto where = "chunk " + chunk.offsets.to_string() + " of tensor '" + block.name + "' in '" +
                   policy + "/" + chunk.file + "'";
      auto file = files.get(chunk.file);
      if (!file.is_ok()) return file.status().with_context("loading tensor '" + block.name + "'");
      chunk_bytes.resize(chunk.end - chunk.begin);
      SH_RETURN_IF_ERROR(pread_exact((*file)->fd(), chunk.begin, chunk_bytes.data(), chunk_bytes.size(),
                                     (*file)->path())
                             .with_context("loading tensor '" + block.name + "'"));
      if (xxh3(chunk_bytes.data(), chunk_bytes.size()) != chunk.xxh3) {
        return Status{ErrorCode::corruption, where + ": checksum mismatch (XXH3 " +
                                                 xxh3_hex(xxh3(chunk_bytes.data(), chunk_bytes.size())) +
                                                 ", expected " + xxh3_hex(chunk.xxh3) + ")"};
      }
      covered += copy_overlap(chunk, block, elem, chunk_bytes.data(), buffer.data());
    }
    if (covered != block.local_shape.numel()) {
      return fail("the checkpoint covers " + std::to_string(covered) + " of the " +
                  std::to_string(block.local_shape.numel()) + " elements of the block at " +
                  block.global_offset.to_string());
    }
    staged.push_back(std::move(buffer));
  }
  for (const auto& [name, value] : state.objects) {
    if (metadata.objects.count(name) == 0) {
      return Status{ErrorCode::invalid_argument, "object '" + name + "' is not in '" + checkpoint_dir + "'"};
    }
  }
  // Everything is read and verified: only now touch the live state.
  for (std::size_t i = 0; i < state.tensors.size(); ++i) {
    SH_RETURN_IF_ERROR(state.tensors[i].tensor.copy_from_host(staged[i].data()));
  }
  for (auto& [name, value] : state.objects) value = metadata.objects.at(name);
  return Status::ok();
}

Result<VerifyResult> verify_checkpoint(const std::string& checkpoint_dir) {
  SH_ASSIGN_OR_RETURN(CheckpointMetadata metadata, read_checkpoint_metadata(checkpoint_dir));
  const std::string policy = CheckpointLayout::policy_dir(checkpoint_dir);
  VerifyResult result;
  std::map<std::string, std::vector<std::pair<std::string, const ChunkMeta*>>> chunks_by_file;
  for (const auto& [name, tensor] : metadata.tensors) {
    for (const auto& chunk : tensor.chunks) chunks_by_file[chunk.file].emplace_back(name, &chunk);
  }
  std::vector<std::uint8_t> buffer(8u << 20);
  for (const auto& [name, meta] : metadata.files) {
    std::string path = policy + "/" + name;
    ++result.files_checked;
    auto file = ReadOnlyFile::open(path);
    if (!file.is_ok()) {
      result.problems.push_back(file.status().message());
      continue;
    }
    auto size = file_size(path);
    if (!size.is_ok() || *size != meta.size) {
      result.problems.push_back("'" + path + "' has " + (size.is_ok() ? std::to_string(*size) : "?") +
                                " bytes, the metadata says " + std::to_string(meta.size));
      continue;
    }
    auto parsed = parse_safetensors_header(path);
    if (!parsed.is_ok()) {
      result.problems.push_back(parsed.status().message());
      continue;
    }
    std::map<std::string, const SafetensorsEntry*> entries;
    for (const auto& e : parsed->entries) entries[e.key] = &e;
    // Chunks whose header entry agrees with the metadata get their checksum checked below.
    std::vector<std::pair<std::string, const ChunkMeta*>> checked;
    for (const auto& [tensor, chunk] : chunks_by_file[name]) {
      ++result.chunks_checked;
      std::string key = chunk_key(tensor, chunk->offsets);
      auto entry = entries.find(key);
      if (entry == entries.end() || entry->second->begin + parsed->data_start != chunk->begin ||
          entry->second->end + parsed->data_start != chunk->end) {
        result.problems.push_back("'" + path + "': header entry for '" + key +
                                  "' is missing or disagrees with the metadata");
        continue;
      }
      checked.emplace_back(tensor, chunk);
    }
    // One sequential pass feeds the file's checksum and every chunk's.
    Xxh3Stream file_hash;
    std::vector<std::unique_ptr<Xxh3Stream>> chunk_hashes;
    for (std::size_t i = 0; i < checked.size(); ++i) chunk_hashes.push_back(std::make_unique<Xxh3Stream>());
    Status read_status;
    for (std::uint64_t done = 0; done < meta.size && read_status.is_ok();) {
      std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(buffer.size(), meta.size - done));
      read_status = pread_exact(file->fd(), done, buffer.data(), n, path);
      file_hash.update(buffer.data(), n);
      for (std::size_t i = 0; i < checked.size(); ++i) {
        std::uint64_t lo = std::max(done, checked[i].second->begin);
        std::uint64_t hi = std::min(done + n, checked[i].second->end);
        if (lo < hi) chunk_hashes[i]->update(buffer.data() + (lo - done), hi - lo);
      }
      done += n;
    }
    if (!read_status.is_ok()) {
      result.problems.push_back(read_status.message());
      continue;
    }
    result.bytes_checked += meta.size;
    if (file_hash.digest() != meta.xxh3) {
      result.problems.push_back("'" + path + "': file checksum mismatch (XXH3 " + xxh3_hex(file_hash.digest()) +
                                ", expected " + xxh3_hex(meta.xxh3) + ")");
    }
    for (std::size_t i = 0; i < checked.size(); ++i) {
      if (chunk_hashes[i]->digest() != checked[i].second->xxh3) {
        result.problems.push_back("'" + path + "': tensor '" + checked[i].first + "' chunk " +
                                  checked[i].second->offsets.to_string() + " checksum mismatch");
      }
    }
  }
  for (const auto& [file, chunks] : chunks_by_file) {
    if (metadata.files.count(file) == 0) {
      result.problems.push_back("chunks of '" + chunks.front().first + "' point at '" + file +
                                "', which the metadata does not list");
    }
  }
  return result;
}

}  // namespace stagehand
