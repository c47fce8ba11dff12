// stagehand-ckpt: inspect and verify checkpoints.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>
#include <map>
#include <set>

#include "stagehand/checkpoint/format.hpp"
#include "stagehand/checkpoint/loader.hpp"

using namespace stagehand;

namespace {

std::string human_bytes(std::uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), unit == 0 ? "%.0f %s" : "%.1f %s", value, units[unit]);
  return buf;
}

int run_verify(const std::string& path) {
  auto dir = resolve_checkpoint(path);
  if (!dir.is_ok()) {
    std::cerr << "stagehand-ckpt verify: " << dir.status().message() << "\n";
    return 2;
  }
  auto result = verify_checkpoint(*dir);
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

int run_inspect(const std::string& path) {
  auto dir = resolve_checkpoint(path);
  if (!dir.is_ok()) {
    std::cerr << "stagehand-ckpt inspect: " << dir.status().message() << "\n";
    return 2;
  }
  auto metadata = read_checkpoint_metadata(*dir);
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
  return 0;
}

}  // namespace

constexpr const char* kPathHelp =
    "a checkpoint folder (global_step_N) or a ckpt_path with a tracker; local, or s3://bucket/prefix and "
    "gs://bucket/prefix with AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL, AWS_REGION";

int main(int argc, char** argv) {
  CLI::App app{"stagehand-ckpt: inspect and verify Stagehand checkpoints"};
  app.require_subcommand(1);
  std::string path;
  auto* verify = app.add_subcommand(
      "verify", "check the metadata and headers as a load does, and every file and chunk checksum");
  verify->add_option("path", path, kPathHelp)
      ->required();
  auto* inspect = app.add_subcommand("inspect", "list tensors, shards, bytes and files");
  inspect->add_option("path", path, kPathHelp)
      ->required();
  CLI11_PARSE(app, argc, argv);
  if (verify->parsed()) return run_verify(path);
  return run_inspect(path);
}
