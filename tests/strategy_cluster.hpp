#pragma once

#include <boost/test/unit_test.hpp>
#include <caf/all.hpp>

#include <memory>
#include <string>
#include <vector>

#include "bench/synthetic_state.hpp"
#include "strategy/checkpoint_coordinator.hpp"
#include "strategy/local_checkpoint_driver.hpp"
#include "strategy/megatron_strategy.hpp"
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
};

/// One MegatronStrategy per rank of a synthetic state, behind one coordinator, driven by a
/// LocalCheckpointDriver that saves to `destination`. Shut down on destruction.
struct StrategyCluster {
  caf::actor_system system{system_config()};
  std::vector<std::shared_ptr<StateDict>> states;
  std::unique_ptr<LocalCheckpointDriver> driver;

  StrategyCluster(const std::string& destination, const ClusterOptions& o) {
    auto coordinator = spawn_checkpoint_coordinator(system, {destination, o.work_dir, o.spec.ranks, o.store});
    std::vector<caf::actor> strategies;
    for (int r = 0; r < o.spec.ranks; ++r) {
      states.push_back(std::make_shared<StateDict>(*make_synthetic_state(o.spec, r, Device::host())));
      StrategyOptions options{r, o.threads, 0, o.async, o.low_priority, o.storage, o.store};
      auto strategy = spawn_megatron_strategy(system, options, states.back(), coordinator);
      BOOST_REQUIRE_MESSAGE(strategy.is_ok(), strategy.status().to_string());
      strategies.push_back(*strategy);
    }
    driver = std::make_unique<LocalCheckpointDriver>(system, destination, coordinator, strategies,
                                                     std::chrono::seconds(120));
  }
  ~StrategyCluster() { (void)driver->shutdown(); }
};

}  // namespace stagehand::test
