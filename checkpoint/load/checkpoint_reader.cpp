#include "stagehand/checkpoint/load/checkpoint_reader.hpp"

#include <nlohmann/json.hpp>

#include "stagehand/checkpoint/metadata/metadata_index.hpp"
#include "stagehand/checkpoint/load/resolve.hpp"
#include "stagehand/storage/default_file_system.hpp"

namespace stagehand {

namespace {

std::string metadata_path(const std::string& dir) {
  return CheckpointLayout::policy_dir(dir) + "/" + kMetadataFile;
}

/// A named small file whole (none when missing), corruption when something else is in its
/// place: see open_named_file.
Result<std::optional<std::string>> read_named_small_file(FileSystem& fs, const std::string& path) {
  auto text = read_small_file(fs, path);
  if (!text.is_ok() && text.status().code() == ErrorCode::invalid_argument) {
    return Status{ErrorCode::corruption, text.status().message() + " (a file of the checkpoint)"};
  }
  return text;
}

}  // namespace

Result<CheckpointMetadata> read_checkpoint_metadata(FileSystem& fs,
                                                    const std::string& checkpoint_dir,
                                                    std::string* text_out) {
  const std::string path = metadata_path(checkpoint_dir);
  SH_ASSIGN_OR_RETURN(auto text, read_named_small_file(fs, path));
  if (!text) return Status{ErrorCode::not_found, "'" + path + "' does not exist"};
  SH_ASSIGN_OR_RETURN(CheckpointMetadata m, metadata_from_json(*text, path));
  if (auto step = folder_step(checkpoint_dir); step && *step != m.step) {
    return Status{ErrorCode::corruption, "'" + path + "' holds step " + std::to_string(m.step) +
                                             ", but its folder is named for step " +
                                             std::to_string(*step)};
  }
  if (text_out != nullptr) *text_out = std::move(*text);
  return m;
}

Result<CheckpointMetadata> read_checkpoint_metadata(const std::string& checkpoint_dir,
                                                    const ObjectStoreOptions& store) {
  return read_checkpoint_metadata(*default_file_system(store), checkpoint_dir);
}

Result<CheckpointMetadata> read_checkpoint_metadata_part(FileSystem& fs,
                                                         const std::string& checkpoint_dir,
                                                         const StateDict& state,
                                                         std::vector<std::string>* saved_names) {
  SH_ASSIGN_OR_RETURN(auto index, shared_metadata_index(fs, metadata_path(checkpoint_dir), [&] {
                        return read_checkpoint_metadata(fs, checkpoint_dir);
                      }));
  if (saved_names != nullptr) {
    saved_names->clear();
    for (const auto& [name, tensor] : index->metadata().tensors)
      saved_names->push_back(name);
  }
  return index->part_for(state);
}

Result<std::string> read_trainer_state_text(FileSystem& fs, const std::string& checkpoint_dir,
                                            const CheckpointMetadata& m) {
  const std::string where = checkpoint_dir + "/" + kTrainerStateFile;
  SH_ASSIGN_OR_RETURN(auto text, read_named_small_file(fs, where));
  if (!m.trainer_state) {
    return Status{text ? ErrorCode::corruption : ErrorCode::not_found,
                  "'" + where + "' " + (text ? "is not" : "does not exist and is not") +
                      " recorded in '" + metadata_path(checkpoint_dir) + "'"};
  }
  if (!text)
    return Status{ErrorCode::corruption,
                  "'" + where + "' does not exist, but the metadata records it"};
  const FileMeta& expected = *m.trainer_state;
  const std::uint64_t hash = xxh3(text->data(), text->size());
  if (text->size() != expected.size || hash != expected.xxh3) {
    return Status{
        ErrorCode::corruption,
        "'" + where + "' was changed after it was saved: " + std::to_string(text->size()) +
            " bytes with XXH3 " + xxh3_hex(hash) + ", the metadata records " +
            std::to_string(expected.size) + " bytes with XXH3 " + xxh3_hex(expected.xxh3)};
  }
  // The step is the one field every trainer state has; the trainer reads the rest.
  auto j = nlohmann::json::parse(*text, nullptr, false);
  auto step = j.is_object() ? j.find("step") : j.end();
  if (step == j.end() || !step->is_number_integer() || step->get<std::int64_t>() != m.step) {
    return Status{ErrorCode::corruption,
                  "'" + where + "': field 'step' is " +
                      (step == j.end() ? std::string("missing") : step->dump()) +
                      ", not the checkpoint's step " + std::to_string(m.step)};
  }
  return std::move(*text);
}

Result<std::string> read_trainer_state_text(FileSystem& fs, const std::string& checkpoint_dir) {
  // Through the process's shared index: the load that follows a resume reads it from there.
  SH_ASSIGN_OR_RETURN(auto index, shared_metadata_index(fs, metadata_path(checkpoint_dir), [&] {
                        return read_checkpoint_metadata(fs, checkpoint_dir);
                      }));
  return read_trainer_state_text(fs, checkpoint_dir, index->metadata());
}

Result<std::unique_ptr<ReadableFile>> open_named_file(FileSystem& fs, const std::string& path) {
  auto file = fs.open_file(path);
  // Something else in a file's place (a folder, a FIFO) is the checkpoint's damage, as a
  // missing file is: not a caller's bad argument.
  if (!file.is_ok() && file.status().code() == ErrorCode::invalid_argument) {
    return Status{ErrorCode::corruption, file.status().message() + " (a file of the checkpoint)"};
  }
  return file;
}

Result<ParsedSafetensors> read_safetensors_header(ReadableFile& file, const std::string& path) {
  return parse_safetensors_header(
      [&file](std::uint64_t offset, void* dst, std::size_t bytes) {
        return file.read(offset, dst, bytes);
      },
      file.size(), path);
}

Result<const DataFile*> DataFiles::get(const std::string& name, std::uint64_t expected) {
  std::lock_guard lock(mutex_);
  auto it = open_.find(name);
  if (it != open_.end()) {
    if (it->second.file->size() != expected) {
      return Status{ErrorCode::corruption, "'" + it->second.path + "' has " + std::to_string(it->second.file->size()) +
                                               " bytes, the metadata says " + std::to_string(expected)};
    }
    return &it->second;
  }
  DataFile data{nullptr, folder_ + "/" + name, {}};
  SH_ASSIGN_OR_RETURN(data.file, open_named_file(fs_, data.path));
  if (data.file->size() != expected) {
    return Status{ErrorCode::corruption,
                  "'" + data.path + "' has " + std::to_string(data.file->size()) +
                      " bytes, the metadata says " + std::to_string(expected) + " (truncated?)"};
  }
  SH_ASSIGN_OR_RETURN(data.header, read_safetensors_header(*data.file, data.path));
  return &open_.emplace(name, std::move(data)).first->second;
}

}  // namespace stagehand
