#pragma once

#include <string>

namespace stagehand {

/// Where a `ckpt_path` points.
enum class DestinationKind { local, s3, gcs };

/// `s3://...` is s3; `gs://...` and `gcs://...` are gcs; anything else is a local path.
DestinationKind classify_destination(const std::string& ckpt_path);

inline bool is_cloud(const std::string& ckpt_path) {
  return classify_destination(ckpt_path) != DestinationKind::local;
}

/// The local folder that stands in for a cloud `ckpt_path` while its files are written:
/// `<local_work_dir>/<scheme>/<bucket>/<prefix>`. Local paths map to themselves.
std::string local_staging_root(const std::string& ckpt_path, const std::string& local_work_dir);

}  // namespace stagehand
