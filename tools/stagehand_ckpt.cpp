// stagehand-ckpt: inspect, verify, export and copy checkpoints.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>

#include "stagehand/checkpoint/load/checkpoint_reader.hpp"
#include "stagehand/checkpoint/interop/export.hpp"
#include "stagehand/checkpoint/format/format.hpp"
#include "stagehand/checkpoint/load/resolve.hpp"
#include "stagehand/checkpoint/tiers/tier_copy.hpp"
#include "stagehand/checkpoint/load/verify.hpp"
#include "stagehand/storage/default_file_system.hpp"
#include "stagehand/core/progress_meter.hpp"

using namespace stagehand;

namespace {

/// Ranks whose data files (`__{rank}_{bucket}.safetensors`) the checkpoint lists.
std::set<int> writing_ranks(const CheckpointMetadata& m) {
  static const std::regex kBucketFile(R"(__(\d+)_\d+\.safetensors)");
  std::set<int> ranks;
  std::smatch match;
  for (const auto& [name, file] : m.files) {
    if (std::regex_match(name, match, kBucketFile)) ranks.insert(std::stoi(match[1].str()));
  }
  return ranks;
}

/// The trainer that wrote the checkpoint and the layout it was saved with, from trainer_state.json.
void print_provenance(FileSystem& fs, const std::string& dir, const CheckpointMetadata& m) {
  std::printf("\nranks that wrote files: %zu\n", writing_ranks(m).size());
  auto text = read_trainer_state_text(fs, dir, m);
  if (!text.is_ok()) {
    std::printf("trainer: not recorded (%s)\nlayout: not recorded\n",
                text.status().code() == ErrorCode::not_found ? "no trainer_state.json"
                                                             : text.status().message().c_str());
    return;
  }
  const auto state = nlohmann::json::parse(*text, nullptr, false);
  const auto kind = state.is_object() ? state.find("kind") : state.end();
  std::printf("trainer: %s\n", kind != state.end() && kind->is_string()
                                   ? kind->get<std::string>().c_str()
                                   : "not recorded");
  const auto layout = state.is_object() ? state.find("layout") : state.end();
  if (layout == state.end() || !layout->is_object()) {
    std::printf("layout: not recorded\n");
    return;
  }
  auto size = [&](const char* key) {
    auto v = layout->find(key);
    return v != layout->end() && v->is_number_integer() ? std::to_string(v->get<long long>())
                                                        : std::string("?");
  };
  std::printf("layout: tensor_parallel %s x data_parallel %s\n", size("tensor_parallel").c_str(),
              size("data_parallel").c_str());
}

int run_verify(FileSystem& fs, const std::string& path, ProgressMeter::Mode progress) {
  auto dir = resolve_checkpoint(fs, path);
  if (!dir.is_ok()) {
    std::cerr << "stagehand-ckpt verify: " << dir.status().message() << "\n";
    return 2;
  }
  ProgressMeter meter(progress);
  auto result = verify_checkpoint(fs, *dir, meter.reporter());
  meter.finish();
  if (!result.is_ok()) {
    std::cerr << "stagehand-ckpt verify: " << result.status().message() << "\n";
    return 2;
  }
  for (const auto& p : result->problems) std::cerr << "FAIL " << p << "\n";
  std::cout << (result->ok() ? "OK " : "FAILED ") << *dir << ": " << result->files_checked
            << " files, " << result->chunks_checked << " chunks, " << human_bytes(result->bytes_checked)
            << " checked, " << result->problems.size() << " problems\n";
  return result->ok() ? 0 : 1;
}

int run_inspect(FileSystem& fs, const std::string& path) {
  auto dir = resolve_checkpoint(fs, path);
  if (!dir.is_ok()) {
    std::cerr << "stagehand-ckpt inspect: " << dir.status().message() << "\n";
    return 2;
  }
  auto metadata = read_checkpoint_metadata(fs, *dir);
  if (!metadata.is_ok()) {
    std::cerr << "stagehand-ckpt inspect: " << metadata.status().message() << "\n";
    return 2;
  }
  const auto& m = *metadata;
  std::printf("checkpoint %s (step %lld, %s v%d)\n\n", dir->c_str(), static_cast<long long>(m.step),
              kFormatName, kFormatVersion);
  std::printf("%-40s %-5s %-20s %6s %12s\n", "tensor", "dtype", "global shape", "shards", "bytes");
  std::uint64_t total = 0;
  for (const auto& [name, t] : m.tensors) {
    std::uint64_t bytes = 0;
    for (const auto& c : t.chunks) bytes += c.end - c.begin;
    total += bytes;
    std::printf("%-40s %-5s %-20s %6zu %12s\n", name.c_str(), std::string(dtype_name(t.dtype)).c_str(),
                t.global_shape.to_string().c_str(), t.chunks.size(), human_bytes(bytes).c_str());
  }
  std::printf("\n%-40s %12s %18s\n", "file", "size", "xxh3");
  std::uint64_t file_total = 0;
  for (const auto& [name, f] : m.files) {
    file_total += f.size;
    std::printf("%-40s %12s %18s\n", name.c_str(), human_bytes(f.size).c_str(), xxh3_hex(f.xxh3).c_str());
  }
  std::printf("\n%zu tensors, %s of tensor data, %zu files, %s on disk, %zu objects\n", m.tensors.size(),
              human_bytes(total).c_str(), m.files.size(), human_bytes(file_total).c_str(),
              m.objects.size());
  for (const auto& [name, value] : m.objects) {
    std::printf("  object %s: %zu bytes\n", name.c_str(), value.size());
  }
  print_provenance(fs, *dir, m);
  return 0;
}

int run_export(FileSystem& fs, const std::string& checkpoint, const std::string& out, const std::string& what,
               const std::string& dtype, const std::string& max_shard_size, int threads,
               ProgressMeter::Mode progress) {
  ExportOptions options;
  options.what = what == "all" ? ExportOptions::What::all : ExportOptions::What::model;
  if (dtype == "bf16") options.dtype = DType::bf16;
  if (dtype == "fp32") options.dtype = DType::f32;
  auto max_bytes = parse_byte_size(max_shard_size);
  if (!max_bytes.is_ok()) {
    std::cerr << "stagehand-ckpt export: --max-shard-size: " << max_bytes.status().message()
              << "\n";
    return 2;
  }
  options.max_shard_bytes = *max_bytes;
  options.thread_count = threads;
  ProgressMeter meter(progress);
  options.progress = meter.reporter();
  ExportReport report;
  Status status = export_checkpoint(fs, checkpoint, out, options, &report);
  meter.finish();
  if (!status.is_ok()) {
    std::cerr << "stagehand-ckpt export: " << status.message() << "\n";
    return 1;
  }
  std::printf(
      "exported %llu tensors, %s, into %llu files in %s in %.2f s (largest tensor %s, buffers at "
      "most %s)\n",
      static_cast<unsigned long long>(report.tensors), human_bytes(report.bytes).c_str(),
      static_cast<unsigned long long>(report.files), out.c_str(), report.total_s,
      human_bytes(report.largest_tensor_bytes).c_str(),
      human_bytes(report.buffer_peak_bytes).c_str());
  for (const auto& file : report.files_written)
    std::printf("  %s\n", file.c_str());
  return 0;
}

int run_copy(const std::shared_ptr<FileSystem>& fs, const std::string& from_root, const std::string& to_root,
             std::optional<std::int64_t> step, int threads, ProgressMeter::Mode progress) {
  auto fail = [](const Status& st) {
    std::cerr << "stagehand-ckpt copy: " << st.message() << "\n";
    return st.code() == ErrorCode::corruption ? 1 : 2;
  };
  const CheckpointStore from(fs, from_root);
  const CheckpointStore to(fs, to_root);
  if (!step) {
    auto tracked = from.tracker();
    if (!tracked.is_ok()) return fail(tracked.status());
    if (!*tracked) {
      return fail(Status{ErrorCode::not_found, "'" + from.layout().tracker() +
                                                   "' does not exist: name the step to copy with --step"});
    }
    step = **tracked;
  }
  // The tracker moves to the copied step: never back past a newer one.
  auto there = to.tracker();
  if (!there.is_ok()) return fail(there.status());
  if (*there && **there > *step) {
    return fail(Status{ErrorCode::invalid_argument,
                       "the tracker of '" + to.root() + "' names step " + std::to_string(**there) + ", newer than step " +
                           std::to_string(*step) + ": copying it there would move the tracker back; copy it into "
                           "another root"});
  }
  auto lock = to.lock();
  if (!lock.is_ok()) return fail(lock.status());
  TierCopyOptions options;
  options.threads = threads;
  options.low_priority = false;
  ProgressMeter meter(progress);
  options.progress = meter.reporter();
  auto report = copy_committed_step(from, to, *step, options);
  meter.finish();
  if (!report.is_ok()) return fail(report.status());
  std::printf("copied step %lld from %s to %s: %llu files, %s in %.2f s (copy %.2f s, read back and checked %.2f s, "
              "commit %.2f s)%s\n",
              static_cast<long long>(*step), from.root().c_str(), to.step_dir(*step).c_str(),
              static_cast<unsigned long long>(report->files), human_bytes(report->bytes).c_str(), report->total_s,
              report->copy_s, report->verify_s, report->commit_s,
              report->replaced ? "; the step committed there before was replaced" : "");
  return 0;
}

}  // namespace

constexpr const char* kPathHelp =
    "a checkpoint folder (global_step_N) or a ckpt_path with a tracker; local, or s3://bucket/prefix and "
    "gs://bucket/prefix with AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL, AWS_REGION";

int main(int argc, char** argv) {
  CLI::App app{"stagehand-ckpt: inspect, verify, export and copy Stagehand checkpoints"};
  app.require_subcommand(1);
  std::string path;
  auto* verify = app.add_subcommand(
      "verify", "check the metadata and headers as a load does, and every file and chunk checksum");
  verify->add_option("path", path, kPathHelp)
      ->required();
  auto* inspect = app.add_subcommand("inspect",
                                     "list tensors, shards, bytes and files, the trainer that "
                                     "wrote the checkpoint and its layout");
  inspect->add_option("path", path, kPathHelp)
      ->required();
  auto* export_cmd = app.add_subcommand(
      "export",
      "write consolidated full tensors with plain names in the Hugging Face layout "
      "(model.safetensors, or "
      "numbered shards and model.safetensors.index.json), verifying every chunk read");
  export_cmd->add_option("checkpoint", path, kPathHelp)->required();
  std::string out;
  export_cmd
      ->add_option("out", out, "a new local folder (one that does not exist, or an empty one)")
      ->required();
  std::string what = "model";
  export_cmd
      ->add_option("--what", what,
                   "model: the tensors named model.*; all: every tensor, optimizer state too")
      ->check(CLI::IsMember({"model", "all"}))
      ->capture_default_str();
  std::string dtype = "as-saved";
  export_cmd
      ->add_option("--dtype", dtype,
                   "floating point tensors as saved, or converted (round to nearest even)")
      ->check(CLI::IsMember({"as-saved", "bf16", "fp32"}))
      ->capture_default_str();
  std::string max_shard_size = "5GiB";
  export_cmd
      ->add_option("--max-shard-size", max_shard_size, "largest file: 5GB, 500MB, 2GiB, or bytes")
      ->capture_default_str();
  int threads = ExportOptions{}.thread_count;
  export_cmd->add_option("--threads", threads, "reads in flight at once")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  auto* copy = app.add_subcommand(
      "copy", "copy a committed step from one checkpoint root into another (a folder or an object store), hashing "
              "every file as it is read and again as read back, then commit it there (metadata, tracker last)");
  std::string to_root;
  copy->add_option("from", path, "the checkpoint root to copy from (the folder or URL of its tracker)")->required();
  copy->add_option("to", to_root, "the checkpoint root to copy into (created when missing; its lock is taken)")
      ->required();
  std::optional<std::int64_t> step;
  copy->add_option("--step", step, "the step to copy (default: the one the tracker of 'from' names)")
      ->check(CLI::NonNegativeNumber);
  int copy_threads = TierCopyOptions{}.threads;
  copy->add_option("--threads", copy_threads, "files copied at once")->check(CLI::Range(1, 256))->capture_default_str();
  std::string progress = "auto";
  for (CLI::App* command : {verify, export_cmd, copy}) {
    command
        ->add_option("--progress", progress,
                     "a progress line on stderr: auto (on a terminal, once the command has run a second), always, "
                     "never")
        ->check(CLI::IsMember({"auto", "always", "never"}))
        ->capture_default_str();
  }
  CLI11_PARSE(app, argc, argv);
  const auto fs = default_file_system();
  const ProgressMeter::Mode mode = ProgressMeter::parse_mode(progress);
  if (verify->parsed()) return run_verify(*fs, path, mode);
  if (export_cmd->parsed()) return run_export(*fs, path, out, what, dtype, max_shard_size, threads, mode);
  if (copy->parsed()) return run_copy(fs, path, to_root, step, copy_threads, mode);
  return run_inspect(*fs, path);
}
