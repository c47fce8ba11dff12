#include "stagehand/models/weight_store.hpp"

namespace stagehand {

WeightStore::WeightStore(int shards, std::int64_t context_dim, std::int64_t num_arms, std::int64_t hidden)
    : shards_(shards), context_dim_(context_dim), num_arms_(num_arms), hidden_(hidden) {}

void WeightStore::publish_shard(std::int64_t version, const std::function<void(PolicyWeights&)>& write) {
  std::shared_ptr<PolicyWeights> weights;
  {
    std::lock_guard lock(mutex_);
    Entry& e = versions_[version];
    if (!e.weights) {
      e.weights = std::make_shared<PolicyWeights>();
      e.weights->version = version;
      e.weights->fc1_weight.resize(static_cast<std::size_t>(hidden_ * context_dim_));
      e.weights->fc1_bias.resize(static_cast<std::size_t>(hidden_));
      e.weights->fc2_weight.resize(static_cast<std::size_t>(num_arms_ * hidden_));
      e.weights->fc2_bias.resize(static_cast<std::size_t>(num_arms_));
    }
    weights = e.weights;
  }
  // Shards write disjoint parts (fc2_bias is replicated: every shard writes the same values).
  write(*weights);
  {
    std::lock_guard lock(mutex_);
    ++versions_[version].arrived;
  }
  cv_.notify_all();
}

Result<std::shared_ptr<const PolicyWeights>> WeightStore::wait_for(std::int64_t version,
                                                                   std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  bool ready = cv_.wait_for(lock, timeout, [&] {
    auto it = versions_.find(version);
    return it != versions_.end() && it->second.arrived >= shards_;
  });
  if (!ready) {
    return Status{ErrorCode::timeout, "weights of version " + std::to_string(version) + " were not published in time"};
  }
  return std::shared_ptr<const PolicyWeights>(versions_[version].weights);
}

void WeightStore::drop_before(std::int64_t version) {
  std::lock_guard lock(mutex_);
  versions_.erase(versions_.begin(), versions_.lower_bound(version));
}

}  // namespace stagehand
