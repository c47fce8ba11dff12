#pragma once

#include <cstdint>
#include <vector>

#include "stagehand/checkpoint/format/format.hpp"
#include "stagehand/checkpoint/save/report.hpp"
#include "stagehand/core/status.hpp"

namespace stagehand {

/// Gathers the metadata of a checkpoint from every rank's report, without copying the chunks
/// (the result points into `reports`, which must outlive it); no trainer state is recorded.
/// Fails when a rank failed, is missing or reported twice, or when chunks disagree or do not
/// cover their tensors.
Result<GatheredMetadata> gather_reports(std::int64_t step,
                                        const std::vector<RankSaveReport>& reports, int world_size);
/// Reports that die with the call would leave the result pointing nowhere.
Result<GatheredMetadata> gather_reports(std::int64_t step, std::vector<RankSaveReport>&& reports,
                                        int world_size) = delete;

}  // namespace stagehand
