// stagehand-bench: measured checkpoint save figures on a synthetic sharded state.
#include <CLI/CLI.hpp>
#include <caf/all.hpp>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <nlohmann/json.hpp>
#include <thread>

#include "stagehand/actors/dispatch_client.hpp"
#include "bench/bench_load.hpp"
#include "bench/bench_commit.hpp"
#include "bench/bench_copy.hpp"
#include "bench/bench_metadata.hpp"
#include "bench/bench_util.hpp"
#include "bench/synthetic_state.hpp"
#include "stagehand/checkpoint/load/checkpoint_reader.hpp"
#include "stagehand/checkpoint/store/checkpoint_store.hpp"
#include "stagehand/checkpoint/save/file_reuse.hpp"
#include "stagehand/checkpoint/format/format.hpp"
#include "stagehand/checkpoint/save/planner.hpp"
#include "stagehand/core/device.hpp"
#include "stagehand/core/host_buffer.hpp"
#include "stagehand/storage/default_file_system.hpp"
#include "stagehand/strategy/messages.hpp"

using namespace stagehand;
using namespace stagehand::bench;

namespace {

/// Writes and fsyncs files of the given sizes, one thread each, from one buffer of patterned
/// bytes; the files are removed afterwards (and with them their page-cache pages).
Result<double> raw_write_seconds(const std::string& dir, const std::vector<std::uint64_t>& sizes) {
  std::uint64_t largest = *std::max_element(sizes.begin(), sizes.end());
  HostBuffer source(std::max<std::uint64_t>(largest, 1), false, nullptr);
  if (!source.valid()) return Status{ErrorCode::no_space, "cannot allocate the baseline buffer"};
  for (std::uint64_t i = 0; i < source.size(); ++i) source.data()[i] = static_cast<std::uint8_t>(i * 131 + 7);
  std::vector<Status> results(sizes.size());
  auto start = Clock::now();
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    threads.emplace_back([&, i] {
      auto file = local_file_system()->create_file(dir + "/raw_" + std::to_string(i) + ".bin");
      if (!file.is_ok()) {
        results[i] = file.status();
        return;
      }
      Status st = (*file)->append(source.data(), sizes[i]);
      if (st.is_ok()) st = (*file)->sync();
      if (st.is_ok()) st = (*file)->close();
      results[i] = st;
    });
  }
  for (auto& t : threads) t.join();
  double elapsed = seconds_since(start);
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    std::filesystem::remove(dir + "/raw_" + std::to_string(i) + ".bin");
    SH_RETURN_IF_ERROR(results[i]);
  }
  return elapsed;
}

/// The raw baseline of saving files of `sizes`: the same bytes written and fsynced as one
/// stream (one file), and as one stream per file in parallel.
struct RawWrite {
  double one_stream_s = 0;
  double parallel_s = 0;
};

Result<RawWrite> raw_write(const std::string& dir, const std::vector<std::uint64_t>& sizes) {
  std::uint64_t total = 0;
  for (auto s : sizes) total += s;
  RawWrite raw;
  SH_ASSIGN_OR_RETURN(raw.one_stream_s, raw_write_seconds(dir, {total}));
  SH_ASSIGN_OR_RETURN(raw.parallel_s, raw_write_seconds(dir, sizes));
  return raw;
}

/// Repeated saves go to steps 1, 2, ...; the previous one is removed after the timed save, as
/// retention would, so that no save pays for deleting an older copy of its step.
void remove_previous_step(const CheckpointStore& store, std::int64_t step) {
  if (step > 1) (void)store.remove_step(step - 1);
}

/// Counters of /proc/vmstat that explain a slow save: page allocations and faults, reclaim,
/// compaction and write-back throttling.
std::map<std::string, std::int64_t> vmstat() {
  static const std::set<std::string> kept = {"pgfault",         "pgalloc_normal", "pgsteal_kswapd", "pgsteal_direct",
                                             "allocstall_normal", "compact_stall", "thp_fault_alloc", "nr_dirty",
                                             "nr_writeback",    "pgscan_direct",  "workingset_refault_file"};
  std::map<std::string, std::int64_t> values;
  std::ifstream in("/proc/vmstat");
  std::string name;
  std::int64_t value = 0;
  while (in >> name >> value) {
    if (kept.count(name)) values[name] = value;
  }
  return values;
}

/// What changed between two vmstat() readings (gauges such as nr_dirty: the later value).
nlohmann::json vmstat_delta(const std::map<std::string, std::int64_t>& before,
                            const std::map<std::string, std::int64_t>& after) {
  nlohmann::json delta;
  for (const auto& [name, value] : after) {
    const bool gauge = name.rfind("nr_", 0) == 0;
    auto it = before.find(name);
    delta[name] = gauge || it == before.end() ? value : value - it->second;
  }
  return delta;
}

struct SaveArgs {
  std::string out;
  StateArgs state;
  int thread_count = 2;
  int staging_buckets = 0;
  int repeat = 1;
  bool baseline = false;
  bool async = false;
  std::string work_dir = "/tmp/stagehand-work";
  /// Seconds of simulated training work between a save's return and the fence.
  double compute_s = 0;
  /// ckpt_staging_memory: per_save.
  bool per_save = false;
  /// host: the state in host memory, written straight from it; device: on the GPU when one is
  /// visible, else in host memory copied out through staging buffers as device memory is.
  std::string source = "host";
  bool early_writeback = true;
  /// megatron_config.ckpt_save_uncached (on unless --cached).
  bool uncached = true;
  /// Print the raw baselines only, no saves (for scripts that run them in their own process).
  bool baseline_only = false;
  /// Each save writes over the data files of the step removed after the one before
  /// (reusing_file_system, trainer.ckpt_reuse_files) instead of creating new ones.
  bool reuse_files = false;
};

/// The figures every save prints.
nlohmann::json save_line(const SaveArgs& args, const char* mode, int repeat, std::uint64_t bytes, double save_s) {
  nlohmann::json line = bench_line(mode, repeat, args.state.ranks, args.thread_count);
  line["staging_buckets"] = args.staging_buckets;
  line["bytes"] = bytes;
  line["save_s"] = save_s;
  line["throughput_gbps"] = static_cast<double>(bytes) / save_s / 1e9;
  line["host_staging_peak_bytes"] = staging_memory().peak();
  line["source"] = args.source;
  line["early_writeback"] = args.early_writeback;
  line["uncached"] = args.uncached;
  line["reuse_files"] = args.reuse_files;
  return line;
}

/// File sizes the save of `state` by rank `rank` writes (its plan), for the raw-write baseline.
std::vector<std::uint64_t> planned_file_sizes(const SaveArgs& args, int rank, const StateDict& state) {
  std::vector<std::uint64_t> sizes;
  for (const auto& b : plan_save(rank, state.descriptors(), args.thread_count).buckets) sizes.push_back(b.file_size());
  return sizes;
}

/// Saves through the WorkerDispatch, one Worker and MegatronStrategy per rank and the
/// coordinator, as stagehand-train does: `stall_s` is how long the caller was blocked, `save_s`
/// the time until the commit.
int run_save(const SaveArgs& args) {
  const SyntheticStateSpec spec = args.state.spec();
  ObjectStoreOptions object_store = ObjectStoreOptions::from_environment();
  object_store.spool_dir = args.work_dir;
  std::shared_ptr<FileSystem> fs = default_file_system(object_store);
  if (args.reuse_files) fs = reusing_file_system(std::move(fs), {args.out});
  const CheckpointStore store(fs, args.out);
  const bool local = fs->capabilities(args.out).directories;
  if (local) {
    std::error_code ec;
    std::filesystem::create_directories(args.out, ec);
    if (ec) {
      std::cerr << "stagehand-bench: cannot create --out '" << args.out << "': " << ec.message() << "\n";
      return 2;
    }
  }
  if (args.baseline && !local) {
    std::cerr << "stagehand-bench: --baseline writes local files; it needs a local --out\n";
    return 2;
  }
  // One lock for the run, as stagehand-train and the Checkpointer take it: a second bench or a
  // trainer on the same --out is refused, not interleaved.
  auto root_lock = store.lock();
  if (!root_lock.is_ok()) {
    std::cerr << "stagehand-bench: " << root_lock.status().to_string() << "\n";
    return 2;
  }
  std::vector<std::unique_ptr<Checkpointable>> ranks;
  std::vector<std::uint64_t> file_sizes;
  const bool device = args.source == "device";
  for (int r = 0; r < spec.ranks; ++r) {
    auto state = make_synthetic_state(spec, r, device ? default_device(r) : Device::host());
    if (!state.is_ok()) {
      std::cerr << "stagehand-bench: " << state.status().to_string() << "\n";
      return 2;
    }
    auto sizes = planned_file_sizes(args, r, *state);
    file_sizes.insert(file_sizes.end(), sizes.begin(), sizes.end());
    ranks.push_back(checkpointable_state(std::make_shared<StateDict>(std::move(*state))));
  }
  std::vector<RawWrite> raws;
  if (args.baseline || args.baseline_only) {
    // Apart from the saves: before the first, so that no save runs right after a raw write.
    for (int k = 0; k < args.repeat; ++k) {
      auto raw = raw_write(args.out, file_sizes);
      if (!raw.is_ok()) {
        std::cerr << "stagehand-bench: baseline: " << raw.status().to_string() << "\n";
        return 1;
      }
      raws.push_back(*raw);
      nlohmann::json line;
      line["baseline"] = true;
      line["repeat"] = k;
      line["raw_write_s"] = raw->one_stream_s;
      line["raw_write_parallel_s"] = raw->parallel_s;
      line["streams"] = file_sizes.size();
      std::cout << line.dump() << std::endl;
    }
    if (args.baseline_only) return 0;
  }
  caf::actor_system_config cfg;
  register_stagehand_errors(cfg);
  caf::actor_system system{cfg};
  CheckpointClusterOptions options;
  options.coordinator.destination = args.out;
  options.coordinator.file_system = fs;
  options.strategy.thread_count = args.thread_count;
  options.strategy.staging_buckets = args.staging_buckets;
  options.strategy.async_save = args.async;
  options.strategy.file_system = fs;
  options.strategy.staging_per_save = args.per_save;
  // Without a GPU, "device" copies host memory out through the staging path a GPU uses.
  options.strategy.stage_host_memory = device && device_info().gpu_count == 0;
  options.strategy.early_writeback = args.early_writeback;
  options.strategy.uncached_writes = args.uncached;
  options.timeout = std::chrono::minutes(30);
  auto cluster = CheckpointCluster::spawn(system, std::move(ranks), options);
  if (!cluster.is_ok()) {
    std::cerr << "stagehand-bench: " << cluster.status().to_string() << "\n";
    return 2;
  }
  DispatchClient& client = (*cluster)->client();
  // The process before its first save: the state, the libraries, the actors, staging buffers
  // allocated at spawn.
  const std::uint64_t rss_before_saves = bench::max_rss_bytes();
  std::vector<double> stalls;
  std::vector<double> fence_waits;
  std::vector<double> totals;
  std::uint64_t bytes = 0;
  for (int k = 0; k < args.repeat; ++k) {
    staging_memory().reset_peak();
    const std::int64_t step = k + 1;
    auto counters = vmstat();
    auto start = Clock::now();
    auto timing = client.save(step, args.async);
    // Training work after the save returned (forward and backward passes read the state), then
    // the fence before the optimizer step writes it.
    if (timing.is_ok() && args.compute_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(args.compute_s));
    auto fence_wait = timing.is_ok() ? client.fence() : Result<double>(timing.status());
    auto finalized = fence_wait.is_ok() ? client.finalize() : Result<FinalizeResult>(fence_wait.status());
    double total = seconds_since(start);
    auto vm = vmstat_delta(counters, vmstat());
    remove_previous_step(store, step);
    if (!finalized.is_ok()) {
      std::cerr << "stagehand-bench: save failed: " << finalized.status().to_string() << "\n";
      return 1;
    }
    // What the commit wrote: a sync save's came with its answer, an async one's with the finalize.
    const CommitInfo& commit = timing->committed ? timing->commit : finalized->commit;
    bytes = commit.bytes;
    stalls.push_back(timing->stall_s);
    fence_waits.push_back(*fence_wait);
    totals.push_back(total);
    nlohmann::json line = save_line(args, timing->async ? "async" : "sync", k, bytes, total);
    line["stall_s"] = timing->stall_s;
    line["compute_s"] = args.compute_s;
    line["fence_wait_s"] = *fence_wait;
    line["staging_memory"] = args.per_save ? "per_save" : "persistent";
    line["rss_bytes"] = bench::current_rss_bytes();
    // The process's peak so far (with --baseline, its raw-write buffer too).
    line["peak_rss_bytes"] = bench::max_rss_bytes();
    line["vmstat"] = vm;
    // From the last rank's report to the tracker written, and the slowest rank's phases.
    line["commit_s"] = commit.commit_s;
    line["commit_cpu_s"] = commit.commit_cpu_s;
    line["save_cpu_s"] = commit.ranks_cpu_s;
    line["phases"] = {{"copy_s", commit.phases.copy_s},    {"hash_s", commit.phases.hash_s},
                      {"write_s", commit.phases.write_s},  {"fsync_s", commit.phases.fsync_s},
                      {"upload_s", commit.phases.upload_s}, {"commit_s", commit.commit_s},
                      {"commit_cpu_s", commit.commit_cpu_s}};
    if (auto version = fs->stat_file(CheckpointLayout::policy_dir(store.step_dir(step)) + "/" + kMetadataFile);
        version.is_ok() && *version) {
      line["metadata_bytes"] = (*version)->size;
    }
    line["host_staging_peak_fraction"] = static_cast<double>(staging_memory().peak()) / static_cast<double>(bytes);
    std::cout << line.dump() << std::endl;
  }
  nlohmann::json summary;
  summary["summary"] = true;
  summary["mode"] = args.async ? "async" : "sync";
  summary["repeats"] = args.repeat;
  summary["median_stall_s"] = median(stalls);
  summary["median_fence_wait_s"] = median(fence_waits);
  summary["median_save_s"] = median(totals);
  summary["peak_rss_before_saves_bytes"] = rss_before_saves;
  summary["peak_rss_bytes"] = bench::max_rss_bytes();
  summary["median_throughput_gbps"] = static_cast<double>(bytes) / median(totals) / 1e9;
  if (!raws.empty()) {
    std::vector<double> one, parallel;
    for (const auto& r : raws) {
      one.push_back(r.one_stream_s);
      parallel.push_back(r.parallel_s);
    }
    summary["median_raw_write_s"] = median(one);
    summary["median_raw_write_parallel_s"] = median(parallel);
    // The fastest raw write of the same bytes over this save's median: 1.0 is the disk's limit.
    summary["save_vs_best_raw"] = std::min(median(one), median(parallel)) / median(totals);
  }
  std::cout << summary.dump() << std::endl;
  return (*cluster)->shutdown().is_ok() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"stagehand-bench: checkpoint save figures on a synthetic sharded state"};
  app.require_subcommand(1);
  SaveArgs args;
  auto* save = app.add_subcommand("save", "save a synthetic state as step 1 (then 2, ... with --repeat) under --out");
  save->add_option("--out", args.out, "checkpoint root: a folder, or s3://bucket/prefix (AWS_* variables)")
      ->required();
  save->add_option("--work-dir", args.work_dir, "local_work_dir for object-store saves");
  add_state_options(save, args.state, "");
  save->add_option("--thread-count", args.thread_count, "ckpt_save_thread_count")->check(CLI::Range(1, 256));
  save->add_option("--staging-buckets", args.staging_buckets, "ckpt_save_staging_buckets")
      ->check(CLI::Range(0, 256));
  save->add_option("--repeat", args.repeat, "saves to run")->check(CLI::Range(1, 1000));
  save->add_flag("--baseline", args.baseline,
                 "also time raw writes + fsync of the same bytes (one stream, and one per file), before the saves");
  save->add_flag("--baseline-only", args.baseline_only, "only the raw writes of --baseline, no save");
  save->add_option("--source", args.source,
                   "host: state in host memory, written straight from it; device: on the GPU, or without "
                   "one copied out through host staging buffers as GPU memory is")
      ->check(CLI::IsMember({"host", "device"}));
  save->add_flag("!--no-early-writeback", args.early_writeback,
                 "leave write-back to the kernel until the fsync (no sync_file_range while writing)");
  save->add_flag("!--cached", args.uncached,
                 "ckpt_save_uncached false: every save's bytes pass through the page cache (else new files are "
                 "written with O_DIRECT)");
  save->add_flag("--async", args.async, "async_dist_ckpt_save: the caller waits only for staging (stall_s)");
  save->add_option("--compute-s", args.compute_s,
                   "seconds of simulated training between a save's return and the fence (fence_wait_s)")
      ->check(CLI::Range(0.0, 3600.0));
  save->add_flag("--per-save-staging", args.per_save, "ckpt_staging_memory: per_save (else persistent)");
  save->add_flag("--reuse-files", args.reuse_files,
                 "each save writes over the data files of the step the one before retired (trainer.ckpt_reuse_files), "
                 "instead of creating new files");
  const stagehand::bench::BenchCommand load = stagehand::bench::add_load_command(app);
  const stagehand::bench::BenchCommand metadata = stagehand::bench::add_metadata_command(app);
  const stagehand::bench::BenchCommand commit = stagehand::bench::add_commit_command(app);
  const stagehand::bench::BenchCommand copy = stagehand::bench::add_copy_command(app);
  try {
    app.parse(argc, argv);
    parse_size(args.state.bytes_per_rank);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::cerr << "stagehand-bench: bad --bytes-per-rank '" << args.state.bytes_per_rank << "': " << e.what() << "\n";
    return 2;
  }
  if (load.command->parsed()) return load.run();
  if (metadata.command->parsed()) return metadata.run();
  if (commit.command->parsed()) return commit.run();
  if (copy.command->parsed()) return copy.run();
  return run_save(args);
}
