#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "stagehand/core/status.hpp"
#include "stagehand/storage/file_system.hpp"
#include "stagehand/storage/object_store.hpp"

namespace stagehand {

/// Turns a user's path into a checkpoint folder: a `ckpt_path` root resolves through its
/// tracker, a `global_step_N` folder (with `policy/metadata.json`) is taken as it is, and so is a
/// Hugging Face safetensors folder (is_safetensors_folder). A `.tmp` folder, or a root whose
/// tracker names a step without metadata, is an error.
Result<std::string> resolve_checkpoint(FileSystem& fs, const std::string& path);
/// The same on default_file_system(store).
Result<std::string> resolve_checkpoint(
    const std::string& path,
    const ObjectStoreOptions& store = ObjectStoreOptions::from_environment());

/// Whether `dir` is a Hugging Face style safetensors folder rather than a Stagehand checkpoint:
/// it has no `policy/metadata.json`, and holds `model.safetensors.index.json` or
/// `model.safetensors`. load_checkpoint reads such a folder as a checkpoint whose tensors are
/// whole (one chunk each) and carry no checksums; it has no objects and no trainer state.
Result<bool> is_safetensors_folder(FileSystem& fs, const std::string& dir);

/// The step in the name of a checkpoint folder (`.../global_step_N`, `/` at the end allowed);
/// nullopt for a folder named otherwise (a copy a user renamed).
std::optional<std::int64_t> folder_step(std::string dir);

}  // namespace stagehand
