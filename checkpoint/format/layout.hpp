#pragma once

#include <cstdint>
#include <string>

namespace stagehand {

// -- file names --

/// In a checkpoint root: the step of the newest committed checkpoint.
inline constexpr const char* kTrackerFile = "latest_ckpt_global_step.txt";
/// In a checkpoint folder: the folder of the data files and metadata.json.
inline constexpr const char* kPolicyDir = "policy";
/// In the policy folder: what the checkpoint holds and where (written last).
inline constexpr const char* kMetadataFile = "metadata.json";
/// In a checkpoint folder, beside policy/: the step, data cursor and RNG of the trainer.
inline constexpr const char* kTrainerStateFile = "trainer_state.json";
/// A Hugging Face safetensors folder's one file, when everything fits in one.
inline constexpr const char* kHfSingleFile = "model.safetensors";
/// The index of a Hugging Face folder sharded into several files.
inline constexpr const char* kHfIndexFile = "model.safetensors.index.json";

// -- folders --

/// Paths of one checkpoint root (`ckpt_path`).
struct CheckpointLayout {
  std::string root;

  /// "<root>/global_step_<step>": a committed checkpoint.
  std::string step_dir(std::int64_t step) const;
  /// step_dir(step) + ".tmp": the checkpoint while it is written.
  std::string tmp_dir(std::int64_t step) const;
  /// "<root>/" + kTrackerFile.
  std::string tracker() const;
  /// "<checkpoint_dir>/" + kPolicyDir.
  static std::string policy_dir(const std::string& checkpoint_dir);
  /// "__<rank>_<bucket>.safetensors".
  static std::string bucket_file_name(int rank, int bucket);
};

/// Whether `name` names a file inside a folder: not empty, ".", "..", and free of '/' and NUL.
bool is_plain_file_name(const std::string& name);

}  // namespace stagehand
