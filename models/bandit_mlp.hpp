#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "stagehand/actors/model.hpp"
#include "stagehand/config/config.hpp"
#include "stagehand/models/bandit_task.hpp"
#include "stagehand/models/collectives.hpp"
#include "stagehand/models/gemm.hpp"
#include "stagehand/models/weight_store.hpp"

namespace stagehand {

/// The reference workload: an MLP policy (context -> hidden ReLU -> one logit per arm) on a seeded
/// contextual bandit whose rewarding arm is argmax(M c) for a hidden matrix M. Its state looks
/// like a Megatron model's: the first layer column-parallel and the second row-parallel across
/// tensor-parallel ranks, bf16 model weights replicated across data-parallel ranks, fp32 main
/// weights and Adam moments sharded across data-parallel ranks (a distributed optimizer; each
/// rank holds whole rows of its block, saved under the parameter's global shape, so that a
/// checkpoint loads under any layout), a per-rank RNG position and a scheduler step. Matrix products run on the rank's GPU with cuBLAS
/// when one is visible, otherwise on the host with OpenBLAS; the state itself is in host memory.
class BanditMlp final : public Model {
 public:
  /// Refuses a `config` whose hidden width or batch the layout does not divide
  /// (check_bandit_layout). A loaded config's other limits are validate_bandit_config's.
  /// @param weights where export_weights() publishes for generators (may be null).
  static Result<std::unique_ptr<BanditMlp>> create(const ModelConfig& config, std::uint64_t seed,
                                                   const ParallelLayout& layout, int rank, RankGroups groups,
                                                   std::shared_ptr<WeightStore> weights = nullptr);

  ~BanditMlp() override;

  std::shared_ptr<StateDict> state() override { return state_; }
  Result<StepMetrics> train_step(std::int64_t step, Objective objective,
                                 const std::vector<std::int32_t>& behaviour_actions) override;
  /// Fences right before its Adam update: a save stages while the forward and backward passes run.
  bool fences_itself() const override { return true; }
  Status export_weights(std::int64_t version) override;
  Result<double> evaluate() override;
  /// Without the optimizer (trainer.load_optimizer false, init_from), the fp32 main weights are
  /// filled from the saved weights and the moments and step start at zero.
  LoadOptions load_selection(const LoadScope& scope) override;
  Status on_loaded(const LoadScope& scope, const LoadReport& report) override;

  /// The whole policy as a generator receives it through weight sync: the bf16 model weights
  /// ("model.fc1.weight", ...), each in its global shape, as one rank's blocks.
  static std::vector<ShardedTensorDesc> policy_blocks(const ModelConfig& config);
  /// The f32 weights of `received` (policy_blocks' tensors, filled), as version `version`.
  /// Errors: a tensor missing or not bf16 in host memory, naming it.
  static Result<PolicyWeights> policy_from(const StateDict& received, std::int64_t version);

  /// Optimizer steps taken so far.
  std::int64_t optimizer_step() const { return optimizer_step_; }

 private:
  struct Param;
  struct Activations;

  BanditMlp(const ModelConfig& config, std::uint64_t seed, const ParallelLayout& layout, int rank,
            RankGroups groups);
  Status build_state();
  Status forward(const std::vector<float>& x, std::size_t n, Activations& a);
  Status backward(const std::vector<float>& x, std::size_t n, const Activations& a, const std::vector<float>& dlogits);
  Status adam_update();
  void refresh_objects();

  ModelConfig config_;
  std::uint64_t seed_;
  ParallelLayout layout_;
  int rank_;
  int tp_;
  int dp_;
  RankGroups groups_;
  std::int64_t hidden_local_;
  BanditTask task_;
  std::shared_ptr<WeightStore> weights_;
  std::unique_ptr<Gemm> gemm_;
  std::vector<std::unique_ptr<Param>> params_;
  std::shared_ptr<StateDict> state_;
  std::int64_t optimizer_step_ = 0;
};

}  // namespace stagehand
