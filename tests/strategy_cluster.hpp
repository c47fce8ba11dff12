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
  /// What the ranks write through; null: default_file_system(store) with files bound for an
  /// object store spooled in `work_dir`.
  std::shared_ptr<FileSystem> storage = nullptr;
  std::string work_dir = "/tmp/stagehand-work";
  bool low_priority = true;
  ObjectStoreOptions store = ObjectStoreOptions::from_environment();
  int staging_buckets = 0;
  /// ckpt_staging_memory: per_save.
  bool per_save = false;
};

/// The DispatchClient of a test cluster, saving as the cluster was made to (sync or async) and
/// answering with plain Statuses where the tests need no more.
struct ClusterClient {
  DispatchClient* client = nullptr;
  bool async = false;

  Result<SaveResult> save(std::int64_t step, const std::string& trainer_state = "") {
    return client->save(step, async, trainer_state);
  }
  Status finalize() { return client->finalize().status(); }
  Result<double> fence() { return client->fence(); }
  Status load(const std::string& path) { return client->load(path).status(); }
  ClusterClient* operator->() { return this; }
};

/// One Worker (with its MegatronStrategy) per rank of a synthetic state, a coordinator and a
/// WorkerDispatch, all in this process, driven through the dispatch's blocking client: the same
/// path stagehand-train takes. Shut down on destruction.
struct StrategyCluster {
  caf::actor_system system{system_config()};
  std::vector<std::shared_ptr<StateDict>> states;
  std::unique_ptr<CheckpointCluster> cluster;
  ClusterClient client;

  StrategyCluster(const std::string& destination, const ClusterOptions& o) {
    std::vector<std::unique_ptr<Checkpointable>> ranks;
    for (int r = 0; r < o.spec.ranks; ++r) {
      states.push_back(std::make_shared<StateDict>(*make_synthetic_state(o.spec, r, Device::host())));
      ranks.push_back(checkpointable_state(states.back()));
    }
    ObjectStoreOptions store = o.store;
    store.spool_dir = o.work_dir;
    const auto fs = default_file_system(store);
    CheckpointClusterOptions options;
    options.coordinator.destination = destination;
    options.coordinator.file_system = fs;
    options.strategy.thread_count = o.threads;
    options.strategy.staging_buckets = o.staging_buckets;
    options.strategy.async_save = o.async;
    options.strategy.low_priority_writers = o.low_priority;
    options.strategy.file_system = o.storage ? o.storage : fs;
    options.strategy.staging_per_save = o.per_save;
    options.timeout = std::chrono::seconds(120);
    auto spawned = CheckpointCluster::spawn(system, std::move(ranks), options);
    BOOST_REQUIRE_MESSAGE(spawned.is_ok(), spawned.status().to_string());
    cluster = std::move(*spawned);
    client = ClusterClient{&cluster->client(), o.async};
  }
  ~StrategyCluster() { (void)cluster->shutdown(); }
};

}  // namespace stagehand::test
