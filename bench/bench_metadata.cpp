// stagehand-bench metadata: the time and heap each rank spends reading metadata.json on load.
#include "bench/bench_metadata.hpp"

#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "bench/bench_util.hpp"
#include "bench/heap_counter.hpp"
#include "stagehand/checkpoint/load/checkpoint_reader.hpp"
#include "stagehand/checkpoint/format/format.hpp"
#include "stagehand/checkpoint/load/resolve.hpp"
#include "stagehand/storage/file_system.hpp"

namespace stagehand::bench {

namespace {

struct MetadataArgs {
  std::string out;
  StateArgs state;
  /// Ranks measured reading the whole file each (the cost before parts); 0: none.
  int whole = 0;
};

/// One rank's read: seconds, and heap bytes above what the process held before it, at the
/// peak and after it (what the rank keeps).
struct RankRead {
  double seconds = 0;
  std::int64_t peak_bytes = 0;
  std::int64_t kept_bytes = 0;
};

template <typename Read>
Result<RankRead> measure(Read read) {
  const std::int64_t before = heap_bytes_now();
  reset_heap_peak();
  const auto start = Clock::now();
  auto metadata = read();
  RankRead r{seconds_since(start), heap_bytes_peak() - before, 0};
  if (!metadata.is_ok()) return metadata.status();
  r.kept_bytes = heap_bytes_now() - before;
  return r;
}

nlohmann::json figures(const char* how, int ranks, const std::vector<RankRead>& reads) {
  std::vector<double> seconds;
  std::vector<double> peaks;
  std::vector<double> kept;
  double total = 0;
  for (const auto& r : reads) {
    seconds.push_back(r.seconds);
    peaks.push_back(static_cast<double>(r.peak_bytes));
    kept.push_back(static_cast<double>(r.kept_bytes));
    total += r.seconds;
  }
  nlohmann::json line;
  line["mode"] = "metadata";
  line["read"] = how;
  line["ranks"] = ranks;
  line["ranks_measured"] = reads.size();
  line["first_rank_s"] = reads.front().seconds;
  line["first_rank_peak_bytes"] = reads.front().peak_bytes;
  line["median_rank_s"] = median(seconds);
  line["max_rank_s"] = *std::max_element(seconds.begin(), seconds.end());
  line["median_rank_peak_bytes"] = median(peaks);
  line["max_rank_peak_bytes"] = *std::max_element(peaks.begin(), peaks.end());
  line["median_rank_kept_bytes"] = median(kept);
  // Every rank's read, one after another; measured ranks stand for the others when sampled.
  line["total_s"] = total * ranks / static_cast<double>(reads.size());
  line["total_extrapolated"] = static_cast<int>(reads.size()) != ranks;
  return line;
}

int run_metadata(const MetadataArgs& args) {
  auto fail = [](const std::string& what) {
    std::cerr << "stagehand-bench metadata: " << what << "\n";
    return 1;
  };
  SyntheticStateSpec spec;
  try {
    spec = args.state.spec();
  } catch (const std::exception& e) {
    return fail("bad --bytes-per-rank '" + args.state.bytes_per_rank + "': " + e.what());
  }
  FileSystem& fs = *local_file_system();
  auto dir = resolve_checkpoint(fs, args.out);
  if (!dir.is_ok()) return fail(dir.status().to_string());
  std::error_code ec;
  const auto bytes =
      std::filesystem::file_size(CheckpointLayout::policy_dir(*dir) + "/" + kMetadataFile, ec);
  if (ec) return fail("cannot stat metadata.json: " + ec.message());
  std::vector<RankRead> parts;
  std::vector<RankRead> wholes;
  const int whole_every = args.whole > 0 ? std::max(1, spec.ranks / args.whole) : 0;
  for (int r = 0; r < spec.ranks; ++r) {
    auto state = make_synthetic_state(spec, r, Device::host());
    if (!state.is_ok()) return fail(state.status().to_string());
    auto part = measure([&] { return read_checkpoint_metadata_part(fs, *dir, *state); });
    if (!part.is_ok()) return fail(part.status().to_string());
    parts.push_back(*part);
    if (whole_every > 0 && r % whole_every == 0 && static_cast<int>(wholes.size()) < args.whole) {
      auto whole = measure([&] { return read_checkpoint_metadata(fs, *dir); });
      if (!whole.is_ok()) return fail(whole.status().to_string());
      wholes.push_back(*whole);
    }
  }
  for (const auto& [how, reads] : {std::pair{"part", &parts}, std::pair{"whole", &wholes}}) {
    if (reads->empty()) continue;
    nlohmann::json line = figures(how, spec.ranks, *reads);
    line["metadata_bytes"] = bytes;
    std::cout << line.dump() << std::endl;
  }
  return 0;
}

}  // namespace

BenchCommand add_metadata_command(CLI::App& app) {
  auto args = std::make_shared<MetadataArgs>();
  auto* command = app.add_subcommand("metadata",
                                     "time and heap each rank spends reading the metadata of the "
                                     "checkpoint `save` left under --out");
  command
      ->add_option("--out", args->out,
                   "checkpoint root that `stagehand-bench save` wrote (a local folder)")
      ->required();
  add_state_options(command, args->state, "as the save's");
  command
      ->add_option("--whole", args->whole,
                   "also measure this many ranks, spread evenly, each reading and checking all of "
                   "metadata.json")
      ->check(CLI::Range(0, 1024));
  return {command, [args] { return run_metadata(*args); }};
}

}  // namespace stagehand::bench
