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
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "stagehand/actors/dispatch_client.hpp"
#include "bench/bench_load.hpp"
#include "bench/synthetic_state.hpp"
#include "stagehand/checkpoint/cloud_checkpoint.hpp"
#include "stagehand/checkpoint/format.hpp"
#include "stagehand/checkpoint/loader.hpp"
#include "stagehand/checkpoint/save_engine.hpp"
#include "stagehand/core/device.hpp"
#include "stagehand/core/host_buffer.hpp"
#include "stagehand/storage/destination.hpp"
#include "stagehand/storage/local_files.hpp"
#include "stagehand/strategy/messages.hpp"

using namespace stagehand;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  if (v.empty()) return 0;
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

/// Writes and fsyncs files of the given sizes in parallel, one thread each, from one buffer.
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
      auto file = local_storage()->open_for_write(dir + "/raw_" + std::to_string(i) + ".bin");
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

/// Repeated saves go to steps 1, 2, ...; the previous one is removed after the timed save, as
/// retention would, so that no save pays for deleting an older copy of its step.
void remove_previous_step(const std::string& root, std::int64_t step) {
  if (step <= 1) return;
  if (is_cloud(root)) {
    auto cloud = CloudCheckpoints::open(root, ObjectStoreOptions::from_environment());
    if (cloud.is_ok()) (void)cloud->remove_step(step - 1);
    return;
  }
  std::error_code ec;
  std::filesystem::remove_all(CheckpointLayout{root}.step_dir(step - 1), ec);
}

/// Resident set size of this process now (VmRSS).
std::uint64_t current_rss_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

std::uint64_t parse_size(const std::string& text) {
  std::size_t pos = 0;
  double value = std::stod(text, &pos);
  std::string unit = text.substr(pos);
  double scale = 1;
  if (unit == "K" || unit == "KiB") scale = 1024.0;
  else if (unit == "M" || unit == "MiB") scale = 1024.0 * 1024;
  else if (unit == "G" || unit == "GiB") scale = 1024.0 * 1024 * 1024;
  else if (!unit.empty()) throw CLI::ValidationError("--bytes-per-rank", "unknown unit '" + unit + "'");
  return static_cast<std::uint64_t>(value * scale);
}

struct SaveArgs {
  std::string out;
  int ranks = 2;
  std::string bytes_per_rank = "64M";
  int tensors = 16;
  int thread_count = 2;
  int staging_buckets = 0;
  std::uint64_t seed = 1;
  int repeat = 1;
  bool baseline = false;
  bool async = false;
  std::string work_dir = "/tmp/stagehand-work";
  /// Seconds of simulated training work between a save's return and the fence.
  double compute_s = 0;
  /// ckpt_staging_memory: per_save.
  bool per_save = false;
};

/// The figures every save prints.
nlohmann::json save_line(const SaveArgs& args, const char* mode, int repeat, std::uint64_t bytes, double save_s) {
  nlohmann::json line;
  line["mode"] = mode;
  line["repeat"] = repeat;
  line["device"] = default_device(0).to_string();
  line["ranks"] = args.ranks;
  line["thread_count"] = args.thread_count;
  line["staging_buckets"] = args.staging_buckets;
  line["bytes"] = bytes;
  line["save_s"] = save_s;
  line["throughput_gbps"] = static_cast<double>(bytes) / save_s / 1e9;
  line["host_staging_peak_bytes"] = staging_memory().peak();
  return line;
}

/// File sizes the save of `state` by rank `rank` writes, for the raw-write baseline.
Result<std::vector<std::uint64_t>> planned_file_sizes(const SaveArgs& args, int rank, const StateDict& state) {
  SaveEngineOptions options{args.thread_count, args.staging_buckets};
  SH_ASSIGN_OR_RETURN(auto engine, SaveEngine::create(rank, options));
  SH_ASSIGN_OR_RETURN(auto plan, engine->plan_for(state));
  std::vector<std::uint64_t> sizes;
  for (const auto& b : plan->buckets) sizes.push_back(b.file_size());
  return sizes;
}

/// Saves through the WorkerDispatch, one Worker and MegatronStrategy per rank and the
/// coordinator, as stagehand-train does: `stall_s` is how long the caller was blocked, `save_s`
/// the time until the commit.
int run_save(const SaveArgs& args) {
  SyntheticStateSpec spec{args.ranks, parse_size(args.bytes_per_rank), args.tensors, args.seed};
  std::error_code ec;
  if (!is_cloud(args.out)) std::filesystem::create_directories(args.out, ec);
  if (ec) {
    std::cerr << "stagehand-bench: cannot create --out '" << args.out << "': " << ec.message() << "\n";
    return 2;
  }
  if (args.baseline && is_cloud(args.out)) {
    std::cerr << "stagehand-bench: --baseline writes local files; it needs a local --out\n";
    return 2;
  }
  std::vector<std::unique_ptr<Checkpointable>> ranks;
  std::vector<std::uint64_t> file_sizes;
  for (int r = 0; r < args.ranks; ++r) {
    auto state = make_synthetic_state(spec, r, default_device(r));
    auto sizes = state.is_ok() ? planned_file_sizes(args, r, *state) : state.status();
    if (!sizes.is_ok()) {
      std::cerr << "stagehand-bench: " << sizes.status().to_string() << "\n";
      return 2;
    }
    file_sizes.insert(file_sizes.end(), sizes->begin(), sizes->end());
    ranks.push_back(checkpointable_state(std::make_shared<StateDict>(std::move(*state))));
  }
  caf::actor_system_config cfg;
  register_stagehand_errors(cfg);
  caf::actor_system system{cfg};
  CheckpointClusterOptions options;
  options.coordinator = {args.out, args.work_dir};
  options.strategy = {0,    args.thread_count,    args.staging_buckets, args.async, true, local_storage(),
                      ObjectStoreOptions::from_environment(), args.per_save};
  options.timeout = std::chrono::minutes(30);
  auto cluster = CheckpointCluster::spawn(system, std::move(ranks), options);
  if (!cluster.is_ok()) {
    std::cerr << "stagehand-bench: " << cluster.status().to_string() << "\n";
    return 2;
  }
  DispatchClient& client = (*cluster)->client();
  std::vector<double> stalls;
  std::vector<double> fence_waits;
  std::vector<double> totals;
  std::vector<double> raw_times;
  std::uint64_t bytes = 0;
  for (int k = 0; k < args.repeat; ++k) {
    if (args.baseline) {
      auto raw = raw_write_seconds(args.out, file_sizes);
      if (!raw.is_ok()) {
        std::cerr << "stagehand-bench: baseline: " << raw.status().to_string() << "\n";
        return 1;
      }
      raw_times.push_back(*raw);
    }
    staging_memory().reset_peak();
    const std::int64_t step = k + 1;
    auto start = Clock::now();
    auto timing = client.save(step);
    // Training work after the save returned (forward and backward passes read the state), then
    // the fence before the optimizer step writes it.
    if (timing.is_ok() && args.compute_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(args.compute_s));
    auto fence_wait = timing.is_ok() ? client.fence() : Result<double>(timing.status());
    Status committed = fence_wait.is_ok() ? client.finalize() : fence_wait.status();
    double total = seconds_since(start);
    remove_previous_step(args.out, step);
    if (!committed.is_ok()) {
      std::cerr << "stagehand-bench: save failed: " << committed.to_string() << "\n";
      return 1;
    }
    auto metadata = read_checkpoint_metadata(CheckpointLayout{args.out}.step_dir(step));
    if (!metadata.is_ok()) {
      std::cerr << "stagehand-bench: " << metadata.status().to_string() << "\n";
      return 1;
    }
    bytes = 0;
    for (const auto& [name, file] : metadata->files) bytes += file.size;
    stalls.push_back(timing->stall_s);
    fence_waits.push_back(*fence_wait);
    totals.push_back(total);
    nlohmann::json line = save_line(args, timing->async ? "async" : "sync", k, bytes, total);
    line["stall_s"] = timing->stall_s;
    line["compute_s"] = args.compute_s;
    line["fence_wait_s"] = *fence_wait;
    line["staging_memory"] = args.per_save ? "per_save" : "persistent";
    line["rss_bytes"] = current_rss_bytes();
    line["host_staging_peak_fraction"] = static_cast<double>(staging_memory().peak()) / static_cast<double>(bytes);
    if (args.baseline) {
      line["raw_write_s"] = raw_times.back();
      line["raw_write_gbps"] = static_cast<double>(bytes) / raw_times.back() / 1e9;
    }
    std::cout << line.dump() << std::endl;
  }
  nlohmann::json summary;
  summary["summary"] = true;
  summary["mode"] = args.async ? "async" : "sync";
  summary["repeats"] = args.repeat;
  summary["median_stall_s"] = median(stalls);
  summary["median_fence_wait_s"] = median(fence_waits);
  summary["median_save_s"] = median(totals);
  summary["median_throughput_gbps"] = static_cast<double>(bytes) / median(totals) / 1e9;
  if (args.baseline) {
    summary["median_raw_write_s"] = median(raw_times);
    summary["median_raw_write_gbps"] = static_cast<double>(bytes) / median(raw_times) / 1e9;
    summary["throughput_vs_raw"] = median(raw_times) / median(totals);
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
  save->add_option("--ranks", args.ranks, "in-process ranks")->check(CLI::Range(1, 1024));
  save->add_option("--bytes-per-rank", args.bytes_per_rank, "state per rank, e.g. 256M or 1G");
  save->add_option("--tensors", args.tensors, "tensors per rank")->check(CLI::Range(1, 100000));
  save->add_option("--thread-count", args.thread_count, "ckpt_save_thread_count")->check(CLI::Range(1, 256));
  save->add_option("--staging-buckets", args.staging_buckets, "ckpt_save_staging_buckets")
      ->check(CLI::Range(0, 256));
  save->add_option("--seed", args.seed, "state seed");
  save->add_option("--repeat", args.repeat, "saves to run")->check(CLI::Range(1, 1000));
  save->add_flag("--baseline", args.baseline, "also time raw writes of the same bytes");
  save->add_flag("--async", args.async, "async_dist_ckpt_save: the caller waits only for staging (stall_s)");
  save->add_option("--compute-s", args.compute_s,
                   "seconds of simulated training between a save's return and the fence (fence_wait_s)")
      ->check(CLI::Range(0.0, 3600.0));
  save->add_flag("--per-save-staging", args.per_save, "ckpt_staging_memory: per_save (else persistent)");
  const stagehand::bench::BenchCommand load = stagehand::bench::add_load_command(app);
  try {
    app.parse(argc, argv);
    parse_size(args.bytes_per_rank);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::cerr << "stagehand-bench: bad --bytes-per-rank '" << args.bytes_per_rank << "'\n";
    return 2;
  }
  if (load.command->parsed()) return load.run();
  return run_save(args);
}
