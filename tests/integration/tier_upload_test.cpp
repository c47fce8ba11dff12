// copy_committed_step, the durable tier's filling from the local one: a copy counts only whole
// and checked, whatever the store, the network or the power does halfway.
#define BOOST_TEST_MODULE tier_upload
#include <boost/test/unit_test.hpp>
#include <caf/all.hpp>

#include <atomic>
#include <filesystem>
#include <fstream>

#include "bench/synthetic_state.hpp"
#include "stagehand/checkpoint/store/checkpoint_store.hpp"
#include "stagehand/checkpoint/tiers/tier_copy.hpp"
#include "stagehand/checkpoint/load/verify.hpp"
#include "stagehand/storage/default_file_system.hpp"
#include "tests/fault_fs.hpp"
#include "tests/s3_test_util.hpp"
#include "tests/strategy_cluster.hpp"
#include "tests/test_util.hpp"

using namespace stagehand;
using namespace stagehand::test;
namespace fs = std::filesystem;

namespace {

constexpr const char* kBucket = "tier-bucket";

/// Committed steps 1 and 2 of a synthetic 2-rank state in the local root `root`.
void save_two_steps(const std::string& root, const SyntheticStateSpec& spec) {
  StrategyCluster cluster(root, {spec, false, 4});
  for (std::int64_t step : {1, 2}) {
    auto saved = cluster.client->save(step, "{\"step\": " + std::to_string(step) + "}\n");
    BOOST_REQUIRE_MESSAGE(saved.is_ok(), saved.status().to_string());
  }
}

void expect_verifies(FileSystem& fs, const std::string& dir) {
  auto verified = verify_checkpoint(fs, dir);
  BOOST_REQUIRE_MESSAGE(verified.is_ok(), verified.status().to_string());
  BOOST_TEST(verified->ok(), dir << ": " << (verified->problems.empty() ? "" : verified->problems.front()));
}

const SyntheticStateSpec kSmall{2, 1u << 20, 8, 5};

/// Step `step` of `to` verifies and holds every file of `from`'s, byte for byte.
void expect_copy_of(const CheckpointStore& from, const CheckpointStore& to, std::int64_t step) {
  expect_verifies(to.fs(), to.step_dir(step));
  for (const auto& [name, bytes] : files_of(from.step_dir(step))) {
    BOOST_TEST((read_file(to.step_dir(step) + "/" + name) == bytes), name);
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_copy_is_checked_against_the_metadata_and_read_back_before_it_counts) {
  TempDir dir;
  save_two_steps(dir / "local", kSmall);
  const auto local = local_file_system();
  const CheckpointStore from(local, dir / "local");

  // A clean copy: every file, then the metadata and tracker; the copy verifies.
  const CheckpointStore to(local, dir / "durable");
  auto copied = copy_committed_step(from, to, 1);
  BOOST_REQUIRE_MESSAGE(copied.is_ok(), copied.status().to_string());
  BOOST_TEST(copied->files == 10u);  // 8 data files, trainer_state.json, metadata.json
  BOOST_TEST(!copied->replaced);
  BOOST_TEST(**to.tracker() == 1);
  expect_copy_of(from, to, 1);

  // A store that keeps other bytes than it was sent (a torn write that reports success): the
  // read-back finds it, and nothing of step 2 counts.
  fs::create_directories(dir / "torn");
  auto torn = *FaultFileSystem::create(dir / "torn");
  // The second matching append: step 2's copy of the file (step 1's is the first).
  torn->inject({FsOp::append, "__1_0.safetensors", 2, EIO, 4096, /*torn=*/true});
  const CheckpointStore torn_to(torn, dir / "torn/durable");
  BOOST_REQUIRE(copy_committed_step(from, torn_to, 1).is_ok());
  auto lost = copy_committed_step(from, torn_to, 2);
  BOOST_REQUIRE(!lost.is_ok());
  const std::string why = lost.status().message();
  BOOST_TEST(why.find("__1_0.safetensors' reads back with XXH3") != std::string::npos, why);
  BOOST_TEST(why.find("nothing of step 2 is committed there") != std::string::npos, why);
  BOOST_TEST(**torn_to.tracker() == 1);
  BOOST_TEST(!*torn_to.is_committed(2));
  BOOST_TEST(!fs::exists(dir / "torn/durable/global_step_2.tmp"));

  // A damaged source is never made durable: the copy stops at the file, naming it.
  const std::string damaged = from.step_dir(2) + "/policy/__0_1.safetensors";
  std::string bytes = read_file(damaged);
  bytes[bytes.size() / 2] = static_cast<char>(bytes[bytes.size() / 2] ^ 1);
  std::ofstream(damaged, std::ios::binary | std::ios::trunc) << bytes;
  auto refused = copy_committed_step(from, to, 2);
  BOOST_REQUIRE(!refused.is_ok());
  BOOST_TEST(refused.status().code() == ErrorCode::corruption);
  BOOST_TEST(refused.status().message().find("'" + damaged + "' has XXH3") != std::string::npos,
             refused.status().message());
  BOOST_TEST(refused.status().message().find("the source is damaged and is not copied") != std::string::npos);
  BOOST_TEST(**to.tracker() == 1);
  BOOST_TEST((*to.committed_steps() == std::vector<std::int64_t>{1}));

  // A copy asked to stop (the run is stopping) stops, and nothing of the step counts: asked while
  // it copies (after 5 questions) and while it reads back (after 20 of the 27 it would ask: each
  // of the 9 small files is one piece and one sync while copied, one piece while read back).
  for (int after : {5, 20}) {
    BOOST_TEST_CONTEXT("stop after " << after << " questions") {
      int asked = 0;
      TierCopyOptions stopping;
      stopping.threads = 1;
      stopping.should_stop = [&] { return ++asked > after; };
      const CheckpointStore other(local, dir / ("other" + std::to_string(after)));
      auto stopped = copy_committed_step(from, other, 1, stopping);
      BOOST_REQUIRE(!stopped.is_ok());
      BOOST_TEST(stopped.status().code() == ErrorCode::aborted);
      BOOST_TEST(stopped.status().message().find("the run is stopping") != std::string::npos,
                 stopped.status().message());
      BOOST_TEST(asked == after + 1);
      BOOST_TEST(!*other.tracker());
      BOOST_TEST(other.committed_steps()->empty());
      BOOST_TEST(!fs::exists(other.write_dir(1)));
    }
  }

  // A step that is not committed at the source is not copied.
  auto missing = copy_committed_step(from, to, 7);
  BOOST_TEST(missing.status().code() == ErrorCode::not_found);
}

BOOST_AUTO_TEST_CASE(a_power_loss_at_any_call_of_a_copy_leaves_a_tracker_naming_a_step_that_verifies) {
  TempDir dir;
  save_two_steps(dir / "local", kSmall);
  const CheckpointStore from(local_file_system(), dir / "local");
  const std::string model = dir / "model";
  fs::create_directories(model);
  BOOST_REQUIRE(copy_committed_step(from, CheckpointStore(local_file_system(), model + "/durable"), 1).is_ok());
  const DiskImage before = *read_image(model);
  auto fault = *FaultFileSystem::create(model, false);
  const CheckpointStore to(fault, model + "/durable");
  BOOST_REQUIRE(copy_committed_step(from, to, 2).is_ok());
  const std::size_t calls = fault->call_count();
  BOOST_TEST(calls > 20u);
  int outcomes = 0;
  for (std::size_t k = 0; k <= calls; ++k) {
    BOOST_REQUIRE(write_image(model, before).is_ok());
    BOOST_REQUIRE(fault->reset().is_ok());
    fault->power_loss_after(k);
    const bool returned = copy_committed_step(from, to, 2).is_ok();
    BOOST_TEST(returned == (k == calls), "power lost after " << k << " of " << calls << " calls");
    std::vector<DiskImage> images;
    for (const auto& outcome : fault->crash_outcomes()) images.push_back(fault->crash_image(outcome));
    for (const auto& image : images) {
      ++outcomes;
      BOOST_REQUIRE(write_image(model, image).is_ok());
      const CheckpointStore after(local_file_system(), model + "/durable");
      auto tracked = after.tracker();
      BOOST_REQUIRE_MESSAGE(tracked.is_ok() && tracked->has_value(), "power lost after " << k << " calls");
      // Once the copy returned, its step is durable; before, either step may be named.
      BOOST_TEST((returned ? **tracked == 2 : (**tracked == 1 || **tracked == 2)), "after " << k << " calls");
      BOOST_TEST_CONTEXT("power lost after " << k << " of " << calls << " calls") {
        expect_verifies(*local_file_system(), after.step_dir(**tracked));
      }
    }
  }
  BOOST_TEST(outcomes > static_cast<int>(calls));
}

BOOST_AUTO_TEST_CASE(an_upload_that_fails_halfway_leaves_the_durable_tracker_and_the_next_one_completes_it) {
  S3Server server({kBucket}, /*proxy=*/true);
  TempDir dir;
  const SyntheticStateSpec spec{2, 12u << 20, 8, 9};
  save_two_steps(dir / "local", spec);
  auto options = server.options(/*through_proxy=*/true);
  options.multipart_threshold = 5 << 20;
  options.part_size = 5 << 20;
  options.upload_threads = 2;
  options.spool_dir = dir / "work";
  const auto store_fs = default_file_system(options);
  const std::string url = std::string("s3://") + kBucket + "/durable";
  const CheckpointStore from(local_file_system(), dir / "local");
  const CheckpointStore to(store_fs, url);
  BOOST_REQUIRE(copy_committed_step(from, to, 1).is_ok());
  // The server goes away about 10 MB into step 2's 24 MiB.
  BOOST_REQUIRE(server.command("down_after 10000000") == "ok");
  auto failed = copy_committed_step(from, to, 2);
  BOOST_REQUIRE(!failed.is_ok());
  const std::string why = failed.status().message();
  BOOST_TEST(why.find("copying step 2 from '" + dir / "local" + "' to '" + url + "'") != std::string::npos, why);
  BOOST_TEST(why.find("cannot reach the object store") != std::string::npos, why);
  BOOST_REQUIRE(server.command("up") == "ok");
  auto root = CloudRoot::open(url, server.options());
  BOOST_REQUIRE(root.is_ok());
  BOOST_TEST(**root->read_tracker() == 1);
  BOOST_TEST(!*root->is_committed(2));
  // The next start cleans what the outage left; the next upload completes the step.
  BOOST_REQUIRE(to.clean_interrupted().is_ok());
  BOOST_TEST(root->bucket().open_uploads("durable/")->empty());
  auto done = copy_committed_step(from, to, 2);
  BOOST_REQUIRE_MESSAGE(done.is_ok(), done.status().to_string());
  BOOST_TEST(**root->read_tracker() == 2);
  BOOST_TEST((*root->committed_steps() == std::vector<std::int64_t>{1, 2}));
  // boto3, independently: every object of step 2 is there, of its size, equal to the local file.
  auto check = run_command(server.env() + " python3 " + source_dir() + "/tests/integration/s3_check.py " + url +
                           " --compare-local " + dir / "local");
  BOOST_TEST(check.code == 0, check.output);
  expect_verifies(*default_file_system(server.options()), url + "/global_step_2");
}

BOOST_AUTO_TEST_CASE(copies_through_a_kept_pool_reuse_its_buffers_and_stay_byte_identical) {
  TempDir dir;
  save_two_steps(dir / "local", kSmall);
  const auto local = local_file_system();
  const CheckpointStore from(local, dir / "local");
  const CheckpointStore to(local, dir / "durable");
  // Buffers smaller than a data file (1 MiB in 8 files of 2 ranks: 64 KiB and more), so that a
  // file goes through a buffer piece by piece, over bytes another file or step left in it.
  TierCopyOptions options;
  options.threads = 2;
  options.buffers = std::make_shared<CopyBuffers>(std::size_t{16} << 10);
  std::size_t allocated = 0;
  for (std::int64_t step : {1, 2, 1}) {
    BOOST_TEST_CONTEXT("step " << step) {
      auto copied = copy_committed_step(from, to, step, options);
      BOOST_REQUIRE_MESSAGE(copied.is_ok(), copied.status().to_string());
      expect_copy_of(from, to, step);
      // At most one buffer a thread, for both phases of every copy, and none after the first.
      if (step == 1 && allocated == 0) allocated = options.buffers->allocated();
      BOOST_TEST(options.buffers->allocated() >= 1u);
      BOOST_TEST(options.buffers->allocated() <= 2u);
      BOOST_TEST(options.buffers->allocated() == allocated);
    }
  }
  // A buffer of another size given back is not kept.
  CopyBuffers pool(4096);
  pool.give_back(HostBuffer(8192, false, nullptr));
  (void)pool.take();
  BOOST_TEST(pool.allocated() == 1u);
}
