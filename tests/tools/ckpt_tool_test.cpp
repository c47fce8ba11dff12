#define BOOST_TEST_MODULE ckpt_tool
#include <boost/test/unit_test.hpp>

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "stagehand/checkpoint/loader.hpp"
#include "tests/test_util.hpp"

using namespace stagehand;
using stagehand::test::TempDir;

namespace {


/// Where the programs are; STAGEHAND_BIN_DIR in the environment overrides the build's folder
/// (the GPU check runs the tests from an unpacked copy).
const std::string kBin = test::bin_dir();

std::string bench_save(const std::string& out) {
  return kBin + "/stagehand-bench save --out " + out +
         " --ranks 2 --bytes-per-rank 1M --tensors 8 --thread-count 3 --staging-buckets 1";
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
