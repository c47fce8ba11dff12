#pragma once

#include <boost/test/unit_test.hpp>
#include <caf/all.hpp>

#include <memory>
#include <string>
#include <vector>

#include "stagehand/actors/dispatch_client.hpp"
#include "bench/synthetic_state.hpp"
#include "tests/caf_test_util.hpp"

namespace stagehand::test {

struct ClusterOptions {
  SyntheticStateSpec spec;
  bool async = false;
  int threads = 4;
  std::shared_ptr<StorageBackend> storage = local_storage();
  std::string work_dir = "/tmp/stagehand-work";
  bool low_priority = true;
  ObjectStoreOptions store = ObjectStoreOptions::from_environment();
  int staging_buckets = 0;
  /// ckpt_staging_memory: per_save.
  bool per_save = false;
};

/// One Worker (with its MegatronStrategy) per rank of a synthetic state, a coordinator and a
/// WorkerDispatch, all in this process, driven through the dispatch's blocking client: the same
/// path stagehand-train takes. Shut down on destruction.
struct StrategyCluster {
  caf::actor_system system{system_config()};
  std::vector<std::shared_ptr<StateDict>> states;
  std::unique_ptr<CheckpointCluster> cluster;
  DispatchClient* client = nullptr;

  StrategyCluster(const std::string& destination, const ClusterOptions& o) {
    std::vector<std::unique_ptr<Checkpointable>> ranks;
    for (int r = 0; r < o.spec.ranks; ++r) {
      states.push_back(std::make_shared<StateDict>(*make_synthetic_state(o.spec, r, Device::host())));
      ranks.push_back(checkpointable_state(states.back()));
    }
    CheckpointClusterOptions options;
    options.coordinator = {destination, o.work_dir, o.spec.ranks, o.store};
    options.strategy = {0, o.threads, o.staging_buckets, o.async, o.low_priority, o.storage, o.store, o.per_save};
    options.timeout = std::chrono::seconds(120);
    auto spawned = CheckpointCluster::spawn(system, std::move(ranks), options);
    BOOST_REQUIRE_MESSAGE(spawned.is_ok(), spawned.status().to_string());
    cluster = std::move(*spawned);
    client = &cluster->client();
  }
  ~StrategyCluster() { (void)cluster->shutdown(); }
};

}  // namespace stagehand::test
