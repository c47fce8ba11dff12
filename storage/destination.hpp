#pragma once

#include <string>

namespace stagehand {

/// Where a path points. Internal to storage/ and to config's rules (which refuse an object
/// store where a setting needs a local folder before any file system exists): everything else
/// asks a FileSystem for its capabilities instead of looking at the URL (default_file_system
/// routes by it).
enum class DestinationKind { local, s3, gcs };

/// `s3://...` is s3; `gs://...` and `gcs://...` are gcs; anything else is a local path.
DestinationKind classify_destination(const std::string& ckpt_path);

inline bool is_cloud(const std::string& ckpt_path) {
  return classify_destination(ckpt_path) != DestinationKind::local;
}

}  // namespace stagehand
