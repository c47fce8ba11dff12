#include "stagehand/checkpoint/load/resolve.hpp"

#include "stagehand/checkpoint/store/checkpoint_store.hpp"
#include "stagehand/checkpoint/format/format.hpp"
#include "stagehand/storage/default_file_system.hpp"

namespace stagehand {

namespace {

std::string metadata_of(const std::string& dir) {
  return CheckpointLayout::policy_dir(dir) + "/" + kMetadataFile;
}

std::string without_trailing_slash(std::string path) {
  while (path.size() > 1 && path.back() == '/')
    path.pop_back();
  return path;
}

}  // namespace

std::optional<std::int64_t> folder_step(std::string dir) {
  dir = without_trailing_slash(std::move(dir));
  return parse_step_dir_name(dir.substr(dir.find_last_of('/') + 1), false);
}

Result<bool> is_safetensors_folder(FileSystem& fs, const std::string& dir) {
  SH_ASSIGN_OR_RETURN(bool stagehand, file_exists(fs, metadata_of(dir)));
  if (stagehand) return false;
  SH_ASSIGN_OR_RETURN(bool index, file_exists(fs, dir + "/" + kHfIndexFile));
  if (index) return true;
  return file_exists(fs, dir + "/" + kHfSingleFile);
}

Result<std::string> resolve_checkpoint(FileSystem& fs, const std::string& path) {
  const std::string dir = without_trailing_slash(path);
  if (dir.ends_with(".tmp")) {
    return Status{ErrorCode::invalid_argument,
                  "'" + path + "' is an uncommitted checkpoint being written (.tmp)"};
  }
  SH_ASSIGN_OR_RETURN(bool committed, file_exists(fs, metadata_of(dir)));
  if (committed) return dir;
  SH_ASSIGN_OR_RETURN(bool safetensors, is_safetensors_folder(fs, dir));
  if (safetensors) return dir;
  SH_ASSIGN_OR_RETURN(auto step, read_tracker(fs, dir));
  if (!step) {
    SH_ASSIGN_OR_RETURN(bool is_dir, fs.is_dir(dir));
    if (!is_dir && fs.capabilities(dir).directories) {
      return Status{ErrorCode::not_found, "checkpoint path '" + path + "' is not a folder"};
    }
    return Status{ErrorCode::not_found,
                  "'" + path + "' holds neither a committed checkpoint nor a " + kTrackerFile};
  }
  const std::string step_dir = CheckpointLayout{dir}.step_dir(*step);
  SH_ASSIGN_OR_RETURN(bool tracked_committed, file_exists(fs, metadata_of(step_dir)));
  if (!tracked_committed) {
    return Status{ErrorCode::corruption, "the tracker in '" + path + "' names step " +
                                             std::to_string(*step) + ", but '" + step_dir +
                                             "' is not a committed checkpoint"};
  }
  return step_dir;
}

Result<std::string> resolve_checkpoint(const std::string& path, const ObjectStoreOptions& store) {
  return resolve_checkpoint(*default_file_system(store), path);
}

}  // namespace stagehand
