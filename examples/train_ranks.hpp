#pragma once

// What one rank of stagehand-train is made of, from the config: the file system of its paths, its
// strategy's options, how its weights reach generators and receivers, and its Worker.

#include <caf/fwd.hpp>

#include <memory>
#include <string>

#include "stagehand/actors/protocol.hpp"
#include "stagehand/checkpoint/load/load_group.hpp"
#include "stagehand/checkpoint/tiers/host_folders.hpp"
#include "stagehand/config/config.hpp"
#include "stagehand/models/collectives.hpp"
#include "stagehand/models/weight_store.hpp"
#include "stagehand/storage/file_system.hpp"
#include "stagehand/storage/routed_file_system.hpp"
#include "stagehand/strategy/megatron_strategy.hpp"

namespace stagehand::train {

/// STAGEHAND_TEST_HANG_FILES_UNDER=<prefix> (tests only): `fs` with making a file under the
/// prefix never returning; `fs` itself without the variable.
std::shared_ptr<FileSystem> with_test_hangs(std::shared_ptr<FileSystem> fs);

/// The local tier's host placement of the config.
HostPlacement host_placement_of_config(const Config& c);

/// The file system of every path in the config: local folders, and object stores reached as
/// storage.s3 says, files bound for them spooled in megatron_config.local_work_dir; a local tier
/// with "{host}" over its host folders.
/// With trainer.local_replication_transport network, the other hosts' folders are routes that
/// wait for their servers (`*routes`, connected by HostServers once the world formed; `rank` is
/// this process's).
/// Null (the error printed) when the local tier's host folders cannot be made.
std::shared_ptr<FileSystem> config_file_system(const Config& c, int rank = 0,
                                               std::shared_ptr<RoutedFileSystem>* routes = nullptr);

/// The strategy options of one rank from the config.
StrategyOptions strategy_options(const Config& c, int rank, const std::shared_ptr<FileSystem>& fs);

/// How this run's weights reach generators and receivers (weight_sync): the store of the
/// collective transport, or the channel the Workers push to (empty: none).
struct RunWeights {
  std::shared_ptr<WeightStore> store;
  std::string channel;
};

/// The run's channel: weight_sync.channel ("tcp://" before it with transport tcp), else, for the
/// fully-async trainer's generators, the run's own: `own_name` over shared memory, `own_address`
/// ("HOST:PORT") over TCP.
std::string run_channel(const Config& c, const std::string& own_name, const std::string& own_address);

/// A TCP port of 127.0.0.1 that nothing listened on a moment ago (the run's own TCP channel in one process).
int free_loopback_port();

/// Rank `rank`'s Worker with its model on `groups`; `load_group` joins the ranks of this process
/// that load together (null with one rank per process).
Result<worker_actor> spawn_rank(caf::actor_system& system, const Config& c, const ParallelLayout& layout, int rank,
                                RankGroups groups, const RunWeights& weights,
                                const std::shared_ptr<FileSystem>& fs, coordinator_actor coordinator,
                                std::shared_ptr<LoadGroup> load_group = nullptr);

}  // namespace stagehand::train
