#define BOOST_TEST_MODULE ckpt_tool
#include <boost/test/unit_test.hpp>

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <regex>

#include "bench/synthetic_state.hpp"
#include "stagehand/checkpoint/loader.hpp"
#include "tests/metadata_edit.hpp"
#include "tests/test_util.hpp"

using namespace stagehand;
using stagehand::test::TempDir;
using stagehand::test::edit_metadata;

namespace {

/// Where the programs are; STAGEHAND_BIN_DIR in the environment overrides the build's folder
/// (the GPU check runs the tests from an unpacked copy).
const std::string kBin = test::bin_dir();

std::string bench_save(const std::string& out) {
  return kBin + "/stagehand-bench save --out " + out +
         " --ranks 2 --bytes-per-rank 1M --tensors 8 --thread-count 3 --staging-buckets 1";
}

/// Whether every rank of the state bench_save saved loads from `ckpt` (resolved as the tool does).
bool every_rank_loads(const std::string& ckpt) {
  auto dir = resolve_checkpoint(ckpt);
  if (!dir.is_ok()) return false;
  for (int rank = 0; rank < 2; ++rank) {
    auto saved = make_synthetic_state({2, 1u << 20, 8, 1}, rank, Device::host());
    BOOST_REQUIRE(saved.is_ok());
    StateDict loaded = test::zeroed_like(*saved);
    loaded.objects = saved->objects;
    if (!load_checkpoint(*dir, loaded).is_ok()) return false;
  }
  return true;
}

/// Replaces the first match of `pattern` in a file's text.
void edit_text(const std::string& path, const std::string& pattern,
               const std::string& replacement) {
  std::string text = test::read_file(path);
  std::string out = std::regex_replace(text, std::regex(pattern), replacement,
                                       std::regex_constants::format_first_only);
  BOOST_REQUIRE_MESSAGE(out != text, "no match for " << pattern << " in " << path);
  std::ofstream(path, std::ios::binary) << out;
}

/// Replaces the first match of `pattern` in the JSON header of a safetensors file, keeping the
/// header's length (its padding absorbs the difference), so that only the header changes.
void edit_safetensors_header(const std::string& path, const std::string& pattern,
                             const std::string& replacement) {
  std::string bytes = test::read_file(path);
  BOOST_REQUIRE(bytes.size() >= 8);
  std::uint64_t len = 0;
  for (int i = 7; i >= 0; --i)
    len = len << 8 | static_cast<std::uint8_t>(bytes[static_cast<std::size_t>(i)]);
  std::string header = bytes.substr(8, len);
  std::string edited = std::regex_replace(header, std::regex(pattern), replacement,
                                          std::regex_constants::format_first_only);
  BOOST_REQUIRE_MESSAGE(edited != header, "no match for " << pattern);
  while (edited.size() > len && edited.back() == ' ')
    edited.pop_back();
  BOOST_REQUIRE(edited.size() <= len);
  edited.append(len - edited.size(), ' ');
  bytes.replace(8, len, edited);
  std::ofstream(path, std::ios::binary) << bytes;
}

}  // namespace

BOOST_AUTO_TEST_CASE(verify_accepts_a_good_checkpoint_and_inspect_lists_it) {
  TempDir dir;
  test::CommandRun save = test::run_command(bench_save(dir.path()));
  BOOST_REQUIRE_MESSAGE(save.code == 0, save.output);
  BOOST_TEST(save.output.find("\"host_staging_peak_bytes\"") != std::string::npos);
  test::CommandRun verify = test::run_command(kBin + "/stagehand-ckpt verify " + dir.path());
  BOOST_TEST(verify.code == 0, verify.output);
  BOOST_TEST(verify.output.find("OK") != std::string::npos);
  BOOST_TEST(every_rank_loads(dir.path()));
  test::CommandRun inspect = test::run_command(kBin + "/stagehand-ckpt inspect " + dir / "global_step_1");
  BOOST_TEST(inspect.code == 0);
  BOOST_TEST(inspect.output.find("layer0.param0") != std::string::npos);
  BOOST_TEST(inspect.output.find("__1_2.safetensors") != std::string::npos);
  BOOST_TEST(inspect.output.find("8 tensors") != std::string::npos, inspect.output);
}

BOOST_AUTO_TEST_CASE(verify_catches_a_flipped_byte_and_a_truncated_file) {
  for (std::string damage : {"flip", "truncate"}) {
    BOOST_TEST_CONTEXT(damage) {
      TempDir dir;
      BOOST_REQUIRE(test::run_command(bench_save(dir.path())).code == 0);
      std::string file = dir / "global_step_1/policy/__1_1.safetensors";
      auto size = std::filesystem::file_size(file);
      if (damage == "flip") {
        std::string bytes = test::read_file(file);
        bytes[bytes.size() - 100] ^= 1;
        std::ofstream(file, std::ios::binary) << bytes;
      } else {
        std::filesystem::resize_file(file, size - 1000);
      }
      test::CommandRun verify = test::run_command(kBin + "/stagehand-ckpt verify " + dir.path());
      BOOST_TEST(verify.code == 1, verify.output);
      BOOST_TEST(verify.output.find("__1_1.safetensors") != std::string::npos, verify.output);
      BOOST_TEST(verify.output.find("FAILED") != std::string::npos);
    }
  }
}

BOOST_AUTO_TEST_CASE(bad_paths_and_arguments_fail_clearly) {
  TempDir dir;
  test::CommandRun missing = test::run_command(kBin + "/stagehand-ckpt verify " + dir / "nothing");
  BOOST_TEST(missing.code == 2);
  BOOST_TEST(missing.output.find("is not a folder") != std::string::npos, missing.output);
  test::CommandRun empty = test::run_command(kBin + "/stagehand-ckpt inspect " + dir.path());
  BOOST_TEST(empty.code == 2);
  BOOST_TEST(empty.output.find("latest_ckpt_global_step.txt") != std::string::npos, empty.output);
  test::CommandRun bad_size = test::run_command(kBin + "/stagehand-bench save --out " + dir.path() + " --bytes-per-rank 5X");
  BOOST_TEST(bad_size.code != 0);
  BOOST_TEST(bad_size.output.find("--bytes-per-rank") != std::string::npos, bad_size.output);
  test::CommandRun bad_staging = test::run_command(kBin + "/stagehand-bench save --out " + dir.path() + " --thread-count 2 --staging-buckets 3");
  BOOST_TEST(bad_staging.code != 0);
  BOOST_TEST(bad_staging.output.find("ckpt_save_staging_buckets") != std::string::npos, bad_staging.output);
}

BOOST_AUTO_TEST_CASE(verify_fails_every_checkpoint_that_cannot_load) {
  for (std::string damage : {"duplicate", "remove", "rank", "step", "byte_range"}) {
    BOOST_TEST_CONTEXT(damage) {
      TempDir dir;
      BOOST_REQUIRE(test::run_command(bench_save(dir.path())).code == 0);
      std::string ckpt = dir / "global_step_1";
      std::string meta = ckpt + "/policy/metadata.json";
      if (damage == "duplicate" || damage == "remove" || damage == "rank") {
        edit_metadata(ckpt, [&](CheckpointMetadata& m) {
          auto& chunks = m.tensors.at("layer0.param0").chunks;
          BOOST_REQUIRE(chunks.size() == 2u);
          if (damage == "duplicate") chunks.push_back(chunks[0]);
          if (damage == "remove") chunks.pop_back();
          // The same elements and bytes, but one dimension instead of two.
          if (damage == "rank") chunks[0].shape = Shape{chunks[0].shape.numel()};
        });
      } else if (damage == "step") {
        edit_text(meta, R"("step": 1)", R"("step": 1.5)");
      } else {
        edit_text(meta, R"("byte_range": \[\s*(\d+))", R"("byte_range": [ $1.0)");
      }
      BOOST_TEST(!every_rank_loads(ckpt));
      test::CommandRun verify = test::run_command(kBin + "/stagehand-ckpt verify " + ckpt);
      BOOST_TEST(verify.code == 1, verify.output);
      BOOST_TEST(verify.output.find("FAILED") != std::string::npos, verify.output);
      BOOST_TEST(verify.output.find("metadata.json") != std::string::npos, verify.output);
      std::string named = damage == "step" || damage == "byte_range" ? damage : "layer0.param0";
      BOOST_TEST(verify.output.find(named) != std::string::npos, verify.output);
    }
  }
}

BOOST_AUTO_TEST_CASE(malformed_fields_are_errors_not_crashes) {
  struct Damage {
    std::string file;
    std::string pattern;
    std::string replacement;
    std::string named;
  };
  const Damage damages[] = {
      {"__1_1.safetensors", R"("data_offsets":\[(\d+),(\d+)\])", R"("data_offsets":["$1","$2"])",
       "data_offsets"},
      {"__1_1.safetensors", R"("data_offsets":\[(\d+),(\d+)\])",
       R"("data_offsets":{"a":$1,"b":$2})", "data_offsets"},
      {"__1_1.safetensors", R"("data_offsets":\[(\d+),)", R"("data_offsets":[1e300,)",
       "data_offsets"},
      // Found by safetensors_header_fuzz: a range that ends before it begins.
      {"__1_1.safetensors", R"("data_offsets":\[(\d+),(\d+)\])", R"("data_offsets":[$2,$1])",
       "data_offsets"},
      {"__1_1.safetensors", R"("dtype":"[A-Z0-9]+")", R"("dtype":7)", "dtype"},
      {"__1_1.safetensors", R"("shape":\[)", R"("shape":[4294967296,4294967296,)", "shape"},
      {"metadata.json", R"("format": "[a-z-]+")", R"("format": 5)", "format"},
      {"metadata.json", R"("version": 1)", R"("version": "1")", "version"},
      {"metadata.json", R"("objects": \{)", R"("objects": {"n": 5,)", "objects"},
      {"metadata.json", R"("file": "[^"]+")", R"("file": ["x"])", "file"},
      {"metadata.json", R"("tensors": \{)", R"("tensors": {"t": [],)", "tensors"},
  };
  for (const auto& damage : damages) {
    BOOST_TEST_CONTEXT(damage.file << ": " << damage.replacement) {
      TempDir dir;
      BOOST_REQUIRE(test::run_command(bench_save(dir.path())).code == 0);
      std::string path = dir / ("global_step_1/policy/" + damage.file);
      if (damage.file == "metadata.json") {
        edit_text(path, damage.pattern, damage.replacement);
      } else {
        edit_safetensors_header(path, damage.pattern, damage.replacement);
      }
      BOOST_TEST(!every_rank_loads(dir.path()));
      test::CommandRun verify = test::run_command(kBin + "/stagehand-ckpt verify " + dir.path());
      BOOST_TEST(verify.code == 1, verify.output);
      BOOST_TEST(verify.output.find(damage.file) != std::string::npos, verify.output);
      BOOST_TEST(verify.output.find(damage.named) != std::string::npos, verify.output);
      if (damage.file == "metadata.json") {
        test::CommandRun inspect =
            test::run_command(kBin + "/stagehand-ckpt inspect " + dir.path());
        BOOST_TEST(inspect.code == 2, inspect.output);
        BOOST_TEST(inspect.output.find(damage.named) != std::string::npos, inspect.output);
      }
    }
  }
}
