#include "stagehand/storage/destination.hpp"

namespace stagehand {

DestinationKind classify_destination(const std::string& ckpt_path) {
  if (ckpt_path.rfind("s3://", 0) == 0) return DestinationKind::s3;
  if (ckpt_path.rfind("gs://", 0) == 0 || ckpt_path.rfind("gcs://", 0) == 0)
    return DestinationKind::gcs;
  return DestinationKind::local;
}

}  // namespace stagehand
