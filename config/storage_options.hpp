#pragma once

#include "stagehand/config/config.hpp"
#include "stagehand/storage/object_store.hpp"

namespace stagehand {

/// ObjectStoreOptions::from_environment(), with the `storage.s3` keys taking precedence where
/// they are set.
ObjectStoreOptions object_store_options(const S3Config& config);

}  // namespace stagehand
