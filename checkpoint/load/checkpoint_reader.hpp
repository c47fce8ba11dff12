#pragma once

// Reading what a committed checkpoint folder holds besides its chunk bytes: metadata.json (whole
// or the part a rank needs), trainer_state.json, and its data files with their headers. Every
// read goes through a FileSystem.

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "stagehand/checkpoint/format/format.hpp"
#include "stagehand/core/sharded_tensor.hpp"
#include "stagehand/storage/file_system.hpp"
#include "stagehand/storage/object_store.hpp"

namespace stagehand {

/// Reads `policy/metadata.json` of a checkpoint folder: metadata_from_json, so its format,
/// version, fields, checksum and validate_metadata are checked, and a folder named
/// `global_step_N` must hold step N.
/// @param text when not null, set to the file's text as read (for a byte-exact copy of it).
Result<CheckpointMetadata> read_checkpoint_metadata(FileSystem& fs,
                                                    const std::string& checkpoint_dir,
                                                    std::string* text = nullptr);
/// The same on default_file_system(store).
Result<CheckpointMetadata> read_checkpoint_metadata(
    const std::string& checkpoint_dir,
    const ObjectStoreOptions& store = ObjectStoreOptions::from_environment());

/// The part of a checkpoint's metadata that a load of `state` reads: its tensors with only the
/// chunks that overlap its blocks, the files they are in, the objects it names
/// (MetadataIndex::part_for). `state` names tensors as the checkpoint does. The whole
/// metadata.json is read and checked as read_checkpoint_metadata does, but once per process and
/// version of the file (shared_metadata_index): the ranks of a process that load the same
/// checkpoint share that read, so that each rank's own cost grows with its part, not with the
/// number of ranks.
/// @param saved_names when not null, set to the name of every tensor of the checkpoint.
Result<CheckpointMetadata> read_checkpoint_metadata_part(
    FileSystem& fs, const std::string& checkpoint_dir, const StateDict& state,
    std::vector<std::string>* saved_names = nullptr);

/// Reads the trainer_state.json of a checkpoint folder whose metadata is `metadata`, proven to
/// be the one committed with it: recorded in metadata.json with its size and XXH3, its field
/// "step" equal to the metadata's step. not_found when the checkpoint was saved without one;
/// corruption otherwise.
Result<std::string> read_trainer_state_text(FileSystem& fs, const std::string& checkpoint_dir,
                                            const CheckpointMetadata& metadata);
/// The same, reading the metadata first (once per process: shared_metadata_index).
Result<std::string> read_trainer_state_text(FileSystem& fs, const std::string& checkpoint_dir);

/// Opens `path`, a file that a checkpoint names (a data file, metadata.json, its trainer state).
/// @return corruption when something other than a file is in its place (a folder, a FIFO):
///         damage of the checkpoint, as a missing file (not_found) is.
Result<std::unique_ptr<ReadableFile>> open_named_file(FileSystem& fs, const std::string& path);

/// The safetensors header of an opened file, which `path` names in errors.
Result<ParsedSafetensors> read_safetensors_header(ReadableFile& file, const std::string& path);

/// A data file opened for loading, with its parsed header.
struct DataFile {
  std::unique_ptr<ReadableFile> file;
  std::string path;
  ParsedSafetensors header;
};

/// Opens each data file of a checkpoint once, checking its size against the metadata and
/// parsing its header.
///
/// Thread-safety: get() may be called from any thread (the ranks of a process that load
/// together share one: LoadGroup); the DataFiles it hands out may be read from any thread.
class DataFiles {
 public:
  /// @param folder where the data files lie: `<checkpoint>/policy`, or a safetensors folder.
  DataFiles(FileSystem& fs, std::string folder) : fs_(fs), folder_(std::move(folder)) {}

  /// The file `name` of the folder, which the metadata says has `expected_size` bytes.
  Result<const DataFile*> get(const std::string& name, std::uint64_t expected_size);

  FileSystem& file_system() const { return fs_; }
  const std::string& folder() const { return folder_; }

 private:
  FileSystem& fs_;
  const std::string folder_;
  std::mutex mutex_;
  std::map<std::string, DataFile> open_;
};

}  // namespace stagehand
