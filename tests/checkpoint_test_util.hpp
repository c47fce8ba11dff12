#pragma once

// Shorthands for tests that look at a local checkpoint root: the CheckpointStore's answers on
// the local file system.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "stagehand/checkpoint/store/checkpoint_store.hpp"
#include "stagehand/checkpoint/format/format.hpp"
#include "stagehand/checkpoint/metadata/gather.hpp"
#include "stagehand/storage/file_system.hpp"

namespace stagehand::test {

inline CheckpointStore local_store(const std::string& root) {
  return CheckpointStore(local_file_system(), root);
}

/// The step the tracker of `root` names.
inline Result<std::optional<std::int64_t>> read_tracker(const std::string& root) {
  return stagehand::read_tracker(*local_file_system(), root);
}

/// The committed steps of `root`, ascending; none when it cannot be listed.
inline std::vector<std::int64_t> committed_steps(const std::string& root) {
  auto steps = local_store(root).committed_steps();
  return steps.is_ok() ? *steps : std::vector<std::int64_t>{};
}

/// CheckpointStore::clean_interrupted of `root`.
inline Result<int> clean_stale_tmp_dirs(const std::string& root) {
  return local_store(root).clean_interrupted();
}

/// Prepares step `step` of `root`; the step's write folder (policy/ below it).
inline Result<std::string> prepare_checkpoint_dir(const std::string& root, std::int64_t step) {
  SH_RETURN_IF_ERROR(local_store(root).prepare(step).status());
  return local_store(root).write_dir(step);
}

/// Gathers `reports` and commits step `step` of `root`, recording the trainer_state.json that
/// lies in its write folder (as the coordinator records the one it wrote).
/// @param saved the state each rank's report is of (`saved[r]` rank r's), as its engine saved it
/// @param fs what the commit writes through (the local file system by default).
inline Status commit_checkpoint(const std::string& root, std::int64_t step,
                                const std::vector<RankSaveReport>& reports, int world_size,
                                const std::vector<const StateDict*>& saved,
                                std::shared_ptr<FileSystem> fs = local_file_system()) {
  const CheckpointStore store(std::move(fs), root);
  auto metadata = gather_reports(step, reports, world_size, descriptors_of_states(saved));
  if (!metadata.is_ok()) {
    (void)store.abort(step);
    return metadata.status();
  }
  auto state =
      read_small_file(*local_file_system(), store.write_dir(step) + "/" + kTrainerStateFile);
  if (state.is_ok() && *state)
    metadata->trainer_state = FileMeta{(*state)->size(), xxh3((*state)->data(), (*state)->size())};
  return store.commit(step, *metadata).status();
}

/// The size and XXH3 of `<checkpoint_dir>/trainer_state.json`; none when there is none.
inline Result<std::optional<FileMeta>> trainer_state_meta(const std::string& checkpoint_dir) {
  SH_ASSIGN_OR_RETURN(
      auto text, read_small_file(*local_file_system(), checkpoint_dir + "/" + kTrainerStateFile));
  if (!text) return std::optional<FileMeta>{};
  return std::optional<FileMeta>{FileMeta{text->size(), xxh3(text->data(), text->size())}};
}

}  // namespace stagehand::test
