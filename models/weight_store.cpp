#include "stagehand/models/weight_store.hpp"

namespace stagehand {

WeightStore::WeightStore(int shards, std::int64_t context_dim, std::int64_t num_arms, std::int64_t hidden)
    : shards_(shards), context_dim_(context_dim), num_arms_(num_arms), hidden_(hidden) {}

std::shared_ptr<WeightStore> WeightStore::across_group(std::shared_ptr<Collective> group,
                                                       int member, bool keeps,
                                                       std::int64_t context_dim,
                                                       std::int64_t num_arms, std::int64_t hidden) {
  auto store = std::make_shared<WeightStore>(group->size(), context_dim, num_arms, hidden);
  store->group_ = std::move(group);
  store->member_ = member;
  store->keeps_ = keeps;
  return store;
}

std::shared_ptr<PolicyWeights> WeightStore::empty_version(std::int64_t version) const {
  auto weights = std::make_shared<PolicyWeights>();
  weights->version = version;
  weights->fc1_weight.resize(static_cast<std::size_t>(hidden_ * context_dim_));
  weights->fc1_bias.resize(static_cast<std::size_t>(hidden_));
  weights->fc2_weight.resize(static_cast<std::size_t>(num_arms_ * hidden_));
  weights->fc2_bias.resize(static_cast<std::size_t>(num_arms_));
  return weights;
}

Status WeightStore::publish_shard(std::int64_t version,
                                  const std::function<void(PolicyWeights&)>& write) {
  if (group_) return publish_across_group(version, write);
  std::shared_ptr<PolicyWeights> weights;
  {
    std::lock_guard lock(mutex_);
    Entry& e = versions_[version];
    if (!e.weights) e.weights = empty_version(version);
    weights = e.weights;
  }
  // Shards write disjoint parts (fc2_bias is replicated: every shard writes the same values).
  write(*weights);
  {
    std::lock_guard lock(mutex_);
    ++versions_[version].arrived;
  }
  cv_.notify_all();
  return Status::ok();
}

Status WeightStore::publish_across_group(std::int64_t version,
                                         const std::function<void(PolicyWeights&)>& write) {
  // Each member writes its shard into zeros; the group's sum (member order, from 0.0f) is then
  // every shard in its place: x + 0.0f is x, except that -0.0f comes out as +0.0f, which no
  // product or sum a generator computes can tell apart. One buffer, one collective per version.
  auto weights = empty_version(version);
  write(*weights);
  std::vector<std::vector<float>*> parts{&weights->fc1_weight, &weights->fc1_bias,
                                         &weights->fc2_weight, &weights->fc2_bias};
  std::vector<float> packed;
  for (auto* part : parts)
    packed.insert(packed.end(), part->begin(), part->end());
  SH_RETURN_IF_ERROR(group_->all_reduce_sum(member_, packed.data(), packed.size())
                         .with_context("publishing weights of version " + std::to_string(version)));
  if (!keeps_) return Status::ok();
  auto next = packed.begin();
  for (auto* part : parts) {
    std::copy_n(next, part->size(), part->begin());
    next += static_cast<std::ptrdiff_t>(part->size());
  }
  {
    std::lock_guard lock(mutex_);
    versions_[version] = Entry{std::move(weights), shards_};
  }
  cv_.notify_all();
  return Status::ok();
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
