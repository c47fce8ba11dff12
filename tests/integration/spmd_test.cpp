#define BOOST_TEST_MODULE spmd
#include <boost/test/unit_test.hpp>

#include <signal.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <thread>

#include "spmd_state.hpp"
#include "stagehand/actors/checkpointer.hpp"
#include "stagehand/checkpoint/load/verify.hpp"
#include "tests/checkpoint_test_util.hpp"
#include "tests/integration/rank_process.hpp"
#include "tests/test_util.hpp"

// The Checkpointer used as DCP and megatron-core are: one process per rank, every rank calling
// save, async_save and load with its own shard (spmd_rank, started once per rank).

using namespace stagehand;
using stagehand::test::RankProcess;
using stagehand::test::TempDir;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

const std::string kRankBin = test::bin_dir() + "/spmd_rank";

struct JobResult {
  std::vector<int> codes;
  std::vector<std::string> outputs;
  double seconds = 0;
};

/// Runs `args_of(rank)` in `world` processes, one per rank, and waits (at most `limit`) for all.
/// With `kill_rank`, sends it `signal` `kill_after` after `begun` exists (the step's folder, which
/// rank 0 prepares once every rank has joined: so the victim dies mid-save, however slowly the
/// processes start).
template <class ArgsOf>
JobResult run_job(int world, const std::string& logs, ArgsOf args_of, std::chrono::seconds limit = std::chrono::seconds(60),
                  int kill_rank = -1, std::chrono::milliseconds kill_after = {}, int signal = SIGKILL,
                  const std::string& begun = "") {
  const int port = test::free_port();
  const auto start = Clock::now();
  std::vector<std::unique_ptr<RankProcess>> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.push_back(std::make_unique<RankProcess>(r, world, port, kRankBin + " " + args_of(r),
                                                  logs + "/rank" + std::to_string(r) + ".log"));
  }
  if (kill_rank >= 0) {
    while (!begun.empty() && !fs::exists(begun) && Clock::now() - start < limit) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::this_thread::sleep_for(kill_after);
    auto& victim = *ranks[static_cast<std::size_t>(kill_rank)];
    if (signal == SIGKILL) {
      victim.kill_now();
    } else {
      ::kill(victim.pid, signal);
    }
  }
  JobResult result;
  for (auto& r : ranks) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(limit - (Clock::now() - start));
    result.codes.push_back(r->pid < 0 ? 137 : r->wait_for(std::max(left, std::chrono::milliseconds(1))));
    if (result.codes.back() == -1) r->kill_now();  // still running at the limit (a stopped rank)
    result.outputs.push_back(r->output());
  }
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

void expect_all_ok(const JobResult& job) {
  for (std::size_t r = 0; r < job.codes.size(); ++r) BOOST_TEST(job.codes[r] == 0, "rank " << r << ": " << job.outputs[r]);
}

void expect_same_files(const std::string& a_dir, const std::string& b_dir) {
  BOOST_TEST(test::checkpoint_difference(a_dir, b_dir) == "");
}

/// The same state saved by 4 ranks in this process: step 1 sync, 2 async, 3 async staged.
void save_in_process(const std::string& root) {
  for (int phase = 1; phase <= 3; ++phase) {
    CheckpointerOptions options{.root = root, .world_size = 4, .thread_count = 8};
    options.staging_buckets = phase == 3 ? 2 : 0;
    Checkpointer ckpt(options);
    std::vector<std::unique_ptr<test::SpmdRank>> ranks;
    std::vector<StateDict> states;
    for (int r = 0; r < 4; ++r) {
      ranks.push_back(std::make_unique<test::SpmdRank>(r, test::SpmdLayout{2, 2}, phase));
      states.push_back(ranks.back()->state);
    }
    if (phase == 1) {
      BOOST_REQUIRE(ckpt.save(phase, states).is_ok());
    } else {
      auto pending = ckpt.async_save(phase, states);
      BOOST_REQUIRE(pending.is_ok());
      BOOST_REQUIRE(pending->wait().is_ok());
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(four_processes_save_sync_async_and_staged_byte_identical_to_in_process_ranks_and_load_in_2_and_1) {
  TempDir dir;
  save_in_process(dir / "in_process");
  const std::string root = dir / "procs";
  const char* modes[] = {"sync", "async", "staged"};
  for (int step = 1; step <= 3; ++step) {
    auto job = run_job(4, dir.path(), [&](int) { return "save " + root + " " + std::to_string(step) + " " + modes[step - 1]; });
    expect_all_ok(job);
  }
  BOOST_TEST(**test::read_tracker(root) == 3);
  for (int step = 1; step <= 3; ++step) {
    const std::string name = "/global_step_" + std::to_string(step);
    expect_same_files(dir / "in_process" + name, root + name);
    auto verified = verify_checkpoint(root + name);
    BOOST_TEST((verified.is_ok() && verified->ok()), root + name);
  }
  // Each replicated block is written once, by one of its holders, spread over them: the data
  // files hold each global tensor's bytes once, and no rank writes more than a balanced whole-
  // block assignment gives it (the moments, plus one weight block or the bias).
  std::uintmax_t total = 0, most = 0;
  for (int r = 0; r < 4; ++r) {
    std::uintmax_t bytes = 0;
    for (const auto& e : fs::directory_iterator(root + "/global_step_3/policy")) {
      const std::string f = e.path().filename().string();
      if (f.rfind("__" + std::to_string(r) + "_", 0) == 0) bytes += e.file_size();
    }
    total += bytes;
    most = std::max(most, bytes);
  }
  const std::uintmax_t tensor_bytes = 2 * test::kRows * test::kCols * 4 + test::kCols * 4;
  BOOST_TEST(total >= tensor_bytes);
  // Each of the 32 files (8 buckets x 4 ranks) adds its header, padded to 4 KiB at most.
  BOOST_TEST(total <= tensor_bytes + 32 * 4096, "headers add more than 4 KiB a file: " << total);
  const std::uintmax_t moment_block = test::kRows / 2 * test::kCols / 2 * 4, weight_block = test::kRows * test::kCols / 2 * 4;
  BOOST_TEST(most <= moment_block + weight_block + 8 * 4096, "a rank writes " << most << " bytes");

  // Any layout loads it: 2 processes (tensor parallel only) and 1.
  auto two = run_job(2, dir.path(), [&](int) { return "load " + root + " 3 2 1"; });
  expect_all_ok(two);
  auto one = run_job(1, dir.path(), [&](int) { return "load " + root + "/global_step_2 2 1 1"; });
  expect_all_ok(one);
  BOOST_TEST(one.outputs[0].find("every value equal") != std::string::npos, one.outputs[0]);
}

BOOST_AUTO_TEST_CASE(a_rank_killed_mid_save_fails_every_other_rank_naming_it_and_keeps_the_tracker) {
  for (int victim : {2, 0}) {
    BOOST_TEST_CONTEXT("rank " << victim << " killed") {
      TempDir dir;
      const std::string root = dir / "ckpt";
      expect_all_ok(run_job(4, dir.path(), [&](int) { return "save " + root + " 1 sync"; }));
      // About 2 s of writing per rank at 200 kB/s; the victim dies 0.5 s after the step began.
      auto job = run_job(
          4, dir.path(), [&](int) { return "save " + root + " 2 sync --slow 200000 --timeout-s 6"; },
          std::chrono::seconds(40), victim, std::chrono::milliseconds(500), SIGKILL, root + "/global_step_2.tmp");
      BOOST_TEST(job.seconds < 30.0);
      for (int r = 0; r < 4; ++r) {
        if (r == victim) continue;
        const std::string& out = job.outputs[static_cast<std::size_t>(r)];
        BOOST_TEST(job.codes[static_cast<std::size_t>(r)] == 1, "rank " << r << ": " << out);
        const std::string named = victim == 0 ? "rank 0" : "rank " + std::to_string(victim);
        BOOST_TEST(out.find(named) != std::string::npos, "rank " << r << ": " << out);
      }
      BOOST_TEST(**test::read_tracker(root) == 1);
      BOOST_TEST(!fs::exists(root + "/global_step_2"));
      auto verified = verify_checkpoint(root + "/global_step_1");
      BOOST_TEST((verified.is_ok() && verified->ok()));
      if (victim != 0) BOOST_TEST(!fs::exists(root + "/global_step_2.tmp"));
      // The next job cleans what a dead rank 0 left and loads step 1.
      auto load = run_job(2, dir.path(), [&](int) { return "load " + root + " 1 2 1"; });
      expect_all_ok(load);
      expect_all_ok(run_job(4, dir.path(), [&](int) { return "save " + root + " 3 sync"; }));
      BOOST_TEST(!fs::exists(root + "/global_step_2.tmp"));
      BOOST_TEST(**test::read_tracker(root) == 3);
    }
  }
}

BOOST_AUTO_TEST_CASE(ranks_that_disagree_on_the_step_or_the_structure_fail_on_every_rank) {
  TempDir dir;
  const std::string root = dir / "ckpt";
  auto steps = run_job(4, dir.path(), [&](int r) { return "save " + root + " " + (r == 1 ? "6" : "5") + " sync --timeout-s 10"; });
  BOOST_TEST(steps.seconds < 30.0);
  for (int r = 0; r < 4; ++r) {
    const std::string& out = steps.outputs[static_cast<std::size_t>(r)];
    BOOST_TEST(steps.codes[static_cast<std::size_t>(r)] == 1, out);
    BOOST_TEST(out.find("step") != std::string::npos, out);
    BOOST_TEST(out.find("rank 1") != std::string::npos, out);
  }
  auto shapes = run_job(4, dir.path(), [&](int r) { return "save " + root + " 5 sync --timeout-s 10" + (r == 3 ? " --other-structure" : ""); });
  for (int r = 0; r < 4; ++r) {
    const std::string& out = shapes.outputs[static_cast<std::size_t>(r)];
    BOOST_TEST(shapes.codes[static_cast<std::size_t>(r)] == 1, out);
    BOOST_TEST(out.find("rank 3") != std::string::npos, out);
  }
  BOOST_TEST(!fs::exists(root + "/global_step_5"));
  BOOST_TEST(!fs::exists(root + "/global_step_5.tmp"));
  BOOST_TEST(!fs::exists(root + "/global_step_6.tmp"));
}

BOOST_AUTO_TEST_CASE(a_stalled_rank_fails_every_other_rank_within_the_timeout_naming_it) {
  TempDir dir;
  const std::string root = dir / "ckpt";
  expect_all_ok(run_job(4, dir.path(), [&](int) { return "save " + root + " 1 sync"; }));
  // Rank 3 stops (SIGSTOP) 0.5 s into a save of about 2 s; the limit is 4 s.
  auto job = run_job(
      4, dir.path(), [&](int) { return "save " + root + " 2 sync --slow 200000 --timeout-s 4"; },
      std::chrono::seconds(30), 3, std::chrono::milliseconds(500), SIGSTOP, root + "/global_step_2.tmp");
  for (int r = 0; r < 3; ++r) {
    const std::string& out = job.outputs[static_cast<std::size_t>(r)];
    BOOST_TEST(job.codes[static_cast<std::size_t>(r)] == 1, "rank " << r << ": " << out);
    BOOST_TEST(out.find("rank 3") != std::string::npos, "rank " << r << ": " << out);
  }
  BOOST_TEST(job.codes[3] == -1);  // stopped until the end, then killed
  BOOST_TEST(**test::read_tracker(root) == 1);
  BOOST_TEST(!fs::exists(root + "/global_step_2"));
}

BOOST_AUTO_TEST_CASE(a_rank_that_begins_a_save_late_is_named_and_the_others_save_the_step_again_with_it) {
  // Every rank saves step 1; rank 3 then begins step 2 6 s late, past the 4 s limit. The others'
  // save fails naming rank 3 (not their own dispatch's timeout, which once passed first); they
  // save step 2 again at once, and rank 3's late save joins that one: all four commit step 2
  // (the coordinator once refused the second save of a failed step on every rank).
  TempDir dir;
  const std::string root = dir / "ckpt";
  auto job = run_job(4, dir.path(), [&](int r) {
    return "save " + root + " 2 sync --warm-up --again --timeout-s 4" + (r == 3 ? " --late-s 6" : "");
  });
  expect_all_ok(job);
  for (int r = 0; r < 3; ++r) {
    const std::string& out = job.outputs[static_cast<std::size_t>(r)];
    BOOST_TEST(out.find("first save of step 2 failed") != std::string::npos, "rank " << r << ": " << out);
    BOOST_TEST(out.find("rank 3 did not begin saving step 2") != std::string::npos, "rank " << r << ": " << out);
    BOOST_TEST(out.find("saved step 2") != std::string::npos, "rank " << r << ": " << out);
  }
  BOOST_TEST(job.outputs[3].find("first save") == std::string::npos, job.outputs[3]);
  BOOST_TEST(**test::read_tracker(root) == 2);
  auto verified = verify_checkpoint(root + "/global_step_2");
  BOOST_TEST((verified.is_ok() && verified->ok()));
  expect_all_ok(run_job(2, dir.path(), [&](int) { return "load " + root + " 2 2 1"; }));
}
