#include "stagehand/models/bandit_limits.hpp"

#include <climits>
#include <cstdint>
#include <string>
#include <vector>

#include "stagehand/models/bandit_task.hpp"

namespace stagehand {

namespace {

/// Matrix products take int sizes and leading dimensions (OpenBLAS, cuBLAS).
constexpr std::int64_t kMaxMatrixElements = INT_MAX;

/// A matrix as the product of two keys; the first key is the one blamed.
struct Matrix {
  const char* name;
  const char* first_key;
  std::int64_t first;
  const char* second_key;
  std::int64_t second;
};

}  // namespace

Status check_bandit_layout(const ModelConfig& model, const ParallelLayout& layout,
                           const ConfigOrigins& origins) {
  if (model.hidden % layout.tensor_parallel != 0) {
    return origins.error({"model.hidden", "parallel.tensor_parallel"},
                         "must be divisible by parallel.tensor_parallel (" +
                             std::to_string(layout.tensor_parallel) + "), got " +
                             std::to_string(model.hidden));
  }
  if (model.batch_size % layout.data_parallel != 0) {
    return origins.error({"model.batch_size", "parallel.data_parallel"},
                         "must be divisible by parallel.data_parallel (" +
                             std::to_string(layout.data_parallel) + "), got " +
                             std::to_string(model.batch_size));
  }
  return Status::ok();
}

Status check_bandit_sizes(const ModelConfig& model, const ConfigOrigins& origins) {
  const ModelConfig& m = model;  // short, for the table
  const Matrix matrices[] = {
      {"model.fc1.weight", "model.hidden", m.hidden, "model.context_dim", m.context_dim},
      {"model.fc2.weight", "model.hidden", m.hidden, "model.num_arms", m.num_arms},
      {"the bandit's rule", "model.num_arms", m.num_arms, "model.context_dim", m.context_dim},
      {"a step's contexts", "model.batch_size", m.batch_size, "model.context_dim", m.context_dim},
      {"a step's activations", "model.batch_size", m.batch_size, "model.hidden", m.hidden},
      {"a step's logits", "model.batch_size", m.batch_size, "model.num_arms", m.num_arms},
      {"a step's sampled actions", "model.batch_size", m.batch_size, "model.group_size",
       m.group_size},
      {"the evaluation's contexts", "model.eval_contexts", m.eval_contexts, "model.context_dim",
       m.context_dim},
      {"the evaluation's activations", "model.eval_contexts", m.eval_contexts, "model.hidden",
       m.hidden},
      {"the evaluation's logits", "model.eval_contexts", m.eval_contexts, "model.num_arms",
       m.num_arms},
  };
  for (const Matrix& x : matrices) {
    const std::int64_t elements = x.first * x.second;
    if (elements > kMaxMatrixElements) {
      return origins.error({x.first_key, x.second_key},
                           std::string(x.first_key) + " x " + x.second_key + " = " +
                               std::to_string(x.first) + " x " + std::to_string(x.second) + " = " +
                               std::to_string(elements) + " elements in " + x.name +
                               ", more than the " + std::to_string(kMaxMatrixElements) +
                               " (2^31 - 1) that one matrix may hold");
    }
  }
  return Status::ok();
}

Status check_bandit_steps(const Config& config) {
  constexpr auto kEvalContextBase = static_cast<std::int64_t>(BanditTask::kEvalContextBase);
  // A fully-async checkpoint also holds the batches generated ahead, up to
  // max_staleness_steps past the step it saves.
  const bool generates_ahead = config.trainer.kind == TrainerKind::fully_async;
  const std::int64_t ahead = generates_ahead ? config.fully_async.max_staleness_steps : 0;
  const std::int64_t batch_size = config.model.batch_size;
  const std::int64_t max_steps = kEvalContextBase / batch_size - 1 - ahead;
  if (config.trainer.total_steps <= max_steps) return Status::ok();
  std::vector<std::string> keys{"trainer.total_steps", "model.batch_size"};
  std::string given = "model.batch_size " + std::to_string(batch_size);
  if (generates_ahead) {
    keys.emplace_back("fully_async.max_staleness_steps");
    given += " and fully_async.max_staleness_steps " + std::to_string(ahead);
  }
  return config.origins.error(
      keys, "must be at most " + std::to_string(max_steps) + " with " + given +
                ": the contexts a run trains on must end before the evaluation contexts, which "
                "begin at context " +
                std::to_string(kEvalContextBase) + " (2^40); got " +
                std::to_string(config.trainer.total_steps));
}

Status validate_bandit_config(const Config& config) {
  const ParallelLayout layout{static_cast<int>(config.parallel.tensor_parallel),
                              static_cast<int>(config.parallel.data_parallel)};
  SH_RETURN_IF_ERROR(check_bandit_layout(config.model, layout, config.origins));
  SH_RETURN_IF_ERROR(check_bandit_sizes(config.model, config.origins));
  return check_bandit_steps(config);
}

}  // namespace stagehand
