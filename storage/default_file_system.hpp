#pragma once

#include <memory>

#include "stagehand/storage/file_system.hpp"
#include "stagehand/storage/object_store.hpp"

namespace stagehand {

/// The file system of every `s3://` and `gs://` URL, over the object-store client: a file
/// written is spooled under `options.spool_dir` and uploaded whole when synced (multipart when
/// large); reads are ranged GETs; folders are key prefixes; there is no rename and no lock
/// (capabilities() says so).
std::shared_ptr<FileSystem> object_store_file_system(ObjectStoreOptions options);

/// Local paths on local_file_system(), object-store URLs on object_store_file_system(options):
/// the one place that tells a path from a URL.
std::shared_ptr<FileSystem> default_file_system(
    const ObjectStoreOptions& options = ObjectStoreOptions::from_environment());

}  // namespace stagehand
