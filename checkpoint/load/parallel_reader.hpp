#pragma once

#include <vector>

#include "stagehand/checkpoint/load/load_plan.hpp"
#include "stagehand/checkpoint/load/loader.hpp"
#include "stagehand/core/sharded_tensor.hpp"

namespace stagehand {

/// Runs the reads `tasks` of `jobs` on `options.thread_count` threads (the first error stops
/// the rest): a direct task is read straight into its tensors' memory, a buffered one through a
/// bounded host buffer per thread (pinned when `pinned`) and copied into its blocks, converted
/// to the live dtype where it differs. A job's `copies` get the chunk's bytes as they pass (a
/// buffered one) or, once it is read and verified, from the first block's memory (a direct one). Each read is hashed right after it lands, and with
/// `verify` every chunk's XXH3 is checked. Each task is read in reads of at most `read_bytes`
/// (options.max_read_bytes, or less where reads are cheap). Adds the reads' figures to `report`.
/// @pre the jobs' chunks tile the blocks they fill (no two write one element).
Status read_chunks(const std::vector<ChunkJob>& jobs, std::vector<ReadTask> tasks, const LoadOptions& options,
                   std::uint64_t read_bytes, bool pinned, bool verify, LoadReport& report);

}  // namespace stagehand
