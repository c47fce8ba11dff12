#include "stagehand/storage/destination.hpp"

namespace stagehand {

DestinationKind classify_destination(const std::string& ckpt_path) {
  if (ckpt_path.rfind("s3://", 0) == 0) return DestinationKind::s3;
  if (ckpt_path.rfind("gs://", 0) == 0 || ckpt_path.rfind("gcs://", 0) == 0) return DestinationKind::gcs;
  return DestinationKind::local;
}

std::string local_staging_root(const std::string& ckpt_path, const std::string& local_work_dir) {
  if (!is_cloud(ckpt_path)) return ckpt_path;
  auto scheme_end = ckpt_path.find("://");
  std::string scheme = ckpt_path.substr(0, scheme_end);
  std::string rest = ckpt_path.substr(scheme_end + 3);
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  return local_work_dir + "/" + scheme + "/" + rest;
}

}  // namespace stagehand
