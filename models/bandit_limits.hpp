#pragma once

#include "stagehand/config/config.hpp"
#include "stagehand/config/origins.hpp"
#include "stagehand/core/status.hpp"
#include "stagehand/models/collectives.hpp"

namespace stagehand {

// The reference workload's own limits on its config: what BanditMlp and BanditTask can run
// with, beyond the ranges of the `model:` keys (config/schema.hpp). Each error names the key
// blamed and where `origins` says it was given: a loaded config's Config::origins, or nothing for
// a config built in code.

/// model.hidden divides by parallel.tensor_parallel and model.batch_size by
/// parallel.data_parallel: each rank holds an equal block of the hidden layer and an equal share
/// of each step's contexts. BanditMlp::create checks it too.
/// @pre layout.tensor_parallel >= 1, layout.data_parallel >= 1
Status check_bandit_layout(const ModelConfig& model, const ParallelLayout& layout,
                           const ConfigOrigins& origins = {});

/// No matrix of the model, of a step (contexts, activations, logits, sampled actions) or of the
/// evaluation holds more than INT_MAX elements: matrix products take int sizes and leading
/// dimensions (OpenBLAS, cuBLAS), and the bound keeps each matrix below 8 GiB of floats.
/// @pre every `model:` key within its range (validate_config), so that no product overflows
Status check_bandit_sizes(const ModelConfig& model, const ConfigOrigins& origins = {});

/// The contexts a run trains on end before the evaluation contexts
/// (BanditTask::kEvalContextBase): step s trains on contexts [s * batch_size, (s + 1) *
/// batch_size), and a fully-async run also generates up to fully_async.max_staleness_steps
/// steps ahead.
/// @pre config.model.batch_size >= 1
Status check_bandit_steps(const Config& config);

/// Every limit above on `config`, placed by config.origins: what stagehand-train checks of a
/// loaded config before anything starts.
/// @pre validate_config(config) is ok, as it is for a loaded config
Status validate_bandit_config(const Config& config);

}  // namespace stagehand
