#include "stagehand/checkpoint/load/verify.hpp"

#include <algorithm>
#include <map>
#include <memory>

#include "stagehand/checkpoint/load/checkpoint_reader.hpp"
#include "stagehand/storage/default_file_system.hpp"

namespace stagehand {

Result<VerifyResult> verify_checkpoint(FileSystem& fs, const std::string& checkpoint_dir,
                                       const ProgressFn& progress) {
  VerifyResult result;
  auto metadata = read_checkpoint_metadata(fs, checkpoint_dir);
  if (!metadata.is_ok()) {
    // Metadata that the loader would refuse is a finding about the checkpoint; a failure to read
    // it is not.
    if (metadata.status().code() != ErrorCode::corruption) return metadata.status();
    result.problems.push_back(metadata.status().message());
    return result;
  }
  // A checkpoint saved without a trainer state (not by a trainer) has none to check.
  if (auto state = read_trainer_state_text(fs, checkpoint_dir, *metadata); !state.is_ok()) {
    if (state.status().code() == ErrorCode::corruption) {
      result.problems.push_back(state.status().message());
    } else if (state.status().code() != ErrorCode::not_found) {
      return state.status();
    }
  } else {
    ++result.files_checked;
    result.bytes_checked += state->size();
  }
  std::map<std::string, std::vector<std::pair<std::string, const ChunkMeta*>>> chunks_by_file;
  for (const auto& [name, tensor] : metadata->tensors) {
    for (const auto& chunk : tensor.chunks)
      chunks_by_file[chunk.file].emplace_back(name, &chunk);
  }
  std::vector<std::uint8_t> buffer(8u << 20);
  std::uint64_t total = 0;
  for (const auto& entry : metadata->files) total += entry.second.size;
  ProgressCounter counter(progress, "verify", total);
  // A file passed over (missing, short, its header unreadable) counts as done where it stops.
  std::uint64_t counted = 0;
  auto count_to = [&](std::uint64_t end) {
    if (end > counted) counter.add(end - counted);
    counted = end;
  };
  std::uint64_t file_start = 0;
  for (const auto& [name, meta] : metadata->files) {
    count_to(file_start);
    file_start += meta.size;
    const std::string path = CheckpointLayout::policy_dir(checkpoint_dir) + "/" + name;
    ++result.files_checked;
    auto file = fs.open_file(path);
    if (!file.is_ok()) {
      result.problems.push_back(file.status().message());
      continue;
    }
    if ((*file)->size() != meta.size) {
      result.problems.push_back("'" + path + "' has " + std::to_string((*file)->size()) +
                                " bytes, the metadata says " + std::to_string(meta.size));
      continue;
    }
    ReadableFile& reader = **file;
    auto parsed = read_safetensors_header(reader, path);
    if (!parsed.is_ok()) {
      result.problems.push_back(parsed.status().message());
      continue;
    }
    // Chunks whose header entry agrees with the metadata (as the loader checks) get their
    // checksum checked below.
    std::vector<std::pair<std::string, const ChunkMeta*>> checked;
    for (const auto& [tensor, chunk] : chunks_by_file[name]) {
      ++result.chunks_checked;
      Status entry =
          check_chunk_in_header(*parsed, path, tensor, metadata->tensors.at(tensor).dtype, *chunk);
      if (!entry.is_ok()) {
        result.problems.push_back(entry.message());
        continue;
      }
      checked.emplace_back(tensor, chunk);
    }
    // One sequential pass feeds the file's checksum and every chunk's.
    Xxh3Stream file_hash;
    std::vector<std::unique_ptr<Xxh3Stream>> chunk_hashes;
    for (std::size_t i = 0; i < checked.size(); ++i)
      chunk_hashes.push_back(std::make_unique<Xxh3Stream>());
    Status read_status;
    for (std::uint64_t done = 0; done < meta.size && read_status.is_ok();) {
      std::size_t n =
          static_cast<std::size_t>(std::min<std::uint64_t>(buffer.size(), meta.size - done));
      read_status = reader.read(done, buffer.data(), n);
      count_to(file_start - meta.size + done + n);
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
      result.problems.push_back("'" + path + "': file checksum mismatch (XXH3 " +
                                xxh3_hex(file_hash.digest()) + ", expected " + xxh3_hex(meta.xxh3) +
                                ")");
    }
    for (std::size_t i = 0; i < checked.size(); ++i) {
      if (chunk_hashes[i]->digest() != checked[i].second->xxh3) {
        result.problems.push_back("'" + path + "': tensor '" + checked[i].first + "' chunk " +
                                  checked[i].second->offsets.to_string() + " checksum mismatch");
      }
    }
  }
  count_to(total);
  return result;
}

Result<VerifyResult> verify_checkpoint(const std::string& checkpoint_dir,
                                       const ObjectStoreOptions& store) {
  return verify_checkpoint(*default_file_system(store), checkpoint_dir);
}

}  // namespace stagehand
