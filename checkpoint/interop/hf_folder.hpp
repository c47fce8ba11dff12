#pragma once

#include <string>

#include "stagehand/checkpoint/format/format.hpp"
#include "stagehand/storage/file_system.hpp"

namespace stagehand {

/// A Hugging Face safetensors folder (`model.safetensors`, or the shards its
/// `model.safetensors.index.json` names) as checkpoint metadata: every tensor one whole chunk,
/// without checksums (the format has none), step 0, no objects and no trainer state. The
/// headers are checked as a checkpoint's are; an index that names a file or tensor the folder
/// does not hold is corruption naming it.
Result<CheckpointMetadata> read_safetensors_folder(FileSystem& fs, const std::string& dir);

}  // namespace stagehand
