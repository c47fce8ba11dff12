#pragma once

#include <cstdint>

#include "stagehand/config/config.hpp"
#include "stagehand/config/origins.hpp"
#include "stagehand/core/status.hpp"

namespace stagehand {

/// The bound of the staging ring: megatron_config.ckpt_save_thread_count within its range (the
/// buckets per rank, at least 1), and megatron_config.ckpt_save_staging_buckets between 0 (no
/// bound) and that many buckets. The loader checks it, and so does SaveEngine::create for
/// options set in code: one rule, with the keys' names in its errors.
/// @param origins where the two keys were given, for a loaded config; empty for values set in
///        code.
Status check_save_buckets(std::int64_t thread_count, std::int64_t staging_buckets,
                          const ConfigOrigins& origins = {});

/// Checks every key of `config` against its range (schema.hpp) and every rule that spans
/// several keys: the staging ring (check_save_buckets), the world size, the multipart part size,
/// resume_mode from_path and the periodic exports. The loaders apply it to what they read, so a
/// loaded config passes it; call it for a Config built in code. Errors name the key blamed and
/// where config.origins says it was given. The reference model's own limits are its own
/// (models/bandit_limits.hpp).
Status validate_config(const Config& config);

}  // namespace stagehand
