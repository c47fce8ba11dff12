#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "stagehand/core/status.hpp"
#include "stagehand/models/collectives.hpp"

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
/// weight sync of the fully-async trainer (the bytes never travel in actor messages).
///
/// In one process every shard's rank publishes into the same store. Across processes each of those
/// ranks has a store made by across_group(): a publish is a collective of their tensor-parallel
/// group that carries every shard to every member, and the store in the generators' process
/// keeps the whole version.
///
/// Thread-safety: every member may be called from any thread; across processes, each member's
/// publishes follow the order of its group's other collectives (Collective's contract).
class WeightStore {
 public:
  WeightStore(int shards, std::int64_t context_dim, std::int64_t num_arms, std::int64_t hidden);

  /// A store of one member of the tensor-parallel `group` whose ranks each publish one shard.
  /// @param keeps whether this store keeps the versions (the generators' process) or only sends.
  static std::shared_ptr<WeightStore> across_group(std::shared_ptr<Collective> group, int member,
                                                   bool keeps, std::int64_t context_dim,
                                                   std::int64_t num_arms, std::int64_t hidden);

  /// Lets `write` fill its part of version `version`; the version is complete after `shards` calls
  /// (across a group: after this one, which waits for the group's other members).
  /// @return an error when the group's collective failed.
  Status publish_shard(std::int64_t version, const std::function<void(PolicyWeights&)>& write);

  /// Blocks until version `version` is complete (or `timeout` passes: then a timeout error).
  Result<std::shared_ptr<const PolicyWeights>> wait_for(std::int64_t version, std::chrono::milliseconds timeout);

  /// Forgets versions older than `version`.
  void drop_before(std::int64_t version);

 private:
  struct Entry {
    std::shared_ptr<PolicyWeights> weights;
    int arrived = 0;
  };

  /// A version with every tensor zero-filled at its size.
  std::shared_ptr<PolicyWeights> empty_version(std::int64_t version) const;
  Status publish_across_group(std::int64_t version,
                              const std::function<void(PolicyWeights&)>& write);

  int shards_;
  std::int64_t context_dim_;
  std::int64_t num_arms_;
  std::int64_t hidden_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<std::int64_t, Entry> versions_;
  std::shared_ptr<Collective> group_;  // across processes only
  int member_ = 0;
  bool keeps_ = true;
};

}  // namespace stagehand
