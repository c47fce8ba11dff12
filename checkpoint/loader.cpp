#include "stagehand/checkpoint/loader.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <mutex>
#include <optional>
#include <set>
#include <system_error>
#include <thread>
#include <tuple>

#include "stagehand/checkpoint/cloud_checkpoint.hpp"
#include "stagehand/checkpoint/commit.hpp"
#include "stagehand/checkpoint/metadata_index.hpp"
#include "stagehand/core/device.hpp"
#include "stagehand/core/host_buffer.hpp"
#include "stagehand/storage/destination.hpp"
#include "stagehand/storage/local_files.hpp"

namespace fs = std::filesystem;

namespace stagehand {

namespace {

/// The row-major strides, in elements, of `shape`.
Shape row_major_strides(const Shape& shape) {
  const std::size_t rank = shape.rank();
  Shape stride = Shape::zeros(rank);
  if (rank == 0) return stride;
  stride[rank - 1] = 1;
  for (std::size_t i = rank - 1; i > 0; --i) stride[i - 1] = stride[i] * shape[i];
  return stride;
}

/// Elements of `block` that `chunk` holds; 0 when they do not overlap.
std::int64_t overlap_numel(const ChunkMeta& chunk, const ShardedTensorDesc& block) {
  std::int64_t n = 1;
  for (std::size_t i = 0; i < block.local_shape.rank(); ++i) {
    const std::int64_t lo = std::max(chunk.offsets[i], block.global_offset[i]);
    const std::int64_t hi =
        std::min(chunk.offsets[i] + chunk.shape[i], block.global_offset[i] + block.local_shape[i]);
    if (lo >= hi) return 0;
    n *= hi - lo;
  }
  return n;
}

/// Where `chunk` lands in `block`'s memory, in elements, when all of it fills one contiguous
/// run there: it lies inside the block, and before the last dimension in which it is narrower
/// than the block it is one element wide (the same shape, or a run of whole rows).
std::optional<std::int64_t> contiguous_offset(const ChunkMeta& chunk, const ShardedTensorDesc& block) {
  const std::size_t rank = block.local_shape.rank();
  std::size_t narrower = 0;  // one past the last dimension where the chunk is narrower
  for (std::size_t i = 0; i < rank; ++i) {
    if (chunk.offsets[i] < block.global_offset[i] ||
        chunk.offsets[i] + chunk.shape[i] > block.global_offset[i] + block.local_shape[i]) {
      return std::nullopt;
    }
    if (chunk.shape[i] != block.local_shape[i]) narrower = i + 1;
  }
  for (std::size_t i = 0; i + 1 < narrower; ++i) {
    if (chunk.shape[i] != 1) return std::nullopt;
  }
  const Shape stride = row_major_strides(block.local_shape);
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < rank; ++i) offset += (chunk.offsets[i] - block.global_offset[i]) * stride[i];
  return offset;
}

/// Copies the elements of the overlap of a saved chunk and a live block (both row-major) whose
/// index in the chunk lies in [first, last): `src` holds the chunk's elements from `first` on,
/// `dst` is the block's memory on `device`.
/// @return false when a copy to the device failed.
bool copy_overlap_part(const ChunkMeta& chunk, const ShardedTensorDesc& block, std::size_t elem,
                       std::int64_t first, std::int64_t last, const std::uint8_t* src, std::uint8_t* dst,
                       Device device) {
  auto copy = [&](std::int64_t from, std::int64_t to, std::int64_t dst_elem) {
    return copy_from_host(device, src + static_cast<std::size_t>(from - first) * elem,
                          dst + static_cast<std::size_t>(dst_elem) * elem, static_cast<std::size_t>(to - from) * elem);
  };
  if (auto offset = contiguous_offset(chunk, block)) {
    const std::int64_t end = std::min(last, chunk.shape.numel());
    return first >= end || copy(first, end, *offset + first);
  }
  const std::size_t rank = block.local_shape.rank();
  Shape lo = Shape::zeros(rank);
  Shape hi = Shape::zeros(rank);
  for (std::size_t i = 0; i < rank; ++i) {
    lo[i] = std::max(chunk.offsets[i], block.global_offset[i]);
    hi[i] = std::min(chunk.offsets[i] + chunk.shape[i], block.global_offset[i] + block.local_shape[i]);
    if (lo[i] >= hi[i]) return true;
  }
  const Shape src_stride = row_major_strides(chunk.shape);
  const Shape dst_stride = row_major_strides(block.local_shape);
  const std::int64_t row = hi[rank - 1] - lo[rank - 1];
  Shape idx = lo;
  for (;;) {
    std::int64_t s = 0;
    std::int64_t d = 0;
    for (std::size_t i = 0; i < rank; ++i) {
      s += (idx[i] - chunk.offsets[i]) * src_stride[i];
      d += (idx[i] - block.global_offset[i]) * dst_stride[i];
    }
    // Rows come in ascending order in the chunk.
    if (s >= last) return true;
    const std::int64_t from = std::max(s, first);
    const std::int64_t to = std::min(s + row, last);
    if (from < to && !copy(from, to, d + (from - s))) return false;
    // Advance the outer index (every dimension but the last), odometer style.
    std::size_t i = rank - 1;
    for (;;) {
      if (i == 0) return true;
      --i;
      if (++idx[i] < hi[i]) break;
      idx[i] = lo[i];
    }
  }
}

/// One data file of a checkpoint, local or an object: its size and positional reads.
class SourceFile {
 public:
  virtual ~SourceFile() = default;
  virtual std::uint64_t size() const = 0;
  /// Reads exactly `bytes` at `offset`.
  virtual Status read(std::uint64_t offset, void* dst, std::size_t bytes) = 0;
  /// Reads the bytes at `offset` onwards into `segments` in turn, as one read (one preadv, one
  /// ranged GET).
  virtual Status read_vectored(std::uint64_t offset, const std::vector<ReadSegment>& segments) = 0;
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
  Status read_vectored(std::uint64_t offset, const std::vector<ReadSegment>& segments) override {
    return preadv_exact(file_.fd(), offset, segments, file_.path());
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
  Status read_vectored(std::uint64_t offset, const std::vector<ReadSegment>& segments) override {
    if (segments.size() == 1) return read(offset, segments[0].dst, segments[0].bytes);
    // One ranged GET for the whole run, then scattered: a GET has one destination.
    std::size_t total = 0;
    for (const auto& s : segments) total += s.bytes;
    HostBuffer run(total, false, &staging_memory());
    if (total > 0 && !run.valid()) {
      return Status{ErrorCode::no_space, "cannot allocate " + std::to_string(total) + " bytes to read '" +
                                             bucket_->url(key_) + "'"};
    }
    SH_RETURN_IF_ERROR(read(offset, run.data(), total));
    std::size_t at = 0;
    for (const auto& s : segments) {
      std::copy_n(run.data() + at, s.bytes, static_cast<std::uint8_t*>(s.dst));
      at += s.bytes;
    }
    return Status::ok();
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

/// The part of the checkpoint's metadata that a load of `state` reads (MetadataIndex::part_for),
/// under the saved names `options` maps the live ones to (LoadOptions::sources, skip).
/// A local metadata.json is read and checked once per process, whichever rank asks first, and
/// shared by the others (shared_metadata_index).
/// @param saved_names when not null, set to the name of every tensor of the checkpoint.
Result<CheckpointMetadata> read_metadata_part(const CheckpointSource& source, const std::string& dir,
                                              const StateDict& state, const LoadOptions& options = {},
                                              std::vector<std::string>* saved_names = nullptr) {
  const std::string path = is_cloud(dir) ? std::string() : source.where(kMetadataRel);
  SH_ASSIGN_OR_RETURN(auto index, shared_metadata_index(path, [&] { return read_metadata(source, dir); }));
  if (saved_names != nullptr) {
    saved_names->clear();
    for (const auto& [name, tensor] : index->metadata().tensors) saved_names->push_back(name);
  }
  if (options.sources.empty() && options.skip.empty()) return index->part_for(state);
  // The blocks as the checkpoint names them (tensor handles are shared, not copied).
  StateDict query;
  query.objects = state.objects;
  for (const auto& t : state.tensors) {
    if (options.skip.count(t.desc.name) != 0) continue;
    query.tensors.push_back(t);
    if (auto source_name = options.sources.find(t.desc.name); source_name != options.sources.end()) {
      query.tensors.back().desc.name = source_name->second;
    }
  }
  return index->part_for(query);
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

/// The safetensors header of an opened file, which `path` names in errors.
Result<ParsedSafetensors> parse_header_of(SourceFile& file, const std::string& path) {
  return parse_safetensors_header(
      [&file](std::uint64_t offset, void* dst, std::size_t bytes) { return file.read(offset, dst, bytes); },
      file.size(), path);
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
  /// @param folder where the data files lie in `source`: kPolicyDir, or "" for a safetensors folder.
  FileCache(const CheckpointSource& source, const CheckpointMetadata& m, std::string folder)
      : source_(source), metadata_(m), folder_(std::move(folder)) {}

  /// @pre `name` is listed in the metadata's files (validate_metadata proves it of every chunk's).
  Result<const DataFile*> get(const std::string& name) {
    auto it = open_.find(name);
    if (it != open_.end()) return &it->second;
    const std::uint64_t expected = metadata_.files.at(name).size;
    std::string rel = folder_.empty() ? name : folder_ + "/" + name;
    DataFile data{nullptr, source_.where(rel), {}};
    SH_ASSIGN_OR_RETURN(data.file, source_.open(rel));
    if (data.file->size() != expected) {
      return Status{ErrorCode::corruption,
                    "'" + data.path + "' has " + std::to_string(data.file->size()) +
                        " bytes, the metadata says " + std::to_string(expected) + " (truncated?)"};
    }
    SH_ASSIGN_OR_RETURN(data.header, parse_header_of(*data.file, data.path));
    return &open_.emplace(name, std::move(data)).first->second;
  }

 private:
  const CheckpointSource& source_;
  const CheckpointMetadata& metadata_;
  const std::string folder_;
  std::map<std::string, DataFile> open_;
};

/// A safetensors folder (model.safetensors, or the shards its index names) as checkpoint
/// metadata: every tensor one whole chunk, without checksums (the format has none), step 0.
Result<CheckpointMetadata> read_safetensors_folder(const CheckpointSource& source) {
  CheckpointMetadata m;
  std::map<std::string, std::string> index;  // tensor -> file, from the index
  std::vector<std::string> files;
  SH_ASSIGN_OR_RETURN(auto index_text, source.read_text(kHfIndexFile));
  const std::string index_path = source.where(kHfIndexFile);
  if (index_text) {
    auto j = nlohmann::json::parse(*index_text, nullptr, false);
    auto map = j.is_object() ? j.find("weight_map") : j.end();
    if (map == j.end() || !map->is_object()) {
      return Status{ErrorCode::corruption, "'" + index_path + "': field 'weight_map' is missing or not an object"};
    }
    std::set<std::string> seen;
    for (const auto& [tensor, file] : map->items()) {
      if (!file.is_string() || !is_plain_file_name(file.get<std::string>())) {
        return Status{ErrorCode::corruption, "'" + index_path + "': weight_map['" + tensor +
                                                 "'] is not the name of a file in the folder"};
      }
      index[tensor] = file.get<std::string>();
      if (seen.insert(file.get<std::string>()).second) files.push_back(file.get<std::string>());
    }
  } else {
    files.push_back(kHfSingleFile);
  }
  for (const auto& name : files) {
    SH_ASSIGN_OR_RETURN(auto file, source.open(name));
    const std::string path = source.where(name);
    SH_ASSIGN_OR_RETURN(ParsedSafetensors header, parse_header_of(*file, path));
    m.files[name] = FileMeta{file->size(), 0};
    for (const auto& e : header.entries) {
      if (m.tensors.count(e.key) != 0) {
        return Status{ErrorCode::corruption, "tensor '" + e.key + "' is in '" + path + "' and in '" +
                                                 m.tensors[e.key].chunks.front().file + "'"};
      }
      if (index_text && index.count(e.key) != 0 && index[e.key] != name) {
        return Status{ErrorCode::corruption, "'" + index_path + "' puts tensor '" + e.key + "' in '" + index[e.key] +
                                                 "', but it is in '" + path + "'"};
      }
      ChunkMeta chunk{Shape::zeros(e.shape.rank()), e.shape, name, header.data_start + e.begin,
                      header.data_start + e.end, 0};
      m.tensors[e.key] = TensorMeta{e.dtype, e.shape, {chunk}};
    }
  }
  for (const auto& [tensor, file] : index) {
    if (m.tensors.count(tensor) == 0) {
      return Status{ErrorCode::corruption, "'" + index_path + "' names tensor '" + tensor + "' in '" + file +
                                               "', which does not hold it"};
    }
  }
  return m;
}

}  // namespace

bool is_safetensors_folder(const std::string& dir) {
  if (is_cloud(dir)) return false;
  std::error_code ec;
  if (fs::exists(CheckpointLayout::policy_dir(dir) + "/" + kMetadataFile, ec)) return false;
  return fs::is_regular_file(dir + "/" + kHfIndexFile, ec) || fs::is_regular_file(dir + "/" + kHfSingleFile, ec);
}

LoadOptions load_selection_by_name(const StateDict& state, const LoadScope& scope) {
  LoadOptions options;
  for (const auto& t : state.tensors) {
    if (!scope.optimizer && t.desc.name.starts_with("optimizer.")) options.skip.insert(t.desc.name);
  }
  for (const auto& [name, value] : state.objects) {
    const bool optimizer = name.starts_with("optimizer.") || name == "scheduler";
    const bool rng = name.starts_with("rng.");
    if ((optimizer && !scope.optimizer) || (rng && !scope.rng)) options.skip.insert(name);
    if (rng) options.optional_objects.insert(name);
  }
  options.strict = scope.strict;
  options.list_unused = true;
  options.convert_dtypes = true;
  return options;
}

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
  if (is_safetensors_folder(path)) return path;
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

Result<CheckpointMetadata> read_checkpoint_metadata_part(const std::string& checkpoint_dir, const StateDict& state,
                                                         const ObjectStoreOptions& store) {
  SH_ASSIGN_OR_RETURN(auto source, open_source(checkpoint_dir, store));
  return read_metadata_part(*source, checkpoint_dir, state);
}

Result<std::string> read_trainer_state_text(const std::string& checkpoint_dir, const ObjectStoreOptions& store) {
  SH_ASSIGN_OR_RETURN(auto source, open_source(checkpoint_dir, store));
  SH_ASSIGN_OR_RETURN(CheckpointMetadata metadata, read_metadata(*source, checkpoint_dir));
  return read_trainer_state(*source, metadata);
}

std::vector<std::vector<std::size_t>> coalesce_ranges(const std::vector<ReadRange>& ranges, std::uint64_t max_bytes) {
  std::vector<std::size_t> order(ranges.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return std::tie(ranges[a].file, ranges[a].begin) < std::tie(ranges[b].file, ranges[b].begin);
  });
  std::vector<std::vector<std::size_t>> reads;
  std::uint64_t read_begin = 0;
  for (std::size_t i : order) {
    const ReadRange& r = ranges[i];
    if (!reads.empty()) {
      const ReadRange& last = ranges[reads.back().back()];
      if (last.file == r.file && last.end == r.begin && r.end - read_begin <= max_bytes) {
        reads.back().push_back(i);
        continue;
      }
    }
    reads.push_back({i});
    read_begin = r.begin;
  }
  return reads;
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

/// One saved chunk that overlaps a live block, to be read and verified.
struct ChunkJob {
  std::size_t tensor = 0;
  const ChunkMeta* chunk = nullptr;
  const DataFile* file = nullptr;
  /// The tensor's memory the whole chunk is read into; null when it goes through a buffer.
  std::uint8_t* direct = nullptr;
  /// The saved dtype; when it differs from the live one, elements are converted on the way.
  DType saved = DType::f32;
};

/// A byte range of one chunk inside a read.
struct Piece {
  std::size_t job = 0;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
};

/// One coalesced read: neighbouring pieces of one file, all read straight into tensors or all
/// through a buffer.
struct ReadTask {
  const DataFile* file = nullptr;
  bool direct = false;
  std::vector<Piece> pieces;
  std::uint64_t begin() const { return pieces.front().begin; }
  std::uint64_t end() const { return pieces.back().end; }
};

/// Per-thread figures, summed into the LoadReport.
struct PhaseTimes {
  double read_s = 0;
  double verify_s = 0;
  double copy_s = 0;
  std::uint64_t bytes = 0;
  std::uint64_t reads = 0;
};

/// Runs the reads of one load on a few threads: the first error stops the rest.
///
/// Thread-safety: run() is called once; the tasks it runs touch disjoint tensor memory (the
/// saved chunks tile each tensor, so no two overlap one block's element).
class ParallelLoad {
 public:
  /// @param verify whether chunks carry checksums to check (a safetensors folder's do not).
  ParallelLoad(StateDict& state, const std::vector<ChunkJob>& jobs, std::vector<ReadTask> tasks,
               const LoadOptions& options, bool pinned, bool verify)
      : state_(state), jobs_(jobs), tasks_(std::move(tasks)), options_(options), pinned_(pinned), verify_(verify) {
    for (const auto& task : tasks_) {
      if (!task.direct) largest_buffered_ = std::max(largest_buffered_, task.end() - task.begin());
    }
  }

  Status run(LoadReport& report) {
    const auto threads = static_cast<std::size_t>(std::max(1, options_.thread_count));
    std::vector<PhaseTimes> times(std::min(threads, std::max<std::size_t>(tasks_.size(), 1)));
    std::vector<std::thread> helpers;
    for (std::size_t t = 1; t < times.size(); ++t) {
      try {
        helpers.emplace_back([this, &times, t] { work(times[t]); });
      } catch (const std::system_error&) {
        break;  // fewer threads: the ones started (and this one) take every task
      }
    }
    work(times[0]);
    for (auto& h : helpers) h.join();
    for (const auto& t : times) {
      report.read_s += t.read_s;
      report.verify_s += t.verify_s;
      report.copy_s += t.copy_s;
      report.bytes += t.bytes;
      report.reads += t.reads;
    }
    report.thread_count = static_cast<int>(helpers.size() + 1);
    report.buffer_peak_bytes = buffer_peak_.load();
    return first_error_;
  }

 private:
  void work(PhaseTimes& times) {
    HostBuffer buffer;
    for (std::size_t i = next_.fetch_add(1); i < tasks_.size() && !failed_.load(); i = next_.fetch_add(1)) {
      const ReadTask& task = tasks_[i];
      Status st = task.direct ? read_direct(task, times) : read_buffered(task, buffer, times);
      if (!st.is_ok()) fail(st);
    }
    if (buffer.valid()) buffer_current_.fetch_sub(buffer.size());
  }

  void fail(Status st) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (first_error_.is_ok()) first_error_ = std::move(st);
    failed_.store(true);
  }

  const std::string& tensor_name(std::size_t job) const { return state_.tensors[jobs_[job].tensor].desc.name; }

  Status checksum_mismatch(std::size_t job, std::uint64_t hash) const {
    const ChunkJob& j = jobs_[job];
    return Status{ErrorCode::corruption, "'" + j.file->path + "': tensor '" + tensor_name(job) + "' chunk " +
                                             j.chunk->offsets.to_string() + ": checksum mismatch (XXH3 " +
                                             xxh3_hex(hash) + ", expected " + xxh3_hex(j.chunk->xxh3) + ")"};
  }

  /// Reads the task's range straight into the tensors in reads of at most max_read_bytes (one
  /// vectored read each), hashing what each read brought while it is still in the CPU's cache.
  Status read_direct(const ReadTask& task, PhaseTimes& times) {
    std::size_t k = 0;
    auto hash = std::make_unique<Xxh3Stream>();
    std::vector<ReadSegment> segments;
    for (std::uint64_t pos = task.begin(); pos < task.end();) {
      const std::uint64_t end = std::min(task.end(), pos + options_.max_read_bytes);
      segments.clear();
      for (std::size_t i = k; i < task.pieces.size() && task.pieces[i].begin < end; ++i) {
        const Piece& p = task.pieces[i];
        const std::uint64_t lo = std::max(pos, p.begin);
        segments.push_back({jobs_[p.job].direct + (lo - p.begin), static_cast<std::size_t>(std::min(end, p.end) - lo)});
      }
      auto start = Clock::now();
      Status st = task.file->file->read_vectored(pos, segments);
      times.read_s += seconds_since(start);
      ++times.reads;
      if (!st.is_ok()) return st.with_context("loading tensor '" + tensor_name(task.pieces[k].job) + "'");
      times.bytes += end - pos;
      start = Clock::now();
      for (; k < task.pieces.size() && task.pieces[k].begin < end;) {
        const Piece& p = task.pieces[k];
        const std::uint64_t lo = std::max(pos, p.begin);
        const std::uint64_t hi = std::min(end, p.end);
        hash->update(jobs_[p.job].direct + (lo - p.begin), static_cast<std::size_t>(hi - lo));
        if (hi < p.end) break;
        if (verify_ && hash->digest() != jobs_[p.job].chunk->xxh3) {
          times.verify_s += seconds_since(start);
          return checksum_mismatch(p.job, hash->digest());
        }
        hash = std::make_unique<Xxh3Stream>();
        ++k;
      }
      times.verify_s += seconds_since(start);
      pos = end;
    }
    return Status::ok();
  }

  /// Reads the task's range in buffer-sized pieces; each piece feeds its chunks' hashes and is
  /// copied into their blocks.
  Status read_buffered(const ReadTask& task, HostBuffer& buffer, PhaseTimes& times) {
    if (!buffer.valid()) {
      const auto bytes = static_cast<std::size_t>(
          std::min<std::uint64_t>(std::max<std::size_t>(options_.buffer_bytes, kMinBufferBytes), largest_buffered_));
      buffer = HostBuffer(bytes, pinned_, &staging_memory());
      if (!buffer.valid()) {
        return Status{ErrorCode::no_space, "cannot allocate a " + std::to_string(bytes) + "-byte load buffer"};
      }
      const std::uint64_t now = buffer_current_.fetch_add(bytes) + bytes;
      for (std::uint64_t peak = buffer_peak_.load(); now > peak && !buffer_peak_.compare_exchange_weak(peak, now);) {
      }
    }
    std::size_t k = 0;
    auto hash = std::make_unique<Xxh3Stream>();
    std::vector<std::uint8_t> converted;
    for (std::uint64_t pos = task.begin(); pos < task.end();) {
      std::uint64_t n = std::min<std::uint64_t>(buffer.size(), task.end() - pos);
      // End the piece on an element boundary of the chunk it cuts.
      for (std::size_t i = k; i < task.pieces.size() && pos + n < task.end(); ++i) {
        const Piece& p = task.pieces[i];
        if (p.begin < pos + n && pos + n < p.end) {
          n -= (pos + n - p.begin) % dtype_size(jobs_[p.job].saved);
          break;
        }
      }
      auto start = Clock::now();
      Status st = task.file->file->read(pos, buffer.data(), static_cast<std::size_t>(n));
      times.read_s += seconds_since(start);
      ++times.reads;
      if (!st.is_ok()) return st.with_context("loading tensor '" + tensor_name(task.pieces[k].job) + "'");
      times.bytes += n;
      for (; k < task.pieces.size() && task.pieces[k].begin < pos + n;) {
        const Piece& p = task.pieces[k];
        const ChunkJob& j = jobs_[p.job];
        ShardedTensor& live = state_.tensors[j.tensor];
        const std::size_t elem = dtype_size(j.saved);
        const std::uint64_t lo = std::max(pos, p.begin);
        const std::uint64_t hi = std::min(pos + n, p.end);
        const std::uint8_t* src = buffer.data() + (lo - pos);
        start = Clock::now();
        if (verify_) hash->update(src, static_cast<std::size_t>(hi - lo));
        times.verify_s += seconds_since(start);
        start = Clock::now();
        if (j.saved != live.desc.dtype) {
          // Converted into the live dtype first; the copy below then moves live-sized elements.
          const std::size_t count = static_cast<std::size_t>(hi - lo) / elem;
          converted.resize(count * dtype_size(live.desc.dtype));
          Status conversion = convert_elements(src, j.saved, converted.data(), live.desc.dtype, count);
          if (!conversion.is_ok()) return conversion.with_context("loading tensor '" + live.desc.name + "'");
          src = converted.data();
        }
        bool copied = copy_overlap_part(*j.chunk, live.desc, dtype_size(live.desc.dtype),
                                        static_cast<std::int64_t>((lo - p.begin) / elem),
                                        static_cast<std::int64_t>((hi - p.begin) / elem), src,
                                        static_cast<std::uint8_t*>(live.tensor.data()),
                                        live.tensor.device());
        times.copy_s += seconds_since(start);
        if (!copied) {
          return Status{ErrorCode::io_error, "host-to-device copy into tensor '" + live.desc.name + "' on " +
                                                 live.tensor.device().to_string() + " failed"};
        }
        if (hi < p.end) break;
        if (verify_ && hash->digest() != j.chunk->xxh3) return checksum_mismatch(p.job, hash->digest());
        hash = std::make_unique<Xxh3Stream>();
        ++k;
      }
      pos += n;
    }
    return Status::ok();
  }

  /// Buffers are at least this large, so that a piece always holds whole elements.
  static constexpr std::size_t kMinBufferBytes = 4096;

  StateDict& state_;
  const std::vector<ChunkJob>& jobs_;
  const std::vector<ReadTask> tasks_;
  const LoadOptions options_;
  const bool pinned_;
  const bool verify_;
  std::uint64_t largest_buffered_ = 0;
  std::atomic<std::size_t> next_{0};
  std::atomic<bool> failed_{false};
  std::atomic<std::uint64_t> buffer_current_{0};
  std::atomic<std::uint64_t> buffer_peak_{0};
  std::mutex mutex_;
  Status first_error_;
};

/// Groups the jobs into tasks of coalesced whole chunks, ordered by file and offset: one thread
/// reads each task, so that each chunk's hash sees its bytes in order.
std::vector<ReadTask> plan_reads(const std::vector<ChunkJob>& jobs, std::uint64_t max_read_bytes) {
  std::vector<ReadTask> tasks;
  for (bool direct : {true, false}) {
    std::vector<ReadRange> ranges;
    std::vector<Piece> pieces;
    for (std::size_t j = 0; j < jobs.size(); ++j) {
      if ((jobs[j].direct != nullptr) != direct) continue;
      const ChunkMeta& c = *jobs[j].chunk;
      ranges.push_back({c.file, c.begin, c.end});
      pieces.push_back({j, c.begin, c.end});
    }
    for (const auto& read : coalesce_ranges(ranges, max_read_bytes)) {
      ReadTask task{jobs[pieces[read.front()].job].file, direct, {}};
      for (std::size_t i : read) task.pieces.push_back(pieces[i]);
      tasks.push_back(std::move(task));
    }
  }
  std::stable_sort(tasks.begin(), tasks.end(), [](const ReadTask& a, const ReadTask& b) {
    return std::tie(a.file->path, a.pieces.front().begin) < std::tie(b.file->path, b.pieces.front().begin);
  });
  return tasks;
}

}  // namespace

Status load_checkpoint(const std::string& checkpoint_dir, StateDict& state, const ObjectStoreOptions& store) {
  return load_checkpoint(checkpoint_dir, state, store, LoadOptions{});
}

Status load_checkpoint(const std::string& checkpoint_dir, StateDict& state, const ObjectStoreOptions& store,
                       const LoadOptions& options, LoadReport* report) {
  const auto start = Clock::now();
  LoadReport local_report;
  LoadReport& out = report != nullptr ? *report : local_report;
  out = LoadReport{};
  if (options.thread_count < 1) {
    return Status{ErrorCode::invalid_argument, "ckpt_load_thread_count must be at least 1, got " +
                                                   std::to_string(options.thread_count)};
  }
  if (options.max_read_bytes < 1) return Status{ErrorCode::invalid_argument, "max_read_bytes must be at least 1"};
  SH_ASSIGN_OR_RETURN(auto source, open_source(checkpoint_dir, store));
  const bool safetensors_folder = is_safetensors_folder(checkpoint_dir);
  CheckpointMetadata metadata;
  std::vector<std::string> saved_names;  // every tensor of the checkpoint, for unused_tensors
  if (safetensors_folder) {
    SH_ASSIGN_OR_RETURN(metadata, read_safetensors_folder(*source));
    for (const auto& [name, tensor] : metadata.tensors) saved_names.push_back(name);
  } else {
    // Listing every saved name costs every rank O(tensors of the whole checkpoint): only for the
    // loads that report or refuse unused tensors (a trainer's), not for the default one.
    const bool list_unused = options.list_unused || options.refuse_unused || !options.strict;
    SH_ASSIGN_OR_RETURN(metadata, read_metadata_part(*source, checkpoint_dir, state, options,
                                                     list_unused ? &saved_names : nullptr));
  }
  SH_RETURN_IF_ERROR(state.validate());
  FileCache files(*source, metadata, safetensors_folder ? "" : kPolicyDir);
  // Every check that needs no chunk bytes runs before any read, so that these errors leave the
  // state untouched.
  std::vector<ChunkJob> jobs;
  std::set<std::string> used;  // saved tensors this load reads
  std::set<std::string> live_names;
  bool pinned = false;
  for (std::size_t t = 0; t < state.tensors.size(); ++t) {
    ShardedTensor& live = state.tensors[t];
    const ShardedTensorDesc& block = live.desc;
    live_names.insert(block.name);
    if (options.skip.count(block.name) != 0) continue;
    const auto source_name = options.sources.find(block.name);
    const std::string& saved_name = source_name == options.sources.end() ? block.name : source_name->second;
    const std::string as = saved_name == block.name ? "" : " (from saved tensor '" + saved_name + "')";
    auto fail = [&](const std::string& why) {
      return Status{ErrorCode::invalid_argument,
                    "tensor '" + block.name + "'" + as + " in '" + checkpoint_dir + "': " + why};
    };
    auto found = metadata.tensors.find(saved_name);
    if (found == metadata.tensors.end()) {
      if (!options.strict) {
        out.missing_tensors.push_back(block.name);
        continue;
      }
      return fail("not in the checkpoint");
    }
    used.insert(saved_name);
    const TensorMeta& saved = found->second;
    if (saved.dtype != block.dtype &&
        !(options.convert_dtypes && can_convert(saved.dtype, block.dtype))) {
      return fail("saved as " + std::string(dtype_name(saved.dtype)) + ", live as " +
                  std::string(dtype_name(block.dtype)));
    }
    if (!(saved.global_shape == block.global_shape)) {
      return fail("saved with global shape " + saved.global_shape.to_string() + ", live " +
                  block.global_shape.to_string());
    }
    if (block.local_shape.numel() == 0) continue;
    const bool on_device = live.tensor.device().is_cuda();
    pinned |= on_device;
    // validate_metadata proved that the saved chunks tile the global shape, so their overlaps
    // with this block are disjoint and counting their elements proves that they fill it. A
    // safetensors folder's tensors are one whole chunk each.
    std::int64_t covered = 0;
    for (const auto& chunk : saved.chunks) {
      const std::int64_t overlap = overlap_numel(chunk, block);
      if (overlap == 0) continue;
      auto file = files.get(chunk.file);
      if (!file.is_ok()) return file.status().with_context("loading tensor '" + block.name + "'");
      const DataFile& data = **file;
      if (!safetensors_folder) {
        SH_RETURN_IF_ERROR(check_chunk_in_header(data.header, data.path, saved_name, saved.dtype, chunk));
      }
      ChunkJob job{t, &chunk, &data, nullptr, saved.dtype};
      if (auto offset = contiguous_offset(chunk, block); offset && !on_device && saved.dtype == block.dtype) {
        job.direct = static_cast<std::uint8_t*>(live.tensor.data()) +
                     static_cast<std::size_t>(*offset) * dtype_size(block.dtype);
        ++out.direct_chunks;
      }
      jobs.push_back(job);
      covered += overlap;
    }
    if (covered != block.local_shape.numel()) {
      return fail("the checkpoint covers " + std::to_string(covered) + " of the " +
                  std::to_string(block.local_shape.numel()) + " elements of the block at " +
                  block.global_offset.to_string());
    }
  }
  std::sort(out.missing_tensors.begin(), out.missing_tensors.end());
  for (const auto& name : saved_names) {
    if (live_names.count(name) == 0 && used.count(name) == 0) out.unused_tensors.push_back(name);
  }
  if (options.refuse_unused && !out.unused_tensors.empty()) {
    std::string names;
    for (std::size_t i = 0; i < out.unused_tensors.size() && i < 5; ++i) {
      names += (i ? ", '" : "'") + out.unused_tensors[i] + "'";
    }
    if (out.unused_tensors.size() > 5) names += " and " + std::to_string(out.unused_tensors.size() - 5) + " more";
    return Status{ErrorCode::invalid_argument, "'" + checkpoint_dir + "' holds " +
                                                   std::to_string(out.unused_tensors.size()) +
                                                   " tensor(s) the state does not have: " + names};
  }
  for (const auto& [name, value] : state.objects) {
    if (options.skip.count(name) != 0 || metadata.objects.count(name) != 0) continue;
    if (options.strict && options.optional_objects.count(name) == 0) {
      return Status{ErrorCode::invalid_argument, "object '" + name + "' is not in '" + checkpoint_dir + "'"};
    }
    out.missing_objects.push_back(name);
  }
  out.chunks = jobs.size();
  ParallelLoad load(state, jobs, plan_reads(jobs, options.max_read_bytes), options, pinned, !safetensors_folder);
  Status loaded = load.run(out);
  out.total_s = seconds_since(start);
  SH_RETURN_IF_ERROR(loaded);
  for (auto& [name, value] : state.objects) {
    if (options.skip.count(name) != 0) continue;
    if (auto saved = metadata.objects.find(name); saved != metadata.objects.end()) value = saved->second;
  }
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
    auto parsed = parse_header_of(reader, path);
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
