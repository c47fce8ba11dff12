#include "stagehand/config/storage_options.hpp"

namespace stagehand {

ObjectStoreOptions object_store_options(const S3Config& config) {
  ObjectStoreOptions o = ObjectStoreOptions::from_environment();
  if (!config.endpoint.empty()) o.endpoint = config.endpoint;
  if (!config.region.empty()) o.region = config.region;
  o.path_style = config.path_style;
  o.max_attempts = static_cast<int>(config.max_attempts);
  o.multipart_threshold = static_cast<std::uint64_t>(config.multipart_threshold_mib) << 20;
  o.part_size = static_cast<std::uint64_t>(config.part_size_mib) << 20;
  o.upload_threads = static_cast<int>(config.upload_threads);
  return o;
}

}  // namespace stagehand
