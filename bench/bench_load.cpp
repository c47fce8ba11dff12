// stagehand-bench load: loads the checkpoint `stagehand-bench save` left, through the dispatch,
// against plain parallel reads of the same files.
#include "bench/bench_load.hpp"

#include <caf/all.hpp>
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "bench/bench_util.hpp"
#include "bench/synthetic_state.hpp"
#include "stagehand/actors/dispatch_client.hpp"
#include "stagehand/checkpoint/load/checkpoint_reader.hpp"
#include "stagehand/checkpoint/format/format.hpp"
#include "stagehand/checkpoint/load/resolve.hpp"
#include "stagehand/core/device.hpp"
#include "stagehand/core/host_buffer.hpp"
#include "stagehand/core/xxh3.hpp"
#include "stagehand/storage/default_file_system.hpp"
#include "stagehand/strategy/messages.hpp"

namespace stagehand::bench {

namespace {

struct LoadArgs {
  std::string out;
  StateArgs state;
  int thread_count = kDefaultLoadThreadCount;
  int repeat = 1;
  bool cold = false;
};

/// fsyncs each file, then drops its pages from the page cache, so that the next read comes from
/// the disk.
Status drop_from_page_cache(const std::vector<std::string>& files) {
  for (const auto& path : files) {
    int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) return Status::from_errno(errno, "cannot open '" + path + "'");
    int synced = ::fsync(fd);
    int advised = synced == 0 ? ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) : 0;
    ::close(fd);
    if (synced != 0) return Status::from_errno(errno, "fsync of '" + path + "'");
    if (advised != 0) return Status::from_errno(advised, "posix_fadvise of '" + path + "'");
  }
  return Status::ok();
}

constexpr std::size_t kRawRead = 16u << 20;

/// Reads every byte of `files` plainly on one thread per buffer: 64 MiB ranges taken in file
/// order, each read with preads of 16 MiB into the thread's buffer (allocated once by the
/// caller, so that repeated runs do not grow the heap). With `hash`, each read is hashed (XXH3)
/// as it lands: the least a load that checks every byte must do. With `placed` (one buffer per
/// file, as long as it, written before), each read lands at its own place in its file's buffer
/// instead, as a load's bytes land in the tensors: the threads' buffers are reused 16 MiB at a
/// time and stay partly in the cores' caches, which no read of a whole state into memory of its
/// own can do.
Result<double> raw_read_seconds(const std::vector<std::string>& files, std::vector<HostBuffer>& buffers,
                                bool hash = false, std::vector<HostBuffer>* placed = nullptr) {
  constexpr std::uint64_t kRange = 64u << 20;
  constexpr std::size_t kRead = kRawRead;
  const int threads = static_cast<int>(buffers.size());
  struct Range {
    std::size_t file;
    std::uint64_t begin;
    std::uint64_t end;
  };
  std::vector<std::unique_ptr<ReadableFile>> open;
  std::vector<Range> ranges;
  for (std::size_t f = 0; f < files.size(); ++f) {
    SH_ASSIGN_OR_RETURN(auto file, local_file_system()->open_file(files[f]));
    const std::uint64_t size = file->size();
    open.push_back(std::move(file));
    for (std::uint64_t b = 0; b < size; b += kRange) ranges.push_back({f, b, std::min(size, b + kRange)});
  }
  std::atomic<std::size_t> next{0};
  std::atomic<std::uint64_t> sink{0};  // an atomic the hashes go into: they are not optimized away
  std::vector<Status> results(static_cast<std::size_t>(threads));
  auto start = Clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      HostBuffer& buffer = buffers[static_cast<std::size_t>(t)];
      for (std::size_t i = next++; i < ranges.size(); i = next++) {
        const Range& r = ranges[i];
        for (std::uint64_t at = r.begin; at < r.end; at += kRead) {
          const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(kRead, r.end - at));
          std::uint8_t* into = placed != nullptr ? (*placed)[r.file].data() + at : buffer.data();
          Status st = open[r.file]->read(at, into, n);
          if (!st.is_ok()) {
            results[static_cast<std::size_t>(t)] = st;
            return;
          }
          if (hash) sink ^= xxh3(into, n);
        }
      }
    });
  }
  for (auto& t : pool) t.join();
  double elapsed = seconds_since(start);
  for (const auto& st : results) SH_RETURN_IF_ERROR(st);
  return elapsed;
}

/// XXH3 of each tensor's bytes (copied to the host first when on a device).
Result<std::vector<std::uint64_t>> tensor_hashes(const StateDict& state) {
  std::vector<std::uint64_t> hashes;
  for (const auto& t : state.tensors) {
    if (!t.tensor.device().is_cuda()) {
      hashes.push_back(xxh3(t.tensor.data(), t.tensor.nbytes()));
      continue;
    }
    HostBuffer host(t.tensor.nbytes(), false, nullptr);
    SH_RETURN_IF_ERROR(t.tensor.copy_to_host(host.data()));
    hashes.push_back(xxh3(host.data(), host.size()));
  }
  return hashes;
}

/// Overwrites every tensor with zeros, so that a load that does not write a byte is caught.
Status scribble(StateDict& state) {
  for (auto& t : state.tensors) {
    if (!t.tensor.device().is_cuda()) {
      std::fill_n(static_cast<std::uint8_t*>(t.tensor.data()), t.tensor.nbytes(), std::uint8_t{0});
      continue;
    }
    HostBuffer zeros(t.tensor.nbytes(), false, nullptr);
    std::fill_n(zeros.data(), zeros.size(), std::uint8_t{0});
    SH_RETURN_IF_ERROR(t.tensor.copy_from_host(zeros.data()));
  }
  return Status::ok();
}

int fail(const std::string& what, int code = 1) {
  std::cerr << "stagehand-bench load: " << what << "\n";
  return code;
}

int run_load(const LoadArgs& args) {
  FileSystem& fs = *local_file_system();
  if (!default_file_system()->capabilities(args.out).directories) {
    return fail("--out must be a local folder (the raw reads and --cold need files)", 2);
  }
  SyntheticStateSpec spec;
  try {
    spec = args.state.spec();
  } catch (const std::exception& e) {
    return fail("bad --bytes-per-rank '" + args.state.bytes_per_rank + "': " + e.what(), 2);
  }
  auto dir = resolve_checkpoint(fs, args.out);
  if (!dir.is_ok()) return fail(dir.status().to_string(), 2);
  auto metadata = read_checkpoint_metadata(fs, *dir);
  if (!metadata.is_ok()) return fail(metadata.status().to_string(), 2);
  std::vector<std::string> files;
  std::vector<std::uint64_t> file_sizes;
  std::uint64_t file_bytes = 0;
  for (const auto& [name, file] : metadata->files) {
    files.push_back(CheckpointLayout::policy_dir(*dir) + "/" + name);
    file_sizes.push_back(file.size);
    file_bytes += file.size;
  }

  // The live state: the same synthetic state the save wrote, its tensors' hashes kept to check
  // each load against.
  std::vector<std::shared_ptr<StateDict>> live;
  std::vector<std::vector<std::uint64_t>> expected;
  std::vector<std::unique_ptr<Checkpointable>> ranks;
  std::uint64_t state_bytes = 0;
  for (int r = 0; r < spec.ranks; ++r) {
    auto state = make_synthetic_state(spec, r, default_device(r));
    if (!state.is_ok()) return fail(state.status().to_string(), 2);
    auto hashes = tensor_hashes(*state);
    if (!hashes.is_ok()) return fail(hashes.status().to_string(), 2);
    expected.push_back(std::move(*hashes));
    for (const auto& t : state->tensors) state_bytes += t.tensor.nbytes();
    live.push_back(std::make_shared<StateDict>(std::move(*state)));
    ranks.push_back(checkpointable_state(live.back()));
  }

  caf::actor_system_config cfg;
  register_stagehand_errors(cfg);
  caf::actor_system system{cfg};
  CheckpointClusterOptions options;
  options.coordinator.destination = args.out;
  options.strategy.load_thread_count = args.thread_count;
  // No save runs here: no staging buffers held, so that the host figures are the load's.
  options.strategy.staging_per_save = true;
  options.timeout = std::chrono::minutes(30);
  auto cluster = CheckpointCluster::spawn(system, std::move(ranks), options);
  if (!cluster.is_ok()) return fail(cluster.status().to_string(), 2);
  DispatchClient& client = (*cluster)->client();

  std::vector<HostBuffer> raw_buffers;
  for (int t = 0; t < args.thread_count; ++t) {
    raw_buffers.emplace_back(kRawRead, false, nullptr);
    if (!raw_buffers.back().valid()) return fail("cannot allocate the raw read buffers");
    // Written once here, so that no raw read times the page faults of its buffer's first touch
    // (the load reads into the state's tensors, which are in memory already).
    std::memset(raw_buffers.back().data(), 0, raw_buffers.back().size());
  }
  // One buffer per file, for the reads that place every byte (written once here too).
  std::vector<HostBuffer> placed_buffers;
  for (std::uint64_t size : file_sizes) {
    placed_buffers.emplace_back(static_cast<std::size_t>(size), false, nullptr);
    if (!placed_buffers.back().valid()) return fail("cannot allocate the placed raw read buffers");
    std::memset(placed_buffers.back().data(), 0, placed_buffers.back().size());
  }
  if (!args.cold) {
    // Warm: every file in the page cache before the first timed read or load (the save wrote
    // its new files around the cache: megatron_config.ckpt_save_uncached).
    auto warmed = raw_read_seconds(files, raw_buffers, /*hash=*/false, nullptr);
    if (!warmed.is_ok()) return fail("warming read: " + warmed.status().to_string());
  }
  std::vector<double> loads;
  std::vector<double> raws;
  std::vector<double> hasheds;
  std::vector<double> placeds;
  std::vector<double> placed_hasheds;
  std::vector<double> reads;
  std::vector<double> verifies;
  std::vector<double> copies;
  for (int k = 0; k < args.repeat; ++k) {
    for (auto& state : live) {
      Status st = scribble(*state);
      if (!st.is_ok()) return fail(st.to_string());
    }
    // Alternate which goes first, so that neither always follows the other.
    double raw_s = 0;
    double hashed_s = 0;
    double placed_s = 0;
    double placed_hashed_s = 0;
    double load_s = 0;
    std::size_t staged_before = 0;
    LoadReport timing;
    for (int order = 0; order < 2; ++order) {
      const bool raw_now = (order == 0) == (k % 2 == 0);
      if (args.cold) {
        Status dropped = drop_from_page_cache(files);
        if (!dropped.is_ok()) return fail(dropped.to_string());
      }
      if (raw_now) {
        // Four reads (cold: each from the disk): into the threads' buffers and into places of
        // their own, each plain and hashed.
        double* seconds[4] = {&raw_s, &hashed_s, &placed_s, &placed_hashed_s};
        for (int kind = 0; kind < 4; ++kind) {
          if (args.cold && kind > 0) {
            Status dropped = drop_from_page_cache(files);
            if (!dropped.is_ok()) return fail(dropped.to_string());
          }
          auto raw = raw_read_seconds(files, raw_buffers, /*hash=*/kind % 2 == 1, kind >= 2 ? &placed_buffers : nullptr);
          if (!raw.is_ok()) return fail("raw read: " + raw.status().to_string());
          *seconds[kind] = *raw;
        }
        continue;
      }
      staging_memory().reset_peak();
      staged_before = staging_memory().current();
      auto start = Clock::now();
      auto loaded = client.load(*dir);
      load_s = seconds_since(start);
      if (!loaded.is_ok()) return fail("load failed: " + loaded.status().to_string());
      timing = std::move(*loaded);
    }
    for (std::size_t r = 0; r < live.size(); ++r) {
      auto hashes = tensor_hashes(*live[r]);
      if (!hashes.is_ok()) return fail(hashes.status().to_string());
      for (std::size_t i = 0; i < hashes->size(); ++i) {
        if ((*hashes)[i] != expected[r][i]) {
          return fail("rank " + std::to_string(r) + " tensor '" + live[r]->tensors[i].desc.name +
                      "' does not hold the saved values after the load");
        }
      }
    }
    loads.push_back(load_s);
    raws.push_back(raw_s);
    hasheds.push_back(hashed_s);
    placeds.push_back(placed_s);
    placed_hasheds.push_back(placed_hashed_s);
    reads.push_back(timing.read_s);
    verifies.push_back(timing.verify_s);
    copies.push_back(timing.copy_s);
    nlohmann::json line = bench_line("load", k, spec.ranks, args.thread_count);
    line["cold"] = args.cold;
    line["bytes"] = timing.bytes;
    line["file_bytes"] = file_bytes;
    line["load_s"] = load_s;
    line["raw_read_s"] = raw_s;
    line["load_speed_vs_raw"] = raw_s / load_s;
    line["raw_read_hashed_s"] = hashed_s;
    line["load_speed_vs_raw_hashed"] = hashed_s / load_s;
    line["raw_read_placed_s"] = placed_s;
    line["load_speed_vs_raw_placed"] = placed_s / load_s;
    line["raw_read_placed_hashed_s"] = placed_hashed_s;
    line["load_speed_vs_raw_placed_hashed"] = placed_hashed_s / load_s;
    line["throughput_gbps"] = static_cast<double>(timing.bytes) / load_s / 1e9;
    line["raw_read_gbps"] = static_cast<double>(file_bytes) / raw_s / 1e9;
    line["loader_s"] = timing.total_s;
    line["read_s"] = timing.read_s;
    line["verify_s"] = timing.verify_s;
    line["copy_s"] = timing.copy_s;
    line["host_buffer_peak_bytes"] = staging_memory().peak() - staged_before;
    line["state_bytes"] = state_bytes;
    line["rss_bytes"] = current_rss_bytes();
    line["max_rss_bytes"] = max_rss_bytes();
    line["values_checked"] = true;
    std::cout << line.dump() << std::endl;
  }
  nlohmann::json summary;
  summary["summary"] = true;
  summary["mode"] = "load";
  summary["cold"] = args.cold;
  summary["repeats"] = args.repeat;
  summary["median_load_s"] = median(loads);
  summary["median_raw_read_s"] = median(raws);
  summary["load_speed_vs_raw"] = median(raws) / median(loads);
  summary["median_raw_read_hashed_s"] = median(hasheds);
  summary["load_speed_vs_raw_hashed"] = median(hasheds) / median(loads);
  summary["median_raw_read_placed_s"] = median(placeds);
  summary["load_speed_vs_raw_placed"] = median(placeds) / median(loads);
  summary["median_raw_read_placed_hashed_s"] = median(placed_hasheds);
  summary["load_speed_vs_raw_placed_hashed"] = median(placed_hasheds) / median(loads);
  summary["median_read_s"] = median(reads);
  summary["median_verify_s"] = median(verifies);
  summary["median_copy_s"] = median(copies);
  summary["max_rss_bytes"] = max_rss_bytes();
  summary["state_bytes"] = state_bytes;
  std::cout << summary.dump() << std::endl;
  return (*cluster)->shutdown().is_ok() ? 0 : 1;
}

}  // namespace

BenchCommand add_load_command(CLI::App& app) {
  auto args = std::make_shared<LoadArgs>();
  auto* load = app.add_subcommand(
      "load", "load the checkpoint `save` left under --out through the dispatch, against raw reads of its files");
  load->add_option("--out", args->out, "checkpoint root that `stagehand-bench save` wrote (a local folder)")
      ->required();
  add_state_options(load, args->state, "as the save's");
  load->add_option("--thread-count", args->thread_count, "ckpt_load_thread_count, and the raw reads' threads")
      ->check(CLI::Range(1, 256));
  load->add_option("--repeat", args->repeat, "loads to run")->check(CLI::Range(1, 1000));
  load->add_flag("--cold", args->cold, "drop the files from the page cache before each load and raw read");
  return {load, [args] { return run_load(*args); }};
}

}  // namespace stagehand::bench
