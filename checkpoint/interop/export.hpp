#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "stagehand/core/dtype.hpp"
#include "stagehand/core/progress.hpp"
#include "stagehand/core/status.hpp"
#include "stagehand/storage/file_system.hpp"

namespace stagehand {

/// What export_checkpoint writes.
struct ExportOptions {
  enum class What {
    /// Tensors whose names start with `model.`.
    model,
    /// Every tensor, optimizer state included, under its full name.
    all,
  };
  What what = What::model;
  /// Floating point tensors are converted to this dtype (convert_elements); nullopt keeps the
  /// dtype they were saved with. Other tensors (integers, BOOL) always keep theirs.
  std::optional<DType> dtype;
  /// A file holds tensors of at most this many bytes together; a larger tensor gets a file of
  /// its own. At least 1.
  std::uint64_t max_shard_bytes = 5ull << 30;
  /// Reads in flight at once (LoadOptions::thread_count).
  int thread_count = 4;
  /// Asked before each batch of tensors: true (the run is stopping) stops the export, which
  /// fails as aborted and leaves no output (its temporary folder is removed). Empty: never.
  std::function<bool()> should_stop;
  /// Hears phase "export" with the tensor bytes written of their total, after each tensor.
  /// Empty: nothing is reported.
  ProgressFn progress;
};

/// What one export did.
struct ExportReport {
  std::uint64_t tensors = 0;
  /// Tensor bytes written (after conversion; headers not included).
  std::uint64_t bytes = 0;
  std::uint64_t files = 0;
  /// Bytes of the largest tensor as saved.
  std::uint64_t largest_tensor_bytes = 0;
  /// Host memory the export held at once at most: assembled tensors, the conversion buffer
  /// and the loader's read buffers.
  std::uint64_t buffer_peak_bytes = 0;
  double total_s = 0;
  /// Names of the files written in the output folder, the index included.
  std::vector<std::string> files_written;
};

/// Writes the tensors of a checkpoint as consolidated full tensors with their plain names, in
/// the Hugging Face layout: `model.safetensors` when they fit in `max_shard_bytes`, else
/// `model-00001-of-0000N.safetensors`... and `model.safetensors.index.json`
/// (`{"metadata": {"total_size": N}, "weight_map": {name: file}}`). Each file's tensors are
/// sorted by name, its `__metadata__` is `{"format": "pt"}`.
///
/// `checkpoint` is a `ckpt_path` root (resolved through its tracker) or a `global_step_N`
/// folder on `fs`, local or in an object store. Tensors are read a few
/// at a time through load_checkpoint, which verifies every chunk's XXH3; the tensors held at
/// once add up to at most the largest tensor's size (or 64 MiB, when that is more), so host
/// memory stays near the largest tensor plus a few buffers, whatever the model's size.
///
/// Everything is written into a folder beside `out_dir`, `.<name>.export-<pid>.tmp`, that is
/// renamed to `out_dir` once every file is written and fsynced; such folders left by exports
/// that were killed (their process is gone) are removed first.
/// @pre `out_dir` is a folder path on a store with renames (not an object store) that does not
///      exist or is an empty folder.
/// @post on an error nothing is left at `out_dir` (an empty folder that was there stays) and the
///       temporary folder is removed; the checkpoint is never modified.
/// @param report when not null, filled (also on error, with what was done).
Status export_checkpoint(FileSystem& fs, const std::string& checkpoint, const std::string& out_dir,
                         const ExportOptions& options, ExportReport* report = nullptr);

/// Parses a size as Hugging Face's `max_shard_size` does: plain bytes ("1048576"), or a number
/// with a decimal unit (KB, MB, GB, TB: powers of 1000) or a binary one (KiB, MiB, GiB, TiB:
/// powers of 1024), case-insensitively ("5GB", "500MB", "2GiB", "1.5gb"). At least 1 byte.
/// invalid_argument naming the text otherwise.
Result<std::uint64_t> parse_byte_size(const std::string& text);

}  // namespace stagehand
