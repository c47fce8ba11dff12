#pragma once

#include <cstdint>
#include <vector>

#include "stagehand/models/weight_store.hpp"

namespace stagehand {

/// Counter-based randomness: the same (seed, stream, index) always gives the same number, so a
/// rank's RNG state is a position, and resuming reproduces every draw.
double uniform01(std::uint64_t seed, std::uint64_t stream, std::uint64_t index);
double gaussian(std::uint64_t seed, std::uint64_t stream, std::uint64_t index);

/// Random streams of the workload.
enum BanditStream : std::uint64_t { kRuleStream = 1, kContextStream = 2, kInitStream = 3, kSampleStream = 4 };

/// The seeded contextual bandit: contexts are standard normal vectors, numbered; the rewarding
/// arm of a context c is argmax(M c) for a hidden matrix M drawn from the seed.
class BanditTask {
 public:
  BanditTask(std::uint64_t seed, std::int64_t context_dim, std::int64_t num_arms);

  /// Held-out contexts are numbered from here on; training contexts below it.
  static constexpr std::uint64_t kEvalContextBase = 1ULL << 40;

  std::uint64_t seed() const { return seed_; }
  std::int64_t context_dim() const { return context_dim_; }
  std::int64_t num_arms() const { return num_arms_; }

  /// Contexts [first_id, first_id + n), row-major [n, context_dim].
  std::vector<float> contexts(std::uint64_t first_id, std::size_t n) const;
  int best_arm(const float* context) const;
  /// Action j of the group of context `context_id`, drawn from `probs`.
  std::size_t sample_action(const std::vector<double>& probs, std::uint64_t context_id, std::size_t j,
                            std::size_t group_size) const;

 private:
  std::uint64_t seed_;
  std::int64_t context_dim_;
  std::int64_t num_arms_;
  std::vector<float> rule_;
};

/// Softmax of one row of logits, in double.
void softmax_row(const float* logits, std::size_t k, std::vector<double>& probs);

/// What a generator does: for contexts [first_id, first_id + n), samples `group_size` actions
/// each from the policy with `weights`. Row i holds context i's group.
std::vector<std::int32_t> generate_actions(const BanditTask& task, const PolicyWeights& weights,
                                           std::int64_t group_size, std::uint64_t first_id, std::size_t n);

}  // namespace stagehand
