#include "stagehand/checkpoint/loader.hpp"

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "stagehand/checkpoint/cloud_checkpoint.hpp"
#include "stagehand/checkpoint/commit.hpp"
#include "stagehand/core/host_buffer.hpp"
#include "stagehand/storage/destination.hpp"
#include "stagehand/storage/local_files.hpp"

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

/// One data file of a checkpoint, local or an object: its size and positional reads.
class SourceFile {
 public:
  virtual ~SourceFile() = default;
  virtual std::uint64_t size() const = 0;
  /// Reads exactly `bytes` at `offset`.
  virtual Status read(std::uint64_t offset, void* dst, std::size_t bytes) = 0;
};

/// A checkpoint folder: `global_step_N/` on a local file system or under an object-store prefix.
class CheckpointSource {
 public:
  virtual ~CheckpointSource() = default;
  /// The full path or URL of `rel`, for messages.
  virtual std::string where(const std::string& rel) const = 0;
  /// A small file's content; nullopt when it does not exist.
  virtual Result<std::optional<std::string>> read_text(const std::string& rel) const = 0;
  /// Opens a data file; not_found when it does not exist.
  virtual Result<std::unique_ptr<SourceFile>> open(const std::string& rel) const = 0;
};

class LocalFile final : public SourceFile {
 public:
  LocalFile(ReadOnlyFile file, std::uint64_t size) : file_(std::move(file)), size_(size) {}
  std::uint64_t size() const override { return size_; }
  Status read(std::uint64_t offset, void* dst, std::size_t bytes) override {
    return pread_exact(file_.fd(), offset, dst, bytes, file_.path());
  }

 private:
  ReadOnlyFile file_;
  std::uint64_t size_;
};

class LocalSource final : public CheckpointSource {
 public:
  explicit LocalSource(std::string dir) : dir_(std::move(dir)) {}
  std::string where(const std::string& rel) const override { return dir_ + "/" + rel; }
  Result<std::optional<std::string>> read_text(const std::string& rel) const override {
    std::error_code ec;
    if (!fs::exists(where(rel), ec)) return std::optional<std::string>{};
    SH_ASSIGN_OR_RETURN(std::string text, read_small_file(where(rel)));
    return std::optional<std::string>{std::move(text)};
  }
  Result<std::unique_ptr<SourceFile>> open(const std::string& rel) const override {
    SH_ASSIGN_OR_RETURN(ReadOnlyFile file, ReadOnlyFile::open(where(rel)));
    SH_ASSIGN_OR_RETURN(std::uint64_t size, file_size(where(rel)));
    return std::unique_ptr<SourceFile>(std::make_unique<LocalFile>(std::move(file), size));
  }

 private:
  std::string dir_;
};

class ObjectFile final : public SourceFile {
 public:
  ObjectFile(std::shared_ptr<Bucket> bucket, std::string key, std::uint64_t size)
      : bucket_(std::move(bucket)), key_(std::move(key)), size_(size) {}
  std::uint64_t size() const override { return size_; }
  Status read(std::uint64_t offset, void* dst, std::size_t bytes) override {
    if (offset + bytes > size_) {
      return Status{ErrorCode::corruption, "'" + bucket_->url(key_) + "' has " + std::to_string(size_) +
                                               " bytes, a read of " + std::to_string(bytes) + " at " +
                                               std::to_string(offset) + " runs past it"};
    }
    return bucket_->get_range(key_, offset, bytes, dst);
  }

 private:
  std::shared_ptr<Bucket> bucket_;
  std::string key_;
  std::uint64_t size_;
};

class ObjectSource final : public CheckpointSource {
 public:
  ObjectSource(std::shared_ptr<Bucket> bucket, std::string key) : bucket_(std::move(bucket)), key_(std::move(key)) {}
  std::string where(const std::string& rel) const override { return bucket_->url(key(rel)); }
  Result<std::optional<std::string>> read_text(const std::string& rel) const override { return bucket_->get(key(rel)); }
  Result<std::unique_ptr<SourceFile>> open(const std::string& rel) const override {
    SH_ASSIGN_OR_RETURN(auto size, bucket_->size_of(key(rel)));
    if (!size) return Status{ErrorCode::not_found, "'" + where(rel) + "' does not exist"};
    return std::unique_ptr<SourceFile>(std::make_unique<ObjectFile>(bucket_, key(rel), *size));
  }

 private:
  std::string key(const std::string& rel) const { return key_.empty() ? rel : key_ + "/" + rel; }
  std::shared_ptr<Bucket> bucket_;
  std::string key_;
};

Result<std::unique_ptr<CheckpointSource>> open_source(const std::string& dir, const ObjectStoreOptions& store) {
  if (!is_cloud(dir)) return std::unique_ptr<CheckpointSource>(std::make_unique<LocalSource>(dir));
  SH_ASSIGN_OR_RETURN(ObjectUrl url, ObjectUrl::parse(dir));
  SH_ASSIGN_OR_RETURN(auto bucket, Bucket::open(url.kind, url.bucket, store));
  return std::unique_ptr<CheckpointSource>(std::make_unique<ObjectSource>(std::move(bucket), url.key));
}

const std::string kMetadataRel = std::string(kPolicyDir) + "/" + kMetadataFile;

/// The step in the name of a checkpoint folder (`.../global_step_N`, `/` at the end allowed);
/// nullopt for a folder named otherwise (a copy a user renamed).
std::optional<std::int64_t> folder_step(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return parse_step_dir_name(dir.substr(dir.find_last_of('/') + 1), false);
}

/// Reads and checks metadata.json, and that the folder's name (which the tracker names) holds its step.
Result<CheckpointMetadata> read_metadata(const CheckpointSource& source, const std::string& dir) {
  SH_ASSIGN_OR_RETURN(auto text, source.read_text(kMetadataRel));
  const std::string where = source.where(kMetadataRel);
  if (!text) return Status{ErrorCode::not_found, "'" + where + "' does not exist"};
  SH_ASSIGN_OR_RETURN(CheckpointMetadata m, metadata_from_json(*text, where));
  if (auto step = folder_step(dir); step && *step != m.step) {
    return Status{ErrorCode::corruption, "'" + where + "' holds step " + std::to_string(m.step) +
                                             ", but its folder is named for step " + std::to_string(*step)};
  }
  return m;
}

/// Reads trainer_state.json and proves it is the one committed with `m`: recorded in the
/// metadata with its size and XXH3, and holding the metadata's step.
Result<std::string> read_trainer_state(const CheckpointSource& source, const CheckpointMetadata& m) {
  const std::string where = source.where(kTrainerStateFile);
  SH_ASSIGN_OR_RETURN(auto text, source.read_text(kTrainerStateFile));
  if (!m.trainer_state) {
    return Status{text ? ErrorCode::corruption : ErrorCode::not_found,
                  "'" + where + "' " + (text ? "is not" : "does not exist and is not") + " recorded in '" +
                      source.where(kMetadataRel) + "'"};
  }
  if (!text) return Status{ErrorCode::corruption, "'" + where + "' does not exist, but the metadata records it"};
  const FileMeta& expected = *m.trainer_state;
  const std::uint64_t hash = xxh3(text->data(), text->size());
  if (text->size() != expected.size || hash != expected.xxh3) {
    return Status{ErrorCode::corruption,
                  "'" + where + "' was changed after it was saved: " + std::to_string(text->size()) + " bytes with XXH3 " +
                      xxh3_hex(hash) + ", the metadata records " +
                      std::to_string(expected.size) + " bytes with XXH3 " + xxh3_hex(expected.xxh3)};
  }
  // The step is the one field every trainer state has; the trainer reads the rest.
  auto j = nlohmann::json::parse(*text, nullptr, false);
  auto step = j.is_object() ? j.find("step") : j.end();
  if (step == j.end() || !step->is_number_integer() || step->get<std::int64_t>() != m.step) {
    return Status{ErrorCode::corruption, "'" + where + "': field 'step' is " +
                                             (step == j.end() ? std::string("missing") : step->dump()) +
                                             ", not the checkpoint's step " + std::to_string(m.step)};
  }
  return std::move(*text);
}

/// A data file opened for loading, with its parsed header.
struct DataFile {
  std::unique_ptr<SourceFile> file;
  std::string path;
  ParsedSafetensors header;
};

/// Opens each data file once, checking its size against the metadata and parsing its header.
class FileCache {
 public:
  FileCache(const CheckpointSource& source, const CheckpointMetadata& m) : source_(source), metadata_(m) {}

  /// @pre `name` is listed in the metadata's files (validate_metadata proves it of every chunk's).
  Result<const DataFile*> get(const std::string& name) {
    auto it = open_.find(name);
    if (it != open_.end()) return &it->second;
    const std::uint64_t expected = metadata_.files.at(name).size;
    std::string rel = std::string(kPolicyDir) + "/" + name;
    DataFile data{nullptr, source_.where(rel), {}};
    SH_ASSIGN_OR_RETURN(data.file, source_.open(rel));
    if (data.file->size() != expected) {
      return Status{ErrorCode::corruption,
                    "'" + data.path + "' has " + std::to_string(data.file->size()) +
                        " bytes, the metadata says " + std::to_string(expected) + " (truncated?)"};
    }
    SourceFile& reader = *data.file;
    SH_ASSIGN_OR_RETURN(data.header,
                        parse_safetensors_header(
                            [&reader](std::uint64_t offset, void* dst, std::size_t bytes) {
                              return reader.read(offset, dst, bytes);
                            },
                            expected, data.path));
    return &open_.emplace(name, std::move(data)).first->second;
  }

 private:
  const CheckpointSource& source_;
  const CheckpointMetadata& metadata_;
  std::map<std::string, DataFile> open_;
};

}  // namespace

Result<std::string> resolve_checkpoint(const std::string& path, const ObjectStoreOptions& store) {
  if (is_cloud(path)) {
    SH_ASSIGN_OR_RETURN(ObjectUrl url, ObjectUrl::parse(path));
    SH_ASSIGN_OR_RETURN(auto root, CloudCheckpoints::open(url.str(), store));
    SH_ASSIGN_OR_RETURN(auto metadata, root.bucket().size_of(url.key_of(kMetadataRel)));
    if (metadata) return url.str();
    SH_ASSIGN_OR_RETURN(auto step, root.read_tracker());
    if (!step) {
      return Status{ErrorCode::not_found, "'" + url.str() + "' holds neither a committed checkpoint nor a " +
                                              kTrackerFile};
    }
    SH_ASSIGN_OR_RETURN(bool committed, root.is_committed(*step));
    if (!committed) {
      return Status{ErrorCode::corruption, "the tracker in '" + url.str() + "' names step " + std::to_string(*step) +
                                               ", but '" + root.step_url(*step) + "' has no metadata"};
    }
    return root.step_url(*step);
  }
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

Result<CheckpointMetadata> read_checkpoint_metadata(const std::string& checkpoint_dir, const ObjectStoreOptions& store) {
  SH_ASSIGN_OR_RETURN(auto source, open_source(checkpoint_dir, store));
  return read_metadata(*source, checkpoint_dir);
}

Result<std::string> read_trainer_state_text(const std::string& checkpoint_dir, const ObjectStoreOptions& store) {
  SH_ASSIGN_OR_RETURN(auto source, open_source(checkpoint_dir, store));
  SH_ASSIGN_OR_RETURN(CheckpointMetadata metadata, read_metadata(*source, checkpoint_dir));
  return read_trainer_state(*source, metadata);
}

Status load_checkpoint(const std::string& checkpoint_dir, StateDict& state, const ObjectStoreOptions& store) {
  SH_ASSIGN_OR_RETURN(auto source, open_source(checkpoint_dir, store));
  SH_ASSIGN_OR_RETURN(CheckpointMetadata metadata, read_metadata(*source, checkpoint_dir));
  SH_RETURN_IF_ERROR(state.validate());
  FileCache files(*source, metadata);
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
    // validate_metadata proved that the saved chunks tile the global shape, so their overlaps
    // with this block are disjoint and counting their elements proves that they fill it: no byte
    // of the buffer reaches the live state unwritten.
    std::int64_t covered = 0;
    for (const auto& chunk : saved.chunks) {
      if (block.local_shape.numel() == 0 || !overlaps(chunk, block)) continue;
      const std::string context = "loading tensor '" + block.name + "'";
      auto file = files.get(chunk.file);
      if (!file.is_ok()) return file.status().with_context(context);
      const DataFile& data = **file;
      SH_RETURN_IF_ERROR(
          check_chunk_in_header(data.header, data.path, block.name, saved.dtype, chunk));
      // At most the file's size: validate_metadata keeps every byte range inside it.
      chunk_bytes.resize(chunk.end - chunk.begin);
      SH_RETURN_IF_ERROR(data.file->read(chunk.begin, chunk_bytes.data(), chunk_bytes.size())
                             .with_context(context));
      const std::uint64_t hash = xxh3(chunk_bytes.data(), chunk_bytes.size());
      if (hash != chunk.xxh3) {
        return Status{ErrorCode::corruption, "'" + data.path + "': tensor '" + block.name +
                                                 "' chunk " + chunk.offsets.to_string() +
                                                 ": checksum mismatch (XXH3 " + xxh3_hex(hash) +
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

Result<VerifyResult> verify_checkpoint(const std::string& checkpoint_dir, const ObjectStoreOptions& store) {
  SH_ASSIGN_OR_RETURN(auto source, open_source(checkpoint_dir, store));
  VerifyResult result;
  auto metadata = read_metadata(*source, checkpoint_dir);
  if (!metadata.is_ok()) {
    // Metadata that the loader would refuse is a finding about the checkpoint; a failure to read
    // it is not.
    if (metadata.status().code() != ErrorCode::corruption) return metadata.status();
    result.problems.push_back(metadata.status().message());
    return result;
  }
  // A checkpoint saved without a trainer state (not by a trainer) has none to check.
  if (auto state = read_trainer_state(*source, *metadata); !state.is_ok()) {
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
    for (const auto& chunk : tensor.chunks) chunks_by_file[chunk.file].emplace_back(name, &chunk);
  }
  std::vector<std::uint8_t> buffer(8u << 20);
  for (const auto& [name, meta] : metadata->files) {
    std::string rel = std::string(kPolicyDir) + "/" + name;
    std::string path = source->where(rel);
    ++result.files_checked;
    auto file = source->open(rel);
    if (!file.is_ok()) {
      result.problems.push_back(file.status().message());
      continue;
    }
    if ((*file)->size() != meta.size) {
      result.problems.push_back("'" + path + "' has " + std::to_string((*file)->size()) +
                                " bytes, the metadata says " + std::to_string(meta.size));
      continue;
    }
    SourceFile& reader = **file;
    auto parsed = parse_safetensors_header(
        [&reader](std::uint64_t offset, void* dst, std::size_t bytes) { return reader.read(offset, dst, bytes); },
        meta.size, path);
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
    for (std::size_t i = 0; i < checked.size(); ++i) chunk_hashes.push_back(std::make_unique<Xxh3Stream>());
    Status read_status;
    for (std::uint64_t done = 0; done < meta.size && read_status.is_ok();) {
      std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(buffer.size(), meta.size - done));
      read_status = reader.read(done, buffer.data(), n);
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
  return result;
}

}  // namespace stagehand
