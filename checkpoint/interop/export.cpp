#include "stagehand/checkpoint/interop/export.hpp"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <csignal>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "stagehand/checkpoint/load/checkpoint_reader.hpp"
#include "stagehand/checkpoint/format/format.hpp"
#include "stagehand/checkpoint/load/loader.hpp"
#include "stagehand/checkpoint/load/resolve.hpp"
#include "stagehand/core/host_buffer.hpp"
#include "stagehand/core/log.hpp"
#include "stagehand/core/sharded_tensor.hpp"

namespace stagehand {

namespace {

/// Output bytes converted at once: the conversion buffer's size.
constexpr std::size_t kConvertBufferBytes = 8u << 20;

/// Tensors are loaded together up to the largest tensor's size, or this much when that is less:
/// each load opens the data files and reads their headers again (and, from an object store,
/// metadata.json), which a model of many small tensors would otherwise pay once per tensor.
constexpr std::uint64_t kMinBatchBytes = 64u << 20;

std::string quoted(const std::string& text) {
  return "'" + text + "'";
}

/// One tensor of the export.
struct ExportTensor {
  std::string name;
  const TensorMeta* saved = nullptr;
  DType out_dtype = DType::f32;
  std::uint64_t saved_bytes = 0;
  std::uint64_t out_bytes = 0;
};

/// One output file: its tensors (indices into the export's, by name) and their bytes.
struct ExportFile {
  std::string name;
  std::vector<std::size_t> tensors;
  std::uint64_t bytes = 0;
};

std::uint64_t tensor_bytes(const Shape& shape, DType dtype) {
  return static_cast<std::uint64_t>(shape.numel()) * dtype_size(dtype);
}

Result<std::vector<ExportTensor>> select_tensors(const CheckpointMetadata& metadata,
                                                 const ExportOptions& options,
                                                 const std::string& checkpoint_dir) {
  std::vector<ExportTensor> out;
  for (const auto& [name, saved] : metadata.tensors) {
    if (options.what == ExportOptions::What::model && !name.starts_with("model.")) continue;
    ExportTensor t{name, &saved, saved.dtype, tensor_bytes(saved.global_shape, saved.dtype), 0};
    if (options.dtype && is_floating_point(saved.dtype)) t.out_dtype = *options.dtype;
    t.out_bytes = tensor_bytes(saved.global_shape, t.out_dtype);
    out.push_back(std::move(t));
  }
  if (out.empty()) {
    return Status{ErrorCode::invalid_argument,
                  quoted(checkpoint_dir) + " has no tensor to export" +
                      (options.what == ExportOptions::What::model
                           ? " (none named 'model.*'; --what all exports every one)"
                           : "")};
  }
  return out;
}

/// Hugging Face's sharding: tensors in name order, a new file whenever the next tensor would
/// take the current one past `max_bytes`; a tensor larger than that has a file of its own.
std::vector<ExportFile> plan_files(const std::vector<ExportTensor>& tensors,
                                   std::uint64_t max_bytes) {
  std::vector<ExportFile> files(1);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (!files.back().tensors.empty() && files.back().bytes + tensors[i].out_bytes > max_bytes) {
      files.emplace_back();
    }
    files.back().tensors.push_back(i);
    files.back().bytes += tensors[i].out_bytes;
  }
  if (files.size() == 1) {
    files[0].name = kHfSingleFile;
  } else {
    for (std::size_t i = 0; i < files.size(); ++i) {
      char name[64];
      std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", i + 1, files.size());
      files[i].name = name;
    }
  }
  return files;
}

/// Refuses an output that is empty, on a store without renames, or that exists and is not an
/// empty folder.
Status check_output(FileSystem& fs, const std::string& out_dir) {
  if (out_dir.empty()) return Status{ErrorCode::invalid_argument, "export needs the path of an output folder"};
  if (!fs.capabilities(out_dir).atomic_rename) {
    return Status{ErrorCode::unsupported, "export writes to a local folder, not to " + quoted(out_dir) +
                                              " (export locally, then upload the folder)"};
  }
  const Status exists{ErrorCode::already_exists,
                      quoted(out_dir) + " exists and is not an empty folder; export writes a new folder"};
  SH_ASSIGN_OR_RETURN(bool is_dir, fs.is_dir(out_dir));
  if (is_dir) {
    SH_ASSIGN_OR_RETURN(auto entries, fs.list_dir(out_dir));
    return entries.empty() ? Status::ok() : exists;
  }
  // Anything else there, a file or a FIFO, is in the way.
  auto file = fs.stat_file(out_dir);
  return file.is_ok() && !*file ? Status::ok() : exists;
}

/// `path` made absolute, with "." and ".." and the symbolic links of its existing part
/// resolved: two spellings of one local folder compare equal.
std::string normalized_local(const std::string& path) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::absolute(path, ec);
  if (ec) p = path;
  const std::filesystem::path canonical = std::filesystem::weakly_canonical(p, ec);
  std::string out = (ec ? p : canonical).lexically_normal().string();
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

/// Refuses an output inside the checkpoint folder `checkpoint_dir` or inside the root that holds
/// it (the folder of its tracker and its other steps, where a folder is named global_step_N or
/// has a tracker beside it): the export would land among the files that retention, resumes and
/// verify take for the checkpoint's own.
Status check_outside_checkpoint(FileSystem& fs, const std::string& out_dir, const std::string& checkpoint_dir) {
  const std::string out = normalized_local(out_dir);
  std::string tree = normalized_local(checkpoint_dir);
  const std::string parent = parent_path(tree);
  SH_ASSIGN_OR_RETURN(bool in_root, file_exists(fs, parent + "/" + kTrackerFile));
  if (in_root || tree.substr(tree.find_last_of('/') + 1).starts_with("global_step_")) tree = parent;
  // An output around the tree is not empty: check_output refused it.
  if (!path_within(out, tree)) return Status::ok();
  return Status{ErrorCode::invalid_argument,
                "the output " + quoted(out_dir) + " lies inside the checkpoint tree '" + tree + "'" +
                    ", whose files retention, resumes and verify take for the checkpoint's own: export into a "
                    "folder outside it"};
}

/// The tensors of one file are loaded a few at a time: `batch` tensors that together hold at
/// most `budget` bytes as saved (or one larger tensor).
std::vector<std::vector<std::size_t>> plan_batches(const std::vector<ExportTensor>& tensors,
                                                   const std::vector<std::size_t>& order,
                                                   std::uint64_t budget) {
  std::vector<std::vector<std::size_t>> batches;
  std::uint64_t held = 0;
  for (std::size_t i : order) {
    if (batches.empty() || held + tensors[i].saved_bytes > budget) {
      batches.emplace_back();
      held = 0;
    }
    batches.back().push_back(i);
    held += tensors[i].saved_bytes;
  }
  return batches;
}

/// Writes one export file into `dir`, reading its tensors from the checkpoint.
class ExportFileWriter {
 public:
  ExportFileWriter(FileSystem& fs, const std::string& checkpoint_dir, const ExportOptions& options,
                   const std::vector<ExportTensor>& tensors, ExportReport& report, ProgressCounter& progress)
      : fs_(fs),
        checkpoint_dir_(checkpoint_dir),
        options_(options),
        tensors_(tensors),
        report_(report),
        progress_(progress) {}

  Status write(const std::string& dir, const ExportFile& file, std::uint64_t batch_budget) {
    const std::string path = dir + "/" + file.name;
    std::vector<SafetensorsEntry> entries;
    std::uint64_t offset = 0;
    for (std::size_t i : file.tensors) {
      const ExportTensor& t = tensors_[i];
      entries.push_back({t.name, t.out_dtype, t.saved->global_shape, offset, offset + t.out_bytes});
      offset += t.out_bytes;
    }
    SH_ASSIGN_OR_RETURN(out_, fs_.create_file(path));
    const std::string header = make_safetensors_header(entries);
    SH_RETURN_IF_ERROR(out_->append(header.data(), header.size()));
    for (const auto& batch : plan_batches(tensors_, file.tensors, batch_budget)) {
      if (options_.should_stop && options_.should_stop()) {
        return Status{ErrorCode::aborted, "stopped before '" + file.name + "' was written: the run is stopping"};
      }
      SH_RETURN_IF_ERROR(write_batch(batch));
    }
    SH_RETURN_IF_ERROR(out_->sync());
    SH_RETURN_IF_ERROR(out_->close());
    report_.files_written.push_back(file.name);
    ++report_.files;
    return Status::ok();
  }

 private:
  /// Loads the batch's tensors whole (load_checkpoint reads and verifies only their chunks) and
  /// appends each, converted where asked.
  Status write_batch(const std::vector<std::size_t>& batch) {
    StateDict state;
    std::uint64_t held = 0;
    for (std::size_t i : batch) {
      const ExportTensor& t = tensors_[i];
      SH_ASSIGN_OR_RETURN(Tensor tensor,
                          Tensor::empty(t.saved->dtype, t.saved->global_shape, Device::host()));
      state.add_full(t.name, std::move(tensor));
      held += t.saved_bytes;
    }
    LoadReport load;
    LoadOptions load_options;
    load_options.thread_count = options_.thread_count;
    SH_RETURN_IF_ERROR(load_checkpoint(fs_, checkpoint_dir_, state, load_options, &load));
    std::uint64_t converting = 0;
    for (std::size_t k = 0; k < batch.size(); ++k) {
      const ExportTensor& t = tensors_[batch[k]];
      const Tensor& tensor = state.tensors[k].tensor;
      if (t.out_dtype == t.saved->dtype) {
        SH_RETURN_IF_ERROR(out_->append(tensor.data(), tensor.nbytes()));
      } else {
        SH_RETURN_IF_ERROR(append_converted(t, tensor));
        converting = convert_buffer_.size();
      }
      report_.bytes += t.out_bytes;
      ++report_.tensors;
      progress_.add(t.out_bytes);
    }
    report_.buffer_peak_bytes =
        std::max(report_.buffer_peak_bytes, held + converting + load.buffer_peak_bytes);
    return Status::ok();
  }

  Status append_converted(const ExportTensor& t, const Tensor& tensor) {
    if (!convert_buffer_.valid()) {
      convert_buffer_ = HostBuffer(kConvertBufferBytes, false, nullptr);
      if (!convert_buffer_.valid())
        return Status{ErrorCode::no_space, "cannot allocate the conversion buffer"};
    }
    const std::size_t in_size = dtype_size(t.saved->dtype);
    const std::size_t out_size = dtype_size(t.out_dtype);
    const std::size_t per_pass = kConvertBufferBytes / out_size;
    const auto* src = static_cast<const std::uint8_t*>(tensor.data());
    const auto total = static_cast<std::size_t>(tensor.numel());
    for (std::size_t done = 0; done < total;) {
      const std::size_t n = std::min(per_pass, total - done);
      SH_RETURN_IF_ERROR(convert_elements(src + done * in_size, t.saved->dtype,
                                          convert_buffer_.data(), t.out_dtype, n)
                             .with_context("tensor " + quoted(t.name)));
      SH_RETURN_IF_ERROR(out_->append(convert_buffer_.data(), n * out_size));
      done += n;
    }
    return Status::ok();
  }

  FileSystem& fs_;
  const std::string& checkpoint_dir_;
  const ExportOptions& options_;
  const std::vector<ExportTensor>& tensors_;
  ExportReport& report_;
  ProgressCounter& progress_;
  std::unique_ptr<WritableFile> out_;
  HostBuffer convert_buffer_;
};

Status write_index(FileSystem& fs, const std::string& dir, const std::vector<ExportTensor>& tensors,
                   const std::vector<ExportFile>& files) {
  nlohmann::json weight_map = nlohmann::json::object();
  std::uint64_t total = 0;
  for (const auto& file : files) {
    for (std::size_t i : file.tensors) {
      weight_map[tensors[i].name] = file.name;
      total += tensors[i].out_bytes;
    }
  }
  const nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  return write_file_atomic(fs, dir + "/" + kHfIndexFile, index.dump(2) + "\n");
}

/// Removes the temporary folder of a failed export.
class TempFolder {
 public:
  TempFolder(FileSystem& fs, std::string path) : fs_(fs), path_(std::move(path)) {}
  ~TempFolder() {
    if (!kept_) (void)fs_.remove_tree(path_);
  }
  TempFolder(const TempFolder&) = delete;
  TempFolder& operator=(const TempFolder&) = delete;
  const std::string& path() const { return path_; }
  void keep() { kept_ = true; }

 private:
  FileSystem& fs_;
  std::string path_;
  bool kept_ = false;
};

/// The temporary folder of an export into `target` by process `pid`.
std::string temp_name(const std::string& target_name, long pid) {
  return "." + target_name + ".export-" + std::to_string(pid) + ".tmp";
}

/// Removes the temporary folders that exports into `target_name` left in `parent` when their
/// process was killed: those whose process no longer exists.
Status remove_stale_exports(FileSystem& fs, const std::string& parent, const std::string& target_name) {
  const std::string prefix = "." + target_name + ".export-";
  SH_ASSIGN_OR_RETURN(auto entries, fs.list_dir(parent));
  for (const auto& e : entries) {
    if (!e.is_dir || !e.name.starts_with(prefix) || !e.name.ends_with(".tmp")) continue;
    char* end = nullptr;
    const long pid = std::strtol(e.name.c_str() + prefix.size(), &end, 10);
    if (pid <= 0 || end == nullptr || std::string(end) != ".tmp") continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    logger()->info("removing '{}/{}', left by an export that was killed", parent, e.name);
    SH_RETURN_IF_ERROR(fs.remove_tree(parent + "/" + e.name));
  }
  return Status::ok();
}

Status export_into(FileSystem& fs, const std::string& checkpoint, const std::string& out_dir,
                   const ExportOptions& options, ExportReport& report) {
  if (options.max_shard_bytes < 1)
    return Status{ErrorCode::invalid_argument, "max_shard_bytes must be at least 1"};
  if (options.dtype && !is_floating_point(*options.dtype)) {
    return Status{ErrorCode::invalid_argument, "export converts to a floating point dtype, not " +
                                                   std::string(dtype_name(*options.dtype))};
  }
  SH_RETURN_IF_ERROR(check_output(fs, out_dir));
  SH_ASSIGN_OR_RETURN(const std::string dir, resolve_checkpoint(fs, checkpoint));
  SH_RETURN_IF_ERROR(check_outside_checkpoint(fs, out_dir, dir));
  SH_ASSIGN_OR_RETURN(const CheckpointMetadata metadata, read_checkpoint_metadata(fs, dir));
  SH_ASSIGN_OR_RETURN(const std::vector<ExportTensor> tensors,
                      select_tensors(metadata, options, dir));
  for (const auto& t : tensors)
    report.largest_tensor_bytes = std::max(report.largest_tensor_bytes, t.saved_bytes);
  const std::vector<ExportFile> files = plan_files(tensors, options.max_shard_bytes);

  std::string target = out_dir;
  while (target.size() > 1 && target.back() == '/') target.pop_back();
  const std::string parent = parent_path(target);
  const std::string name = target.substr(target.find_last_of('/') + 1);
  SH_RETURN_IF_ERROR(create_dirs(fs, parent));
  SH_RETURN_IF_ERROR(remove_stale_exports(fs, parent, name));
  TempFolder temp(fs, parent + "/" + temp_name(name, static_cast<long>(::getpid())));
  SH_RETURN_IF_ERROR(fs.remove_tree(temp.path()));
  SH_RETURN_IF_ERROR(fs.create_dir(temp.path()));

  std::uint64_t total = 0;
  for (const auto& t : tensors) total += t.out_bytes;
  ProgressCounter progress(options.progress, "export", total);
  ExportFileWriter writer(fs, dir, options, tensors, report, progress);
  for (const auto& file : files) {
    SH_RETURN_IF_ERROR(
        writer.write(temp.path(), file, std::max(report.largest_tensor_bytes, kMinBatchBytes)));
  }
  if (files.size() > 1) {
    SH_RETURN_IF_ERROR(write_index(fs, temp.path(), tensors, files));
    report.files_written.push_back(kHfIndexFile);
  }
  SH_RETURN_IF_ERROR(fs.sync_dir(temp.path()));
  // rename(2) replaces an empty folder; check_output refused any other.
  SH_RETURN_IF_ERROR(fs.rename(temp.path(), target));
  temp.keep();
  return fs.sync_dir(parent);
}

}  // namespace

Status export_checkpoint(FileSystem& fs, const std::string& checkpoint, const std::string& out_dir,
                         const ExportOptions& options, ExportReport* report) {
  const auto start = std::chrono::steady_clock::now();
  ExportReport local_report;
  ExportReport& out = report != nullptr ? *report : local_report;
  out = ExportReport{};
  Status status = export_into(fs, checkpoint, out_dir, options, out);
  out.total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return status.is_ok() ? status : status.with_context("export of " + quoted(checkpoint));
}

Result<std::uint64_t> parse_byte_size(const std::string& text) {
  auto bad = [&](const std::string& why) {
    return Status{ErrorCode::invalid_argument,
                  "size " + quoted(text) + " " + why + " (examples: 5GB, 500MB, 2GiB, 1048576)"};
  };
  std::size_t end = 0;
  while (end < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[end])) || text[end] == '.'))
    ++end;
  if (end == 0 ||
      std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(end), '.') > 1 ||
      text[0] == '.' || text[end - 1] == '.') {
    return bad("does not start with a number");
  }
  const double value = std::strtod(text.substr(0, end).c_str(), nullptr);
  std::string unit = text.substr(end);
  while (!unit.empty() && unit.front() == ' ')
    unit.erase(unit.begin());
  std::transform(unit.begin(), unit.end(), unit.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  static const std::map<std::string, double> kUnits = {{"", 1},
                                                       {"b", 1},
                                                       {"kb", 1e3},
                                                       {"mb", 1e6},
                                                       {"gb", 1e9},
                                                       {"tb", 1e12},
                                                       {"kib", 1024.0},
                                                       {"mib", 1048576.0},
                                                       {"gib", 1073741824.0},
                                                       {"tib", 1099511627776.0}};
  const auto scale = kUnits.find(unit);
  if (scale == kUnits.end()) return bad("has an unknown unit '" + text.substr(end) + "'");
  const double bytes = std::floor(value * scale->second);
  if (bytes < 1) return bad("is less than one byte");
  if (bytes >= 18446744073709551616.0) return bad("does not fit in 64 bits");
  return static_cast<std::uint64_t>(bytes);
}

}  // namespace stagehand
