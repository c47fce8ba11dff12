#pragma once

#include <string>

namespace stagehand {

/// Where a path points. Internal to storage/: everything above asks a FileSystem for its
/// capabilities instead of looking at the URL (default_file_system routes by it).
enum class DestinationKind { local, s3, gcs };

/// `s3://...` is s3; `gs://...` and `gcs://...` are gcs; anything else is a local path.
DestinationKind classify_destination(const std::string& ckpt_path);

inline bool is_cloud(const std::string& ckpt_path) {
  return classify_destination(ckpt_path) != DestinationKind::local;
}

}  // namespace stagehand
