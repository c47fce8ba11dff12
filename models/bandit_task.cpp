#include "stagehand/models/bandit_task.hpp"

#include <algorithm>
#include <cmath>

#include "stagehand/core/random.hpp"

namespace stagehand {

double uniform01(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  std::uint64_t bits = splitmix64(splitmix64(seed ^ (stream * 0xd1b54a32d192ed03ULL)) + index);
  return (static_cast<double>(bits >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

double gaussian(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  double u1 = uniform01(seed, stream, 2 * index);
  double u2 = uniform01(seed, stream, 2 * index + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

BanditTask::BanditTask(std::uint64_t seed, std::int64_t context_dim, std::int64_t num_arms)
    : seed_(seed), context_dim_(context_dim), num_arms_(num_arms) {
  rule_.resize(static_cast<std::size_t>(num_arms * context_dim));
  for (std::size_t i = 0; i < rule_.size(); ++i) rule_[i] = static_cast<float>(gaussian(seed_, kRuleStream, i));
}

std::vector<float> BanditTask::contexts(std::uint64_t first_id, std::size_t n) const {
  const auto d = static_cast<std::size_t>(context_dim_);
  std::vector<float> x(n * d);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = 0; j < d; ++j) {
      x[i * d + j] = static_cast<float>(gaussian(seed_, kContextStream, (first_id + i) * d + j));
    }
  }
  return x;
}

int BanditTask::best_arm(const float* context) const {
  const auto d = static_cast<std::size_t>(context_dim_);
  int best = 0;
  double best_score = -1e300;
  for (std::int64_t k = 0; k < num_arms_; ++k) {
    double score = 0;
    for (std::size_t j = 0; j < d; ++j) score += double(rule_[static_cast<std::size_t>(k) * d + j]) * context[j];
    if (score > best_score) {
      best_score = score;
      best = static_cast<int>(k);
    }
  }
  return best;
}

std::size_t BanditTask::sample_action(const std::vector<double>& probs, std::uint64_t context_id, std::size_t j,
                                      std::size_t group_size) const {
  double u = uniform01(seed_, kSampleStream, context_id * group_size + j);
  for (std::size_t k = 0; k < probs.size(); ++k) {
    u -= probs[k];
    if (u <= 0) return k;
  }
  return probs.size() - 1;
}

void softmax_row(const float* logits, std::size_t k, std::vector<double>& probs) {
  probs.resize(k);
  double max = *std::max_element(logits, logits + k);
  double sum = 0;
  for (std::size_t i = 0; i < k; ++i) sum += probs[i] = std::exp(static_cast<double>(logits[i]) - max);
  for (auto& v : probs) v /= sum;
}

std::vector<std::int32_t> generate_actions(const BanditTask& task, const PolicyWeights& w, std::int64_t group_size,
                                           std::uint64_t first_id, std::size_t n) {
  const auto D = static_cast<std::size_t>(task.context_dim());
  const auto K = static_cast<std::size_t>(task.num_arms());
  const std::size_t H = w.fc1_bias.size();
  const auto G = static_cast<std::size_t>(group_size);
  std::vector<float> x = task.contexts(first_id, n);
  std::vector<std::int32_t> actions(n * G);
  std::vector<float> hidden(H);
  std::vector<float> logits(K);
  std::vector<double> probs;
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t h = 0; h < H; ++h) {
      float v = w.fc1_bias[h];
      for (std::size_t j = 0; j < D; ++j) v += w.fc1_weight[h * D + j] * x[i * D + j];
      hidden[h] = v > 0 ? v : 0;
    }
    for (std::size_t k = 0; k < K; ++k) {
      float v = w.fc2_bias[k];
      for (std::size_t h = 0; h < H; ++h) v += w.fc2_weight[k * H + h] * hidden[h];
      logits[k] = v;
    }
    softmax_row(logits.data(), K, probs);
    for (std::size_t j = 0; j < G; ++j) {
      actions[i * G + j] = static_cast<std::int32_t>(task.sample_action(probs, first_id + i, j, G));
    }
  }
  return actions;
}

}  // namespace stagehand
