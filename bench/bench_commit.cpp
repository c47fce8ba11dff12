// stagehand-bench commit: the coordinator's commit alone, at the rank count of a saved checkpoint.
#include "bench/bench_commit.hpp"

#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "bench/bench_util.hpp"
#include "stagehand/checkpoint/load/checkpoint_reader.hpp"
#include "stagehand/checkpoint/store/checkpoint_store.hpp"
#include "stagehand/checkpoint/format/format.hpp"
#include "stagehand/checkpoint/metadata/gather.hpp"
#include "stagehand/checkpoint/load/resolve.hpp"
#include "stagehand/core/priority.hpp"

namespace stagehand::bench {

namespace {

struct CommitArgs {
  std::string from;
  std::string out;
  int repeat = 5;
};

struct RankReports {
  std::vector<RankSaveReport> reports;
  /// Each rank's plan (by rank): a descriptor for each chunk, which the reports name by index.
  std::vector<std::vector<ShardedTensorDesc>> planned;
  /// The highest rank that wrote a file, plus one.
  int world_size = 0;
};

/// Each rank's report as that rank's strategy sent it, rebuilt from a committed checkpoint: a
/// bucket for each of the rank's files (`__<rank>_<bucket>.safetensors`), its chunks in file order.
Result<RankReports> reports_of(const CheckpointMetadata& m) {
  std::map<int, RankSaveReport> ranks;
  /// Each file's bucket and the rank that wrote it.
  std::map<std::string, std::pair<BucketWriteResult*, int>> buckets;
  for (const auto& [file, meta] : m.files) {
    int rank = -1;
    int bucket = -1;
    if (std::sscanf(file.c_str(), "__%d_%d.safetensors", &rank, &bucket) != 2 || rank < 0) {
      return Status{ErrorCode::invalid_argument, "file '" + file + "' is not named __<rank>_<bucket>.safetensors"};
    }
    RankSaveReport& r = ranks[rank];
    r.rank = rank;
    r.step = m.step;
    BucketWriteResult b;
    b.bucket = bucket;
    b.file = file;
    b.size = meta.size;
    b.xxh3 = meta.xxh3;
    r.buckets.push_back(std::move(b));
  }
  for (auto& [rank, r] : ranks) {
    for (auto& b : r.buckets) buckets[b.file] = {&b, rank};
    // An object named `<anything>.rank<r>` came from rank r alone; any other from every rank.
    const std::string suffix = ".rank" + std::to_string(rank);
    for (const auto& [name, value] : m.objects) {
      const bool per_rank = name.find(".rank") != std::string::npos;
      if (!per_rank || name.ends_with(suffix)) r.objects.emplace(name, value);
    }
  }
  RankReports encoded;
  if (!ranks.empty()) encoded.world_size = ranks.rbegin()->first + 1;
  encoded.planned.resize(static_cast<std::size_t>(encoded.world_size));
  for (const auto& [name, t] : m.tensors) {
    for (const auto& c : t.chunks) {
      auto [bucket, rank] = buckets.at(c.file);
      ShardedTensorDesc desc;
      desc.name = name;
      desc.dtype = t.dtype;
      desc.global_shape = t.global_shape;
      desc.global_offset = c.offsets;
      desc.local_shape = c.shape;
      auto& planned = encoded.planned.at(static_cast<std::size_t>(rank));
      planned.push_back(std::move(desc));
      ChunkRecord record;
      record.tensor = static_cast<std::uint32_t>(planned.size() - 1);
      record.begin = c.begin;
      record.end = c.end;
      record.xxh3 = c.xxh3;
      bucket->chunks.push_back(std::move(record));
    }
  }
  for (auto& [rank, r] : ranks) {
    for (auto& b : r.buckets) {
      std::sort(b.chunks.begin(), b.chunks.end(),
                [](const ChunkRecord& x, const ChunkRecord& y) { return x.begin < y.begin; });
    }
    encoded.reports.push_back(std::move(r));
  }
  return encoded;
}

/// Whether `inner` is `outer` or lies below it (after resolving `.`, `..` and links).
bool nested(const std::string& inner, const std::string& outer) {
  std::error_code ec;
  const auto a = std::filesystem::weakly_canonical(std::filesystem::absolute(inner, ec), ec);
  const auto b = std::filesystem::weakly_canonical(std::filesystem::absolute(outer, ec), ec);
  auto [end, rest] = std::mismatch(b.begin(), b.end(), a.begin(), a.end());
  return end == b.end();
}

int run_commit(const CommitArgs& args) {
  auto fail = [](const std::string& what) {
    std::cerr << "stagehand-bench commit: " << what << "\n";
    return 1;
  };
  FileSystem& fs = *local_file_system();
  auto dir = resolve_checkpoint(fs, args.from);
  if (!dir.is_ok()) return fail(dir.status().to_string());
  // --out is removed before every commit: it must hold nothing of the checkpoint it reads.
  // Nor may it lie in the root it came from (the scratch steps would sit among the real ones).
  if (nested(args.out, *dir) || nested(*dir, args.out) || nested(args.out, args.from)) {
    return fail("--out '" + args.out + "' and the checkpoint '" + *dir +
                "' lie inside one another: --out is removed before each commit, which would delete the checkpoint; "
                "give --out a scratch folder of its own");
  }
  auto metadata = read_checkpoint_metadata(fs, *dir);
  if (!metadata.is_ok()) return fail(metadata.status().to_string());
  auto encoded = reports_of(*metadata);
  if (!encoded.is_ok()) return fail(encoded.status().to_string());
  auto original = read_small_file(fs, CheckpointLayout::policy_dir(*dir) + "/" + kMetadataFile);
  if (!original.is_ok() || !*original) return fail("cannot read the checkpoint's metadata.json");
  const CheckpointStore store(local_file_system(), args.out);
  // A rank that wrote no file would not be reported: the commit names it as missing.
  const int world = encoded->world_size;
  for (int i = 0; i < args.repeat; ++i) {
    std::error_code ec;
    std::filesystem::remove_all(args.out, ec);
    auto policy = store.prepare(metadata->step);
    if (!policy.is_ok()) return fail(policy.status().to_string());
    // The reports as the coordinator holds them when the last one arrived (in one process they
    // come as they are; across processes CAF has decoded each on arrival).
    const std::vector<RankSaveReport>& reports = encoded->reports;
    const auto start = Clock::now();
    const double cpu_start = thread_cpu_seconds();
    std::vector<const std::vector<ShardedTensorDesc>*> planned;
    for (const auto& p : encoded->planned) planned.push_back(&p);
    auto gathered = gather_reports(metadata->step, reports, world, descriptors_by_rank(std::move(planned)));
    Status st = gathered.is_ok() ? store.commit(metadata->step, *gathered).status() : gathered.status();
    const double commit_s = seconds_since(start);
    const double commit_cpu_s = thread_cpu_seconds() - cpu_start;
    if (!st.is_ok()) return fail(st.to_string());
    auto written = read_small_file(fs, CheckpointLayout::policy_dir(store.step_dir(metadata->step)) + "/" + kMetadataFile);
    nlohmann::json line;
    line["mode"] = "commit";
    line["ranks"] = world;
    line["commit_s"] = commit_s;
    line["commit_cpu_s"] = commit_cpu_s;
    line["metadata_bytes"] = written.is_ok() && *written ? (*written)->size() : 0;
    // The text the save's coordinator wrote from the reports the ranks sent (the same code): a
    // difference would be a report rebuilt wrong here or a commit that is not deterministic.
    // That the text is the one older versions wrote is pinned_bytes_test's to show.
    line["same_metadata"] = written.is_ok() && *written == *original;
    std::cout << line.dump() << std::endl;
  }
  return 0;
}

}  // namespace

BenchCommand add_commit_command(CLI::App& app) {
  auto args = std::make_shared<CommitArgs>();
  auto* command = app.add_subcommand(
      "commit", "time the coordinator's commit (gather, metadata.json, renames, tracker) at the rank count "
                "of a checkpoint `save` wrote, from the reports its ranks sent");
  command->add_option("--from", args->from, "a checkpoint root or step folder that `stagehand-bench save` wrote")
      ->required();
  command->add_option("--out", args->out, "a scratch checkpoint root to commit into (removed first)")->required();
  command->add_option("--repeat", args->repeat, "commits to run")->check(CLI::Range(1, 1000));
  return {command, [args] { return run_commit(*args); }};
}

}  // namespace stagehand::bench
