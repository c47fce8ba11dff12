#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "stagehand/checkpoint/format/format.hpp"
#include "stagehand/checkpoint/save/report.hpp"
#include "stagehand/core/status.hpp"

namespace stagehand {

/// The descriptor of the tensor a chunk record names (ChunkRecord::tensor, an index into the
/// tensors rank `rank` saved: its local plan's order); null when the rank has no such tensor.
/// What it points at must outlive the gathered metadata.
using DescriptorOf = std::function<const ShardedTensorDesc*(int rank, std::uint32_t tensor)>;

/// A DescriptorOf over each rank's descriptors (`by_rank[r]` rank r's; they must outlive it).
DescriptorOf descriptors_by_rank(std::vector<const std::vector<ShardedTensorDesc>*> by_rank);
/// A DescriptorOf over the states the ranks saved (`by_rank[r]` rank r's; they must outlive it).
DescriptorOf descriptors_of_states(std::vector<const StateDict*> by_rank);

/// Gathers the metadata of a checkpoint from every rank's report, without copying the chunks
/// or their descriptors (the result points into `reports` and where `descriptor_of` does, which
/// must outlive it); no trainer state is recorded. Fails when a rank failed, is missing or
/// reported twice, or when chunks name no tensor of their rank, disagree or do not cover their
/// tensors.
Result<GatheredMetadata> gather_reports(std::int64_t step, const std::vector<RankSaveReport>& reports,
                                        int world_size, const DescriptorOf& descriptor_of);
/// Reports that die with the call would leave the result pointing nowhere.
Result<GatheredMetadata> gather_reports(std::int64_t step, std::vector<RankSaveReport>&& reports, int world_size,
                                        const DescriptorOf& descriptor_of) = delete;

}  // namespace stagehand
