#define BOOST_TEST_MODULE multiprocess
#include <boost/test/unit_test.hpp>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "tests/checkpoint_test_util.hpp"
#include "tests/integration/rank_process.hpp"
#include "tests/test_util.hpp"

using namespace stagehand;
using stagehand::test::TempDir;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

const std::string kBin = test::bin_dir();
const std::string kSource = test::source_dir();
const std::string kConfig = kSource + "/examples/configs/sync_rl.yaml";

std::string train_command(const std::vector<std::string>& sets, const std::string& config = kConfig) {
  std::string cmd = kBin + "/stagehand-train --quiet --config " + config;
  for (const auto& s : sets) cmd += " --set " + s;
  return cmd;
}

void expect_same_checkpoint(const std::string& a_dir, const std::string& b_dir) {
  BOOST_TEST(test::checkpoint_difference(a_dir, b_dir) == "");
}

using test::RankProcess;

/// Four processes of `cmd`, ranks 0-3 of one job on `port`, logging to `dir`/rankN.log.
std::vector<std::unique_ptr<RankProcess>> start_four(const TempDir& dir, int port, const std::string& cmd) {
  std::vector<std::unique_ptr<RankProcess>> ranks;
  for (int r = 0; r < 4; ++r) {
    ranks.push_back(std::make_unique<RankProcess>(r, 4, port, cmd, dir / ("rank" + std::to_string(r) + ".log")));
  }
  return ranks;
}

/// Two hosts of two ranks with their local tier in `local` (holding {host}), each rank's files on
/// both, local saves every 5 steps and durable ones every 30 into `durable`: a run to
/// `resume_to` resumed from the newest step, or (0) a run that goes on until it is killed.
std::vector<std::string> two_host_sets(const std::string& local, const std::string& durable, int resume_to,
                                       std::vector<std::string> extra) {
  std::vector<std::string> out{"trainer.local_ckpt_path=" + local,
                               "trainer.ckpt_path=" + durable,
                               "trainer.total_steps=" + std::to_string(resume_to > 0 ? resume_to : 100000),
                               "trainer.local_ckpt_interval=5",
                               "trainer.local_max_ckpts_to_keep=2",
                               "trainer.ckpt_interval=30",
                               "trainer.max_ckpts_to_keep=0",
                               "trainer.ranks_per_host=2",
                               "trainer.local_replication_factor=2",
                               "trainer.call_timeout_s=60"};
  if (resume_to > 0) out.push_back("trainer.resume_mode=latest");
  out.insert(out.end(), extra.begin(), extra.end());
  return out;
}

/// Waits until `path` exists, at most 60 s.
void wait_until_exists(const std::string& path) {
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (!fs::exists(path) && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

}  // namespace

BOOST_AUTO_TEST_CASE(four_processes_train_save_and_resume_byte_identical_to_in_process_workers) {
  // Sync RL with async and sync saves, and fully-async RL (its weight versions pushed by every
  // rank over the shared-memory channel or over TCP to the generators in rank 0's process, or published
  // through the tensor-parallel collectives; the in-process run's over shared memory).
  const std::string fully_async = kSource + "/examples/configs/fully_async_rl.yaml";
  struct Case {
    std::string config, async, procs_transport;
  };
  for (auto [config, async, procs_transport] : std::vector<Case>{
           {kConfig, "true", "shm"}, {kConfig, "false", "shm"}, {fully_async, "true", "shm"},
           {fully_async, "true", "tcp"}, {fully_async, "true", "collective"}}) {
    BOOST_TEST_CONTEXT(config << ", async " << async << ", processes' weight_sync.transport " << procs_transport) {
      TempDir dir;
      std::vector<std::string> common{"megatron_config.async_dist_ckpt_save=" + async, "trainer.ckpt_interval=10",
                                      "trainer.max_ckpts_to_keep=0"};
      auto with = [&](std::vector<std::string> extra) {
        extra.insert(extra.end(), common.begin(), common.end());
        return extra;
      };
      auto straight = test::run_command(
          train_command(with({"trainer.ckpt_path=" + dir / "inproc", "trainer.total_steps=40"}), config));
      BOOST_REQUIRE_MESSAGE(straight.code == 0, straight.output);
      const std::string launch = "MASTER_PORT=" + std::to_string(test::free_port()) + " " + kSource + "/scripts/launch-local.sh 4 ";
      auto first = test::run_command(
          launch + train_command(with({"trainer.ckpt_path=" + dir / "procs", "trainer.total_steps=20",
                                       "weight_sync.transport=" + procs_transport}),
                                 config));
      BOOST_REQUIRE_MESSAGE(first.code == 0, first.output);
      const std::string launch2 = "MASTER_PORT=" + std::to_string(test::free_port()) + " " + kSource + "/scripts/launch-local.sh 4 ";
      auto second = test::run_command(launch2 + train_command(with({"trainer.ckpt_path=" + dir / "procs",
                                                                    "trainer.total_steps=40", "trainer.resume_mode=latest",
                                                                    "weight_sync.transport=" + procs_transport}),
                                                               config));
      BOOST_REQUIRE_MESSAGE(second.code == 0, second.output);
      BOOST_TEST((test::committed_steps(dir / "procs") == std::vector<std::int64_t>{10, 20, 30, 40}));
      for (int step : {10, 20, 30, 40}) {
        expect_same_checkpoint(dir / ("inproc/global_step_" + std::to_string(step)),
                               dir / ("procs/global_step_" + std::to_string(step)));
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(four_processes_with_a_local_tier_fill_the_durable_one_and_resume_from_it_when_the_local_is_lost) {
  TempDir dir;
  auto straight = test::run_command(train_command(
      {"trainer.ckpt_path=" + dir / "inproc", "trainer.total_steps=40", "trainer.ckpt_interval=10",
       "trainer.max_ckpts_to_keep=0"}));
  BOOST_REQUIRE_MESSAGE(straight.code == 0, straight.output);
  auto tiered = [&](int total, bool resume) {
    std::vector<std::string> sets{"trainer.local_ckpt_path=" + dir / "local", "trainer.ckpt_path=" + dir / "durable",
                                  "trainer.total_steps=" + std::to_string(total), "trainer.local_ckpt_interval=5",
                                  "trainer.local_max_ckpts_to_keep=2", "trainer.ckpt_interval=10",
                                  "trainer.max_ckpts_to_keep=0"};
    if (resume) sets.push_back("trainer.resume_mode=latest");
    const std::string launch =
        "MASTER_PORT=" + std::to_string(test::free_port()) + " " + kSource + "/scripts/launch-local.sh 4 ";
    return test::run_command(launch + train_command(sets));
  };
  auto first = tiered(20, false);
  BOOST_REQUIRE_MESSAGE(first.code == 0, first.output);
  BOOST_TEST((test::committed_steps(dir / "local") == std::vector<std::int64_t>{15, 20}));
  BOOST_TEST((test::committed_steps(dir / "durable") == std::vector<std::int64_t>{10, 20}));
  // The local tier is lost (a replaced host): the job resumes from the durable one.
  fs::remove_all(dir / "local");
  auto second = tiered(40, true);
  BOOST_REQUIRE_MESSAGE(second.code == 0, second.output);
  BOOST_TEST((test::committed_steps(dir / "durable") == std::vector<std::int64_t>{10, 20, 30, 40}));
  BOOST_TEST((test::committed_steps(dir / "local") == std::vector<std::int64_t>{35, 40}));
  for (int step : {10, 20, 30, 40}) {
    expect_same_checkpoint(dir / ("inproc/global_step_" + std::to_string(step)),
                           dir / ("durable/global_step_" + std::to_string(step)));
  }
  expect_same_checkpoint(dir / "inproc/global_step_40", dir / "local/global_step_40");
}

BOOST_AUTO_TEST_CASE(a_host_killed_with_its_local_folder_resumes_from_the_replicas_on_the_other_byte_identical) {
  TempDir dir;
  const int total = 60;
  auto straight = test::run_command(train_command({"trainer.ckpt_path=" + dir / "inproc", "trainer.total_steps=60",
                                                   "trainer.ckpt_interval=30", "trainer.max_ckpts_to_keep=0"}));
  BOOST_REQUIRE_MESSAGE(straight.code == 0, straight.output);
  // Two hosts of two ranks, each with its own folder of the local tier, each rank's files on both.
  auto sets = [&](bool resume) { return two_host_sets(dir / "host{host}/local", dir / "durable", resume ? total : 0, {}); };
  for (int h = 0; h < 2; ++h) fs::create_directories(dir / ("host" + std::to_string(h)));
  auto ranks = start_four(dir, test::free_port(), train_command(sets(false)));
  // Host 1 dies (ranks 2 and 3, then its folder) once the local tier has committed step 10.
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  auto tracked = [&] {
    auto t = test::read_tracker(dir / "host0/local");
    return t.is_ok() && *t ? **t : std::int64_t{-1};
  };
  while (tracked() < 10 && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  ::kill(ranks[2]->pid, SIGKILL);
  ::kill(ranks[3]->pid, SIGKILL);
  BOOST_REQUIRE_MESSAGE(tracked() >= 10, ranks[0]->output());
  for (auto& rank : ranks) BOOST_TEST(rank->wait_for(std::chrono::seconds(60)) != -1, rank->output());
  const std::int64_t at_kill = tracked();
  BOOST_TEST_MESSAGE("host 1 killed with local step " << at_kill << " committed");
  BOOST_REQUIRE_MESSAGE(at_kill < total, "host 1 was killed only at step " << at_kill << ": " << ranks[0]->output());
  fs::remove_all(dir / "host1");
  fs::create_directories(dir / "host1");
  // A new host 1 (an empty disk) joins; the job resumes from the newest local step, host 1's
  // parts read from their replicas on host 0.
  const std::string launch = "MASTER_PORT=" + std::to_string(test::free_port()) + " " + kSource + "/scripts/launch-local.sh 4 ";
  auto resumed = test::run_command(launch + train_command(sets(true)));
  BOOST_REQUIRE_MESSAGE(resumed.code == 0, resumed.output);
  const std::string from = dir / ("host{host}/local/global_step_" + std::to_string(at_kill));
  BOOST_TEST(resumed.output.find(from + ": 4 part(s) whose own host has no copy are read from their replicas: rank 2's "
                                        "part '__2_0.safetensors' from host 0 (host 1's folder lacks the step)") !=
                 std::string::npos,
             resumed.output);
  // Both hosts' folders hold step 60 whole, as an uninterrupted run without tiers saved it.
  expect_same_checkpoint(dir / "inproc/global_step_60", dir / "host0/local/global_step_60");
  expect_same_checkpoint(dir / "inproc/global_step_60", dir / "host1/local/global_step_60");
  expect_same_checkpoint(dir / "inproc/global_step_60", dir / "durable/global_step_60");
}

/// Whether this process may make mount namespaces (root, CAP_SYS_ADMIN): the hosts whose disks
/// only they see.
struct CanMakeMountNamespaces {
  boost::test_tools::assertion_result operator()(boost::unit_test::test_unit_id) const {
    auto run = test::run_command("unshare -m --propagation private sh -c 'mount -t tmpfs none /mnt' 2>&1");
    boost::test_tools::assertion_result ok(run.code == 0);
    ok.message() << "mount namespaces cannot be made here (" << run.output << ")";
    return ok;
  }
};

BOOST_AUTO_TEST_CASE(hosts_whose_disks_only_they_see_replicate_over_the_network_and_resume_a_killed_host_byte_identical,
                     *boost::unit_test::precondition(CanMakeMountNamespaces())) {
  TempDir dir;
  const int total = 60;
  auto straight = test::run_command(train_command({"trainer.ckpt_path=" + dir / "inproc", "trainer.total_steps=60",
                                                   "trainer.ckpt_interval=30", "trainer.max_ckpts_to_keep=0"}));
  BOOST_REQUIRE_MESSAGE(straight.code == 0, straight.output);
  auto sets = [&](bool resume) {
    return two_host_sets(dir / "disk{host}/local", dir / "durable", resume ? total : 0,
                         {"trainer.local_replication_transport=network"});
  };
  for (int h = 0; h < 2; ++h) fs::create_directories(dir / ("disk" + std::to_string(h)));
  // Each host's two ranks in a mount namespace of their own where the other host's disk is an
  // empty memory file system: what they wrote there by path would vanish with them.
  auto start_hosts = [&](bool resume) {
    const int port = test::free_port();
    std::vector<std::unique_ptr<RankProcess>> ranks;
    for (int r = 0; r < 4; ++r) {
      const std::string hidden = dir / ("disk" + std::to_string(1 - r / 2));
      const std::string cmd = "unshare -m --propagation private sh -c 'mount -t tmpfs none " + hidden + " && exec " +
                              train_command(sets(resume)) + "'";
      ranks.push_back(std::make_unique<RankProcess>(r, 4, port, cmd,
                                                    dir / ((resume ? "resumed" : "rank") + std::to_string(r) + ".log")));
    }
    return ranks;
  };
  auto ranks = start_hosts(false);
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  auto tracked = [&] {
    auto t = test::read_tracker(dir / "disk0/local");
    return t.is_ok() && *t ? **t : std::int64_t{-1};
  };
  while (tracked() < 10 && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  ::kill(ranks[2]->pid, SIGKILL);
  ::kill(ranks[3]->pid, SIGKILL);
  BOOST_REQUIRE_MESSAGE(tracked() >= 10, ranks[0]->output() + ranks[2]->output());
  for (auto& rank : ranks) BOOST_TEST(rank->wait_for(std::chrono::seconds(60)) != -1, rank->output());
  const std::int64_t at_kill = tracked();
  BOOST_REQUIRE_MESSAGE(at_kill < total, "host 1 was killed only at step " << at_kill);
  // Host 1's disk holds host 0's parts of that step, and host 0's holds host 1's: each reached
  // the other only through its host's server.
  const std::string step_dir = "/local/global_step_" + std::to_string(at_kill) + "/policy/";
  BOOST_TEST(fs::exists(dir / ("disk1" + step_dir + "__0_0.safetensors")));
  BOOST_TEST(fs::exists(dir / ("disk1" + step_dir + "metadata.json")));
  BOOST_TEST(fs::exists(dir / ("disk0" + step_dir + "__3_0.safetensors")));
  BOOST_TEST((test::read_file(dir / ("disk0" + step_dir + "__3_0.safetensors")) ==
              test::read_file(dir / ("disk1" + step_dir + "__3_0.safetensors"))));
  // Host 1 comes back with an empty disk; the job resumes from the newest local step, host 1's
  // parts read from host 0 through its server.
  fs::remove_all(dir / "disk1");
  fs::create_directories(dir / "disk1");
  auto resumed = start_hosts(true);
  for (std::size_t r = 0; r < resumed.size(); ++r) {
    const int code = resumed[r]->wait_for(std::chrono::seconds(120));
    BOOST_TEST(code == 0, "resumed rank " << r << " exited with " << code << ": " << resumed[r]->output());
  }
  const std::string from = dir / ("disk{host}/local/global_step_" + std::to_string(at_kill));
  BOOST_TEST(resumed[0]->output().find(from + ": 4 part(s) whose own host has no copy are read from their replicas: "
                                              "rank 2's part '__2_0.safetensors' from host 0 (host 1's folder lacks the "
                                              "step)") != std::string::npos,
             resumed[0]->output());
  expect_same_checkpoint(dir / "inproc/global_step_60", dir / "disk0/local/global_step_60");
  expect_same_checkpoint(dir / "inproc/global_step_60", dir / "disk1/local/global_step_60");
  expect_same_checkpoint(dir / "inproc/global_step_60", dir / "durable/global_step_60");
}

BOOST_AUTO_TEST_CASE(a_worker_process_killed_during_an_async_save_fails_rank_0_and_keeps_the_previous_checkpoint) {
  TempDir dir;
  const int port = test::free_port();
  // Rate-limited writes keep each async save running for about two seconds.
  const std::string cmd = train_command({"trainer.ckpt_path=" + dir / "ckpt", "trainer.total_steps=400",
                                         "trainer.ckpt_interval=20", "trainer.max_ckpts_to_keep=0",
                                         "megatron_config.async_dist_ckpt_save=true",
                                         "megatron_config.ckpt_write_rate_limit_mib_s=0.01",
                                         "trainer.call_timeout_s=60"});
  auto ranks = start_four(dir, port, cmd);
  wait_until_exists(dir / "ckpt/global_step_40.tmp");
  BOOST_REQUIRE_MESSAGE(fs::exists(dir / "ckpt/global_step_40.tmp"), ranks[0]->output());
  BOOST_REQUIRE(**test::read_tracker(dir / "ckpt") == 20);
  ::kill(ranks[2]->pid, SIGKILL);
  auto killed = Clock::now();
  int code0 = ranks[0]->wait_for(std::chrono::seconds(30));
  double seconds = std::chrono::duration<double>(Clock::now() - killed).count();
  BOOST_TEST_MESSAGE("rank 0 exited with " << code0 << " " << seconds << " s after rank 2 was killed");
  BOOST_TEST(code0 != 0, ranks[0]->output());
  BOOST_TEST(code0 != -1, "rank 0 still running 30 s after rank 2 was killed: " << ranks[0]->output());
  BOOST_TEST(seconds < 15.0, "rank 0 took " << seconds << " s to stop");
  // Named by whoever saw it first: a collective with rank 2 or the dispatch's monitor, during a call
  // ("died") or before the next one ("is dead").
  const std::string out0 = ranks[0]->output();
  BOOST_TEST((out0.find("rank 2 died") != std::string::npos || out0.find("rank 2 is dead") != std::string::npos), out0);
  for (int r : {1, 3}) {
    int code = ranks[static_cast<std::size_t>(r)]->wait_for(std::chrono::seconds(30));
    BOOST_TEST(code != -1, "rank " << r << " did not exit: " << ranks[static_cast<std::size_t>(r)]->output());
  }
  // Nothing of step 40 was committed; step 20 is intact and resumes.
  BOOST_TEST(**test::read_tracker(dir / "ckpt") == 20);
  BOOST_TEST((test::committed_steps(dir / "ckpt") == std::vector<std::int64_t>{20}));
  auto verify = test::run_command(kBin + "/stagehand-ckpt verify " + dir / "ckpt");
  BOOST_TEST(verify.code == 0, verify.output);
  auto resume = test::run_command(train_command({"trainer.ckpt_path=" + dir / "ckpt", "trainer.total_steps=25",
                                                 "trainer.resume_mode=latest"}));
  BOOST_TEST(resume.code == 0, resume.output);
  BOOST_TEST(**test::read_tracker(dir / "ckpt") == 25);
}

BOOST_AUTO_TEST_CASE(sigterm_to_a_worker_process_stops_it_and_fails_the_job_naming_it) {
  TempDir dir;
  const int port = test::free_port();
  const std::string cmd = train_command({"trainer.ckpt_path=" + dir / "ckpt", "trainer.total_steps=100000000",
                                         "trainer.ckpt_interval=20", "trainer.max_ckpts_to_keep=0",
                                         "trainer.call_timeout_s=60"});
  auto ranks = start_four(dir, port, cmd);
  // Training: a checkpoint is committed.
  wait_until_exists(dir / "ckpt/latest_ckpt_global_step.txt");
  BOOST_REQUIRE_MESSAGE(fs::exists(dir / "ckpt/latest_ckpt_global_step.txt"), ranks[0]->output());
  ::kill(ranks[2]->pid, SIGTERM);
  const int code2 = ranks[2]->wait_for(std::chrono::seconds(15));
  BOOST_TEST(code2 != -1, "rank 2 still running 15 s after SIGTERM: " << ranks[2]->output());
  BOOST_TEST(code2 != 0, ranks[2]->output());
  BOOST_TEST(ranks[2]->output().find("rank 2: stopped by SIGTERM") != std::string::npos, ranks[2]->output());
  const int code0 = ranks[0]->wait_for(std::chrono::seconds(30));
  BOOST_TEST(code0 != -1, "rank 0 still running 30 s after rank 2 stopped: " << ranks[0]->output());
  BOOST_TEST(code0 != 0, ranks[0]->output());
  // Named by rank 2's own last call (its collectives stopped) or by its end (a collective with
  // it, or the dispatch's monitor).
  const std::string out0 = ranks[0]->output();
  BOOST_TEST((out0.find("rank 2 was stopped by SIGTERM") != std::string::npos ||
              out0.find("rank 2 died") != std::string::npos || out0.find("rank 2 is dead") != std::string::npos),
             out0);
  for (int r : {1, 3}) {
    const int code = ranks[static_cast<std::size_t>(r)]->wait_for(std::chrono::seconds(30));
    BOOST_TEST(code != -1, "rank " << r << " did not exit: " << ranks[static_cast<std::size_t>(r)]->output());
  }
  // What was committed stays committed and whole.
  auto verify = test::run_command(kBin + "/stagehand-ckpt verify " + dir / "ckpt");
  BOOST_TEST(verify.code == 0, verify.output);
}

BOOST_AUTO_TEST_CASE(a_stalled_worker_process_fails_rank_0_within_the_limit_naming_the_rank_and_the_setting) {
  TempDir dir;
  const int port = test::free_port();
  const std::string cmd = train_command({"trainer.ckpt_path=" + dir / "ckpt", "trainer.total_steps=100000000",
                                         "trainer.ckpt_interval=20", "trainer.max_ckpts_to_keep=0",
                                         "trainer.call_timeout_s=3"});
  auto ranks = start_four(dir, port, cmd);
  wait_until_exists(dir / "ckpt/latest_ckpt_global_step.txt");
  BOOST_REQUIRE_MESSAGE(fs::exists(dir / "ckpt/latest_ckpt_global_step.txt"), ranks[0]->output());
  // Rank 2 stops answering; the async save of step 20 is still pending in the dispatch.
  ::kill(ranks[2]->pid, SIGSTOP);
  const int code0 = ranks[0]->wait_for(std::chrono::seconds(30));
  ::kill(ranks[2]->pid, SIGCONT);
  BOOST_TEST(code0 == 1, ranks[0]->output());
  const std::string out0 = ranks[0]->output();
  // Every time limit that passed says which rank and which setting: no bare CAF timeout.
  BOOST_TEST(out0.find("request_timeout") == std::string::npos, out0);
  BOOST_TEST(out0.find("within 3 s (trainer.call_timeout_s)") != std::string::npos, out0);
  BOOST_TEST(out0.find("rank 2 did not finish") != std::string::npos, out0);
  for (int r : {1, 2, 3}) {
    const int code = ranks[static_cast<std::size_t>(r)]->wait_for(std::chrono::seconds(30));
    BOOST_TEST(code != -1, "rank " << r << " did not exit: " << ranks[static_cast<std::size_t>(r)]->output());
  }
}

BOOST_AUTO_TEST_CASE(a_rank_whose_actors_do_not_stop_leaves_within_the_call_limit_after_its_run) {
  // Rank 3 runs an actor that never stops (a test hook): its teardown cannot finish, and the
  // process must leave on its own within trainer.call_timeout_s, saying so, with the run's work
  // intact.
  TempDir dir;
  const int port = test::free_port();
  const std::string cmd = train_command({"trainer.ckpt_path=" + dir / "ckpt", "trainer.total_steps=20",
                                         "trainer.ckpt_interval=10", "trainer.max_ckpts_to_keep=0",
                                         "trainer.call_timeout_s=7"});
  std::vector<std::unique_ptr<RankProcess>> ranks;
  for (int r = 0; r < 4; ++r) {
    ranks.push_back(std::make_unique<RankProcess>(r, 4, port, (r == 3 ? "env STAGEHAND_TEST_STUCK_TEARDOWN=1 " : "") + cmd,
                                                  dir / ("rank" + std::to_string(r) + ".log")));
  }
  const int code0 = ranks[0]->wait_for(std::chrono::seconds(120));
  BOOST_TEST(code0 == 0, ranks[0]->output());
  const auto rank0_done = Clock::now();
  for (int r : {1, 2}) BOOST_TEST(ranks[static_cast<std::size_t>(r)]->wait_for(std::chrono::seconds(30)) == 0);
  const int code3 = ranks[3]->wait_for(std::chrono::seconds(30));
  const double after_s = std::chrono::duration<double>(Clock::now() - rank0_done).count();
  const std::string out3 = ranks[3]->output();
  BOOST_TEST(code3 == 1, "exit " << code3 << " (-1: still running): " << out3);
  BOOST_TEST(out3.find("rank 3: the process did not stop within 7 s (trainer.call_timeout_s) after its run ended") !=
                 std::string::npos,
             out3);
  // It says where its teardown was: at 5 s (TeardownLimit::kNoteAfter), and at the limit.
  BOOST_TEST(out3.find("rank 3: still stopping 5 s after its run ended, at: stopping the actors") != std::string::npos,
             out3);
  BOOST_TEST(out3.find("(exit code 0), at: stopping the actors") != std::string::npos, out3);
  BOOST_TEST(after_s < 20.0);
  BOOST_TEST((test::committed_steps(dir / "ckpt") == std::vector<std::int64_t>{10, 20}));
}

BOOST_AUTO_TEST_CASE(bad_starts_fail_clearly_within_the_join_limit) {
  TempDir dir;
  const std::string ckpt = "trainer.ckpt_path=" + dir / "ckpt";
  auto timed = [](auto&& fn) {
    auto start = Clock::now();
    fn();
    return std::chrono::duration<double>(Clock::now() - start).count();
  };

  // WORLD_SIZE that does not match the config: refused at once.
  auto mismatch = test::run_command("WORLD_SIZE=3 RANK=0 " + train_command({ckpt}));
  BOOST_TEST(mismatch.code == 2);
  BOOST_TEST(mismatch.output.find("WORLD_SIZE=3 does not match parallel.tensor_parallel x parallel.data_parallel") !=
                 std::string::npos,
             mismatch.output);

  // A port nobody listens on.
  test::CommandRun dead;
  double dead_s = timed([&] {
    dead = test::run_command("WORLD_SIZE=4 RANK=1 MASTER_PORT=" + std::to_string(test::free_port()) + " " +
                             train_command({ckpt}) + " --join-timeout-s 3");
  });
  BOOST_TEST(dead.code != 0);
  BOOST_TEST(dead.output.find("cannot reach rank 0 at 127.0.0.1:") != std::string::npos, dead.output);
  BOOST_TEST(dead_s < 10.0);

  // A rank that joins with another WORLD_SIZE (its own config agrees with it): rank 0 refuses it
  // and every process stops.
  {
    const int port = test::free_port();
    RankProcess rank0(0, 4, port, train_command({ckpt}) + " --join-timeout-s 20", dir / "r0.log");
    RankProcess other(1, 2, port, train_command({ckpt, "parallel.data_parallel=1"}) + " --join-timeout-s 20",
                      dir / "r1.log");
    int code0 = rank0.wait_for(std::chrono::seconds(15));
    int code1 = other.wait_for(std::chrono::seconds(15));
    BOOST_TEST(code0 > 0, "exit " << code0 << " (-1: still running): " << rank0.output());
    BOOST_TEST(code1 > 0, "exit " << code1 << " (-1: still running): " << other.output());
    BOOST_TEST(rank0.output().find("was started with WORLD_SIZE=2, rank 0 with WORLD_SIZE=4") != std::string::npos,
               rank0.output());
    BOOST_TEST(other.output().find("rank 0 stopped the start") != std::string::npos, other.output());
  }

  // A rank that never starts: rank 0 names it once the join limit passes, and the others stop.
  {
    const int port = test::free_port();
    std::vector<std::unique_ptr<RankProcess>> ranks;
    for (int r = 0; r < 3; ++r) {
      ranks.push_back(std::make_unique<RankProcess>(r, 4, port, train_command({ckpt}) + " --join-timeout-s 3",
                                                    dir / ("m" + std::to_string(r) + ".log")));
    }
    // A rank that reached rank 0 just as it gave up waits for rank 0's answer up to the join limit
    // plus 10 s (WorldMember::join) before it says why: under sanitizers and load, with its own
    // start, that has taken over 15 s.
    for (auto& p : ranks) {
      const int code = p->wait_for(std::chrono::seconds(40));
      BOOST_TEST(code > 0, "exit " << code << " (-1: still running): " << p->output());
    }
    BOOST_TEST(ranks[0]->output().find("rank(s) 3 of WORLD_SIZE=4 did not join") != std::string::npos,
               ranks[0]->output());
  }
}

BOOST_AUTO_TEST_CASE(the_launcher_ends_a_stopped_rank_after_its_grace) {
  // Rank 1 stops itself (SIGSTOP ignores SIGTERM); rank 0 fails: the launcher must SIGKILL rank 1
  // after GRACE_S + KILL_S and exit with the worst code.
  const auto start = Clock::now();
  auto run = test::run_command("GRACE_S=1 KILL_S=1 timeout 60 " + kSource +
                               "/scripts/launch-local.sh 2 sh -c 'if [ \"$RANK\" = 1 ]; then kill -STOP $$; sleep 100; fi; exit 3'");
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  BOOST_TEST(run.code == 137, run.output);
  BOOST_TEST(seconds < 20.0);
}

BOOST_AUTO_TEST_CASE(the_launcher_names_and_ends_ranks_running_past_its_time_limit) {
  // Rank 1 never ends (and ignores SIGTERM); rank 0 ends well. TIMEOUT_S names rank 1, ends it
  // with SIGKILL KILL_S seconds after SIGTERM, and the launcher exits 124.
  const auto start = Clock::now();
  auto run = test::run_command("TIMEOUT_S=2 KILL_S=1 timeout 120 " + kSource +
                               "/scripts/launch-local.sh 2 sh -c 'if [ \"$RANK\" = 1 ]; then trap \"\" TERM; "
                               "while :; do sleep 1; done; fi; exit 0'");
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  BOOST_TEST(run.code == 124, run.output);
  BOOST_TEST(run.output.find("ranks 1 still running after TIMEOUT_S=2 s") != std::string::npos, run.output);
  BOOST_TEST(seconds < 100.0);  // ended by the launcher, not by the outer timeout (120 s, also 124)
}

BOOST_AUTO_TEST_CASE(rank_0_exits_after_any_other_rank_is_killed_repeatedly) {
  // An earlier main hung about 1 run in 13 here: rank 0 printed "rank 1 is dead" at teardown and
  // then waited forever in ~actor_system (the detached coordinator, kept alive by replies CAF
  // still held after its middleman stopped; it is no longer detached). 16 runs with a random
  // victim and moment; every rank must end within its limit.
  std::srand(7);
  int hung = 0;
  for (int run = 0; run < 16; ++run) {
    TempDir dir;
    const int port = test::free_port();
    const std::string cmd =
        train_command({"trainer.ckpt_path=" + dir / "ckpt", "trainer.total_steps=100000", "trainer.ckpt_interval=5",
                       "megatron_config.async_dist_ckpt_save=true", "megatron_config.ckpt_save_staging_buckets=1",
                       "megatron_config.ckpt_staging_memory=per_save", "trainer.call_timeout_s=20"}) +
        " --join-timeout-s 20";
    auto ranks = start_four(dir, port, cmd);
    wait_until_exists(dir / "ckpt/latest_ckpt_global_step.txt");
    std::this_thread::sleep_for(std::chrono::milliseconds(std::rand() % 1000));
    const int victim = 1 + std::rand() % 3;
    ::kill(ranks[static_cast<std::size_t>(victim)]->pid, SIGKILL);
    const int code0 = ranks[0]->wait_for(std::chrono::seconds(45));
    if (code0 == -1) ++hung;
    BOOST_TEST(code0 != -1, "run " << run << ": rank 0 still running 45 s after rank " << victim
                                   << " was killed: " << ranks[0]->output());
    ranks[0]->kill_now();
    for (int r = 1; r < 4; ++r) {
      if (r == victim) continue;
      BOOST_TEST(ranks[static_cast<std::size_t>(r)]->wait_for(std::chrono::seconds(45)) != -1,
                 "run " << run << ": rank " << r << " still running");
    }
  }
  BOOST_TEST_MESSAGE(hung << " of 16 runs left rank 0 running");
}
