#pragma once

// trainer_state.json: what a trainer saves beside policy/ (its step, data cursor, RNG seed and
// the fully-async trainer's pending batches), and its one parser.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "stagehand/core/status.hpp"
#include "stagehand/storage/file_system.hpp"

namespace stagehand {

/// A batch the fully-async trainer had generated but not trained when it saved.
struct PendingBatch {
  std::int64_t step = 0;
  /// The weights version its actions were sampled with.
  std::int64_t version = 0;
  std::vector<std::int32_t> actions;
};

/// The fully-async trainer's part of the trainer state.
struct FullyAsyncState {
  std::int64_t max_staleness_steps = 0;
  std::int64_t num_generators = 0;
  std::int64_t next_generation_step = 0;
  std::int64_t max_staleness_seen = 0;
  std::vector<PendingBatch> pending_batches;
};

/// The parallel layout a checkpoint was saved with (it loads under any other one that divides
/// the model); recorded for `stagehand-ckpt inspect` and the resume message.
struct SavedLayout {
  std::int64_t tensor_parallel = 1;
  std::int64_t data_parallel = 1;
};

/// What a checkpoint's trainer_state.json holds.
struct TrainerState {
  std::int64_t step = 0;
  std::string kind;
  std::uint64_t seed = 0;
  /// Contexts consumed so far (the data cursor).
  std::int64_t data_cursor = 0;
  /// Only for the fully-async trainer.
  std::optional<FullyAsyncState> fully_async;
  /// Missing in checkpoints saved before it was recorded.
  std::optional<SavedLayout> layout;
};

std::string trainer_state_to_json(const TrainerState& state);

/// Parses the text of a trainer_state.json (`path` names it in errors). `step` is required and
/// non-negative; the other fields may be missing (then they keep their defaults), but a field of
/// the wrong type or out of range is an error naming the file and the field
/// (`fully_async.pending_batches[0].actions`). Never throws.
Result<TrainerState> trainer_state_from_json(const std::string& text, const std::string& path);

/// Reads `<checkpoint_dir>/trainer_state.json`, proven to belong to the checkpoint
/// (read_trainer_state_text), and parses it (trainer_state_from_json).
Result<TrainerState> read_trainer_state(FileSystem& fs, const std::string& checkpoint_dir);

}  // namespace stagehand
