#include "stagehand/examples/train_ranks.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <caf/all.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <thread>

#include "stagehand/actors/worker.hpp"
#include "stagehand/checkpoint/save/file_reuse.hpp"
#include "stagehand/config/storage_options.hpp"
#include "stagehand/models/bandit_mlp.hpp"
#include "stagehand/models/host_servers.hpp"
#include "stagehand/storage/default_file_system.hpp"
#include "stagehand/trainers/trainer.hpp"

namespace stagehand::train {

namespace {

/// STAGEHAND_TEST_HANG_FILES_UNDER=<prefix> (tests only): making a file whose path starts with
/// the prefix never returns, as on a file system that no longer answers (a hung NFS or FUSE
/// mount), so that the limits on the background work's waits must end the run.
class HangingFilesForTests final : public FileSystemWrapper {
 public:
  HangingFilesForTests(std::shared_ptr<FileSystem> inner, std::string prefix)
      : FileSystemWrapper(std::move(inner)), prefix_(std::move(prefix)) {}
  Result<std::unique_ptr<WritableFile>> create_file(const std::string& path) override {
    if (path.rfind(prefix_, 0) == 0) {
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    }
    return FileSystemWrapper::create_file(path);
  }

 private:
  const std::string prefix_;
};

}  // namespace

std::shared_ptr<FileSystem> with_test_hangs(std::shared_ptr<FileSystem> fs) {
  const char* prefix = std::getenv("STAGEHAND_TEST_HANG_FILES_UNDER");
  if (fs == nullptr || prefix == nullptr || *prefix == '\0') return fs;
  return std::make_shared<HangingFilesForTests>(std::move(fs), prefix);
}

/// The local tier's host placement of the config.
HostPlacement host_placement_of_config(const Config& c) {
  const TrainerConfig& t = c.trainer;
  return host_placement(t.local_ckpt_path, static_cast<int>(c.parallel.tensor_parallel * c.parallel.data_parallel),
                        static_cast<int>(t.ranks_per_host), static_cast<int>(t.local_replication_factor),
                        static_cast<int>(t.local_replication_stride));
}

/// The file system of every path in the config: local folders, and object stores reached as
/// storage.s3 says, files bound for them spooled in megatron_config.local_work_dir; a local tier
/// with "{host}" over its host folders.
/// With trainer.local_replication_transport network, the other hosts' folders are routes that
/// wait for their servers (`*routes`, connected by HostServers once the world formed; `rank` is
/// this process's).
/// Null (the error printed) when the local tier's host folders cannot be made.
std::shared_ptr<FileSystem> config_file_system(const Config& c, int rank, std::shared_ptr<RoutedFileSystem>* routes) {
  ObjectStoreOptions store = object_store_options(c.storage.s3);
  store.spool_dir = c.megatron_config.local_work_dir;
  std::shared_ptr<FileSystem> fs = default_file_system(store);
  const TrainerConfig& t = c.trainer;
  const bool on_hosts = t.local_ckpt_path.find(kHostPlaceholder) != std::string::npos;
  const HostPlacement placement = host_placement_of_config(c);
  if (on_hosts && t.local_replication_transport == HostTransport::network) {
    if (routes == nullptr) {
      std::fprintf(stderr, "stagehand-train: trainer.local_replication_transport network needs one process per rank "
                           "(WORLD_SIZE, scripts/launch-local.sh): in one process every host's folder is this one's\n");
      return nullptr;
    }
    *routes = host_routes(fs, placement, placement.host_of(rank), std::chrono::seconds(t.call_timeout_s));
    fs = *routes;
  }
  if (t.local_ckpt_path.empty() && t.ckpt_reuse_files && t.max_ckpts_to_keep > 0) {
    // Saves write over the data files of the steps retention removed from ckpt_path (on a local
    // disk).
    return reusing_file_system(std::move(fs), {t.ckpt_path});
  }
  if (!t.local_ckpt_path.empty() && t.local_ckpt_reuse_files && t.local_max_ckpts_to_keep > 0) {
    // Saves write over the retired local steps' data files, in each host's folder.
    std::vector<std::string> roots{t.local_ckpt_path};
    if (on_hosts) {
      roots.clear();
      for (int h = 0; h < placement.hosts; ++h) roots.push_back(placement.on_host(t.local_ckpt_path, h));
    }
    fs = reusing_file_system(std::move(fs), std::move(roots));
  }
  if (!on_hosts) return fs;
  // Each host's folder of the local tier, with copies of each rank's files on other hosts.
  auto hosts = host_folders_file_system(std::move(fs), placement);
  if (!hosts.is_ok()) {
    std::fprintf(stderr, "stagehand-train: %s\n", hosts.status().with_context("trainer.local_ckpt_path").to_string().c_str());
    return nullptr;
  }
  return *hosts;
}

/// The strategy options of one rank from the config.
StrategyOptions strategy_options(const Config& c, int rank, const std::shared_ptr<FileSystem>& fs) {
  StrategyOptions options;
  options.rank = rank;
  options.thread_count = static_cast<int>(c.megatron_config.ckpt_save_thread_count);
  options.staging_buckets = static_cast<int>(c.megatron_config.ckpt_save_staging_buckets);
  options.async_save = c.megatron_config.async_dist_ckpt_save;
  options.low_priority_writers = c.megatron_config.ckpt_writer_low_priority;
  options.uncached_writes = c.megatron_config.ckpt_save_uncached;
  options.file_system = rate_limited(fs, c.megatron_config.ckpt_write_rate_limit_mib_s * 1048576.0);
  options.staging_per_save = c.megatron_config.ckpt_staging_memory == StagingMemory::per_save;
  options.load_thread_count = static_cast<int>(c.megatron_config.ckpt_load_thread_count);
  return options;
}

std::string run_channel(const Config& c, const std::string& own_name, const std::string& own_address) {
  const WeightTransport t = c.weight_sync.transport;
  if (t == WeightTransport::collective) return "";
  const std::string prefix = t == WeightTransport::tcp ? "tcp://" : "";
  if (!c.weight_sync.channel.empty()) return prefix + c.weight_sync.channel;
  if (c.trainer.kind != TrainerKind::fully_async) return "";
  return t == WeightTransport::tcp ? prefix + own_address : own_name;
}

int free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  int port = 0;
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  if (fd >= 0) ::close(fd);
  return port;
}

/// Rank `rank`'s Worker with its model on `groups`; `load_group` joins the ranks of this process
/// that load together (null with one rank per process).
Result<worker_actor> spawn_rank(caf::actor_system& system, const Config& c, const ParallelLayout& layout, int rank,
                                RankGroups groups, const RunWeights& weights,
                                const std::shared_ptr<FileSystem>& fs, coordinator_actor coordinator,
                                std::shared_ptr<LoadGroup> load_group) {
  auto model = BanditMlp::create(c.model, c.trainer.seed, layout, rank, std::move(groups), weights.store);
  if (!model.is_ok()) return model.status().with_context("rank " + std::to_string(rank));
  StrategyOptions strategy = strategy_options(c, rank, fs);
  strategy.load_group = std::move(load_group);
  std::optional<WeightPublishing> publishing;
  if (!weights.channel.empty()) {
    publishing = WeightPublishing{weights.channel, layout.world_size(), c.weight_sync.tensors,
                                  weight_channel_options(c.weight_sync, std::chrono::seconds(c.trainer.call_timeout_s))};
  }
  auto worker = spawn_worker(system, std::move(*model), std::move(strategy), std::move(coordinator),
                             std::chrono::seconds(c.trainer.call_timeout_s), std::move(publishing));
  if (!worker.is_ok()) return worker.status().with_context("rank " + std::to_string(rank));
  return worker;
}

}  // namespace stagehand::train
