#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "stagehand/core/status.hpp"

namespace stagehand {

/// Full (unsharded) policy weights of one version, in f32, as generators use them.
struct PolicyWeights {
  std::int64_t version = 0;
  std::vector<float> fc1_weight;  // [hidden, context_dim]
  std::vector<float> fc1_bias;    // [hidden]
  std::vector<float> fc2_weight;  // [num_arms, hidden]
  std::vector<float> fc2_bias;    // [num_arms]
};

/// Versioned weights for generators: the tensor-parallel ranks of one data-parallel replica each
/// publish their shard of a version; readers wait until every shard of it has arrived. The
/// in-process weight sync of the fully-async trainer (the bytes never travel in messages).
///
/// Thread-safety: every member may be called from any thread.
class WeightStore {
 public:
  WeightStore(int shards, std::int64_t context_dim, std::int64_t num_arms, std::int64_t hidden);

  /// Lets `write` fill its part of version `version`; the version is complete after `shards` calls.
  void publish_shard(std::int64_t version, const std::function<void(PolicyWeights&)>& write);

  /// Blocks until version `version` is complete (or `timeout` passes: then a timeout error).
  Result<std::shared_ptr<const PolicyWeights>> wait_for(std::int64_t version, std::chrono::milliseconds timeout);

  /// Forgets versions older than `version`.
  void drop_before(std::int64_t version);

 private:
  struct Entry {
    std::shared_ptr<PolicyWeights> weights;
    int arrived = 0;
  };

  int shards_;
  std::int64_t context_dim_;
  std::int64_t num_arms_;
  std::int64_t hidden_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<std::int64_t, Entry> versions_;
};

}  // namespace stagehand
