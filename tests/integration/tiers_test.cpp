// stagehand-train with a local tier (trainer.local_ckpt_path) and a durable one (ckpt_path):
// saves into the local tier, background copies into the durable one, retention in each, and a
// resume that takes the newest step that loads from either, naming what it rejected.
#define BOOST_TEST_MODULE tiers
#include <boost/test/unit_test.hpp>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "tests/checkpoint_test_util.hpp"
#include "tests/test_util.hpp"

using namespace stagehand;
using stagehand::test::TempDir;
namespace fs = std::filesystem;

namespace {

const std::string kBin = test::bin_dir();
const std::string kConfig = test::source_dir() + "/examples/configs/sync_rl.yaml";

/// @param prefix what the command line starts with (environment settings, `timeout ...`).
test::CommandRun train(const std::vector<std::string>& sets, bool quiet = false, const std::string& metrics = "",
                       const std::string& prefix = "") {
  std::string cmd = prefix + kBin + "/stagehand-train" + (quiet ? " --quiet" : "") + " --config " + kConfig;
  for (const auto& s : sets) cmd += " --set '" + s + "'";
  if (!metrics.empty()) cmd += " --metrics-out " + metrics;
  return test::run_command(cmd);
}

/// A quiet run that must succeed (the setup of a case).
void train_ok(const std::vector<std::string>& sets) {
  auto run = train(sets, true);
  BOOST_REQUIRE_MESSAGE(run.code == 0, run.output);
}

/// A tiered run's settings: the local tier every `local_every` steps keeping `local_keep`, the
/// durable tier every 10 keeping all.
std::vector<std::string> tiered(const std::string& dir, int total, int local_every, int local_keep, bool resume) {
  std::vector<std::string> out{"trainer.local_ckpt_path=" + dir + "/local",
                               "trainer.ckpt_path=" + dir + "/durable",
                               "trainer.total_steps=" + std::to_string(total),
                               "trainer.local_ckpt_interval=" + std::to_string(local_every),
                               "trainer.local_max_ckpts_to_keep=" + std::to_string(local_keep),
                               "trainer.ckpt_interval=10",
                               "trainer.max_ckpts_to_keep=0"};
  if (resume) out.push_back("trainer.resume_mode=latest");
  return out;
}

/// An uninterrupted run without tiers, saving every 10 steps into `root`.
std::vector<std::string> straight(const std::string& root, int total) {
  return {"trainer.ckpt_path=" + root, "trainer.total_steps=" + std::to_string(total), "trainer.ckpt_interval=10",
          "trainer.max_ckpts_to_keep=0"};
}

std::vector<nlohmann::json> lines_of(const std::string& path, const std::string& type) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j["type"] == type) out.push_back(j);
  }
  return out;
}

std::string durable_dir(const std::string& run, int step) {
  return run + "/durable/global_step_" + std::to_string(step);
}

std::string data_file(const std::string& root, int step, const std::string& name) {
  return root + "/global_step_" + std::to_string(step) + "/policy/" + name;
}

void flip_byte(const std::string& path) {
  std::string bytes = test::read_file(path);
  BOOST_REQUIRE(bytes.size() > 200);
  bytes[bytes.size() - 100] = static_cast<char>(bytes[bytes.size() - 100] ^ 0x5a);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

/// Every file of `a` equals the file of the same name in `b`, and neither has more.
void expect_same_files(const std::string& a, const std::string& b) {
  auto left = test::files_of(a);
  auto right = test::files_of(b);
  BOOST_TEST(left.size() == right.size(), a << " and " << b);
  for (const auto& [name, bytes] : left) BOOST_TEST((right[name] == bytes), name << " differs between " << a << " and " << b);
}

}  // namespace

BOOST_AUTO_TEST_CASE(saves_commit_in_the_local_tier_and_every_tenth_is_copied_to_the_durable_one) {
  TempDir dir;
  train_ok(straight(dir / "straight", 30));
  const std::string metrics = dir / "metrics.jsonl";
  auto sets = tiered(dir.path(), 30, 2, 2, false);
  sets.push_back("trainer.max_ckpts_to_keep=2");
  auto run = train(sets, false, metrics);
  BOOST_REQUIRE_MESSAGE(run.code == 0, run.output);
  for (const std::string& said : std::vector<std::string>
       {"checkpoints async in " + dir / "local",
        "a local tier: saves every 2 steps into " + dir / "local" + " (keeps 2), copied every 10 steps",
        "durable tier: 3 uploads to " + dir / "durable" + ", 0 failed; it holds step 30",
        "retention: removed the durable tier's checkpoint step 10"}) {
    BOOST_TEST(run.output.find(said) != std::string::npos, said << " in: " << run.output);
  }
  // Each tier keeps its newest two; the durable one had every tenth step, tracker last.
  BOOST_TEST((test::committed_steps(dir / "local") == std::vector<std::int64_t>{28, 30}));
  BOOST_TEST((test::committed_steps(dir / "durable") == std::vector<std::int64_t>{20, 30}));
  BOOST_TEST(test::read_file(dir / "durable/latest_ckpt_global_step.txt") == "30\n");
  BOOST_TEST(test::read_file(dir / "local/latest_ckpt_global_step.txt") == "30\n");
  // Fifteen saves (every second step), three uploads, each checked after it was written.
  BOOST_TEST(lines_of(metrics, "save").size() == 15u);
  auto uploads = lines_of(metrics, "upload");
  BOOST_REQUIRE(uploads.size() == 3u);
  for (std::size_t i = 0; i < uploads.size(); ++i) {
    BOOST_TEST(uploads[i]["ok"] == true, uploads[i].dump());
    BOOST_TEST(uploads[i]["step"] == 10 * static_cast<int>(i + 1));
    BOOST_TEST(uploads[i]["bytes"].get<std::uint64_t>() > 0u);
  }
  // The copies are the checkpoints a run without tiers writes, byte for byte.
  for (int step : {20, 30}) {
    expect_same_files(dir / ("straight/global_step_" + std::to_string(step)),
                      dir / ("durable/global_step_" + std::to_string(step)));
  }
  expect_same_files(dir / "straight/global_step_30", dir / "local/global_step_30");
  auto verify = test::run_command(kBin + "/stagehand-ckpt verify " + dir / "durable");
  BOOST_TEST(verify.code == 0, verify.output);
}

BOOST_AUTO_TEST_CASE(resume_latest_takes_the_newest_step_that_loads_from_either_tier_naming_what_it_rejected) {
  TempDir dir;
  train_ok(straight(dir / "straight", 40));
  // Local steps 20, 25, 30; durable steps 10, 20, 30.
  fs::create_directories(dir / "base");
  train_ok(tiered(dir / "base", 30, 5, 3, false));
  const std::string run = dir / "run";
  const std::string local = run + "/local";
  const std::string durable = run + "/durable";
  struct Case {
    std::string what;
    std::function<void()> spoil;
    std::string resumed;
    std::vector<std::string> said;
  };
  const std::vector<Case> cases{
      {"a flipped byte in local step 30", [&] { flip_byte(data_file(local, 30, "__0_0.safetensors")); },
       durable + "/global_step_30",
       {"local step 30 rejected: ", "checksum mismatch", "resumed durable step 30 after rejecting"}},
      {"the host's local tier lost", [&] { fs::remove_all(local); }, durable + "/global_step_30", {}},
      {"a missing file in local step 30 and a flipped byte in durable step 30",
       [&] {
         fs::remove(data_file(local, 30, "__1_0.safetensors"));
         flip_byte(data_file(durable, 30, "__0_0.safetensors"));
       },
       local + "/global_step_25",
       {"local step 30 rejected: ", "__1_0.safetensors", "durable step 30 rejected: ", "checksum mismatch",
        "resumed local step 25 after rejecting"}},
      {"a stale local tracker", [&] { std::ofstream(local + "/latest_ckpt_global_step.txt") << "50\n"; },
       local + "/global_step_30",
       {"local tier: the tracker '" + local + "/latest_ckpt_global_step.txt' names step 50, but '" + local +
        "/global_step_50' is not a committed checkpoint"}},
      {"every local step and durable step 30 corrupt",
       [&] {
         for (int step : {20, 25, 30}) flip_byte(data_file(local, step, "__0_0.safetensors"));
         flip_byte(data_file(durable, 30, "__1_0.safetensors"));
       },
       durable + "/global_step_20",
       {"local step 30 rejected", "durable step 30 rejected", "local step 25 rejected", "local step 20 rejected",
        "resumed durable step 20 after rejecting"}},
  };
  for (const auto& c : cases) {
    BOOST_TEST_CONTEXT(c.what) {
      fs::remove_all(run);
      fs::copy(dir / "base", run, fs::copy_options::recursive);
      c.spoil();
      std::vector<std::string> sets = tiered(run, 40, 5, 3, true);
      auto r = train(sets);
      BOOST_REQUIRE_MESSAGE(r.code == 0, r.output);
      BOOST_TEST(r.output.find("resumed from " + c.resumed + " at step") != std::string::npos, r.output);
      for (const auto& said : c.said) BOOST_TEST(r.output.find(said) != std::string::npos, said << " in: " << r.output);
      // Training went on to step 40 exactly as without the interruption, in both tiers.
      expect_same_files(dir / "straight/global_step_40", local + "/global_step_40");
      expect_same_files(dir / "straight/global_step_40", durable + "/global_step_40");
      BOOST_TEST(test::read_file(durable + "/latest_ckpt_global_step.txt") == "40\n");
      // A corrupt durable step that was resumed past is saved again, whole.
      auto verify = test::run_command(kBin + "/stagehand-ckpt verify " + durable + "/global_step_30");
      BOOST_TEST(verify.code == 0, verify.output);
    }
  }
  // Nothing loads anywhere: the run fails naming every step of both tiers, and changes nothing.
  fs::remove_all(run);
  fs::copy(dir / "base", run, fs::copy_options::recursive);
  for (int step : {20, 25, 30}) flip_byte(data_file(local, step, "__0_0.safetensors"));
  for (int step : {10, 20, 30}) flip_byte(data_file(durable, step, "__0_0.safetensors"));
  auto none = train(tiered(run, 40, 5, 3, true));
  BOOST_TEST(none.code == 1, none.output);
  for (const std::string& said : std::vector<std::string>{"no committed checkpoint in '" + local + "' or '" + durable + "' could be resumed",
                                 "durable step 10 rejected", "local step 20 rejected", "nothing was changed"}) {
    BOOST_TEST(none.output.find(said) != std::string::npos, said << " in: " << none.output);
  }
  BOOST_TEST((test::committed_steps(local) == std::vector<std::int64_t>{20, 25, 30}));
  BOOST_TEST((test::committed_steps(durable) == std::vector<std::int64_t>{10, 20, 30}));
}

/// A tiered run whose local tier is one folder per host (`<dir>/host{host}/local`): one rank per
/// host, each rank's files also on the next host.
std::vector<std::string> per_host(const std::string& dir, int total, bool resume) {
  std::vector<std::string> out = tiered(dir, total, 5, 3, resume);
  out[0] = "trainer.local_ckpt_path=" + dir + "/host{host}/local";
  // Each host's disk, mounted: the folder's parent exists, as ckpt_path's must.
  for (int h = 0; h < 4; ++h) fs::create_directories(dir + "/host" + std::to_string(h));
  for (const char* s : {"trainer.ranks_per_host=1", "trainer.local_replication_factor=2",
                        "trainer.local_replication_stride=1"}) {
    out.push_back(s);
  }
  return out;
}

/// The host folders' copies of step `step` together are `straight`'s files: each file a host
/// holds equals the one of the same name there, and every one is held by some host.
void expect_same_over_hosts(const std::string& straight, const std::string& run, int step) {
  const std::string dir = "/global_step_" + std::to_string(step);
  auto expected = test::files_of(straight + dir);
  std::map<std::string, int> held;
  for (int h = 0; h < 4; ++h) {
    const std::string host = run + "/host" + std::to_string(h) + "/local" + dir;
    for (const auto& [name, bytes] : test::files_of(host)) {
      BOOST_TEST((expected.count(name) == 1 && expected[name] == bytes), name << " differs in " << host);
      ++held[name];
    }
  }
  for (const auto& [name, bytes] : expected) {
    // Data files on their two hosts; metadata.json and trainer_state.json on all four.
    BOOST_TEST(held[name] == (name.find("safetensors") != std::string::npos ? 2 : 4), name << " in " << run << dir);
  }
}

BOOST_AUTO_TEST_CASE(a_lost_host_resumes_from_its_replicas_and_a_part_no_copy_of_which_verifies_is_named) {
  TempDir dir;
  train_ok(straight(dir / "straight", 40));
  fs::create_directories(dir / "base");
  auto first = train(per_host(dir / "base", 30, false));
  BOOST_REQUIRE_MESSAGE(first.code == 0, first.output);
  BOOST_TEST(first.output.find("the local tier spans 4 host folders (1 ranks per host), each rank's files on 2 of them, "
                               "1 host(s) apart") != std::string::npos,
             first.output);
  expect_same_over_hosts(dir / "straight", dir / "base", 30);
  const std::string run = dir / "run";
  const std::string pattern = run + "/host{host}/local";
  auto host_file = [&](int host, const std::string& name) {
    return run + "/host" + std::to_string(host) + "/local/global_step_30/policy/" + name;
  };
  struct Case {
    std::string what;
    std::function<void()> spoil;
    std::string resumed;
    std::vector<std::string> said;
  };
  const std::vector<Case> cases{
      {"host 2 lost (its folder removed)", [&] { fs::remove_all(run + "/host2"); }, pattern + "/global_step_30",
       {"2 part(s) whose own host has no copy are read from their replicas: rank 2's part '__2_0.safetensors' from "
        "host 3 (host 2's folder lacks the step); rank 2's part '__2_1.safetensors' from host 3"}},
      {"a flipped byte in rank 1's own copy", [&] { flip_byte(host_file(1, "__1_0.safetensors")); },
       pattern + "/global_step_30",
       {"1 damaged or missing copies rewritten from copies that verify: host 1's copy of rank 1's part "
        "'__1_0.safetensors' from host 2"}},
      {"rank 1's part damaged on its host and missing from its replica",
       [&] {
         flip_byte(host_file(1, "__1_0.safetensors"));
         fs::remove(host_file(2, "__1_0.safetensors"));
       },
       durable_dir(run, 30),
       {"local step 30 rejected: rank 1's part '__1_0.safetensors': host 1's copy has XXH3 ",
        ", host 2 has none, host 0 has none, host 3 has none; no replica verifies",
        "resumed durable step 30 after rejecting what is newer"}},
  };
  for (const auto& c : cases) {
    BOOST_TEST_CONTEXT(c.what) {
      fs::remove_all(run);
      fs::copy(dir / "base", run, fs::copy_options::recursive);
      c.spoil();
      auto r = train(per_host(run, 40, true));
      BOOST_REQUIRE_MESSAGE(r.code == 0, r.output);
      BOOST_TEST(r.output.find("resumed from " + c.resumed + " at step 30") != std::string::npos, r.output);
      for (const auto& said : c.said) BOOST_TEST(r.output.find(said) != std::string::npos, said << " in: " << r.output);
      // Training went on exactly as without the interruption; the lost host's folder has its
      // files again.
      expect_same_over_hosts(dir / "straight", run, 40);
      expect_same_files(dir / "straight/global_step_40", run + "/durable/global_step_40");
    }
  }
  // Two hosts of two ranks over the four hosts' folders: refused before anything is touched.
  auto sets = per_host(run, 50, true);
  sets.push_back("trainer.ranks_per_host=2");
  auto fewer = train(sets, true);
  BOOST_TEST(fewer.code != 0, fewer.output);
  BOOST_TEST(fewer.output.find("trainer.local_ckpt_path: '" + pattern + "' was written by 4 host folders") != std::string::npos,
             fewer.output);
  BOOST_TEST(fewer.output.find("the folders of hosts 2 to 3 would never be read") != std::string::npos, fewer.output);
  BOOST_TEST(test::read_file(run + "/host0/local/latest_ckpt_global_step.txt") == "40\n");
}

BOOST_AUTO_TEST_CASE(a_resume_uploads_the_step_the_durable_tier_lacks_or_whose_tracker_never_moved) {
  TempDir dir;
  train_ok(straight(dir / "straight", 30));
  fs::create_directories(dir / "base");
  train_ok(tiered(dir / "base", 20, 5, 1, false));
  const std::string run = dir / "run";
  struct Case {
    std::string what;
    bool keep_step_20;
    std::string said;
  };
  // A run killed after the commit of local step 20 and before its upload; or killed in the
  // upload's commit, after the rename and before the tracker moved.
  for (const Case& c : {Case{"not uploaded", false, "committed but not in '" + run + "/durable' yet"},
                        Case{"the tracker not moved", true, "committed but not named by the tracker of '" + run +
                                                                "/durable' yet"}}) {
    BOOST_TEST_CONTEXT(c.what) {
      fs::remove_all(run);
      fs::copy(dir / "base", run, fs::copy_options::recursive);
      if (!c.keep_step_20) fs::remove_all(run + "/durable/global_step_20");
      std::ofstream(run + "/durable/latest_ckpt_global_step.txt") << "10\n";
      const std::string metrics = dir / "metrics.jsonl";
      auto second = train(tiered(run, 30, 5, 1, true), false, metrics);
      BOOST_REQUIRE_MESSAGE(second.code == 0, second.output);
      auto uploads = lines_of(metrics, "upload");
      BOOST_REQUIRE(uploads.size() == 2u);
      BOOST_TEST(uploads[0]["step"] == 20);
      BOOST_TEST(uploads[0]["ok"] == true);
      // Copied again over the complete step whose tracker never moved.
      BOOST_TEST(uploads[0]["replaced"] == c.keep_step_20);
      BOOST_TEST(second.output.find("uploading step 20 of the local tier, " + c.said) != std::string::npos,
                 second.output);
      BOOST_TEST((test::committed_steps(run + "/durable") == std::vector<std::int64_t>{10, 20, 30}));
      expect_same_files(dir / "straight/global_step_20", run + "/durable/global_step_20");
      expect_same_files(dir / "straight/global_step_30", run + "/durable/global_step_30");
      BOOST_TEST(test::read_file(run + "/durable/latest_ckpt_global_step.txt") == "30\n");
      // With local_max_ckpts_to_keep 1, only the newest local step stays once it is uploaded.
      BOOST_TEST((test::committed_steps(run + "/local") == std::vector<std::int64_t>{30}));
    }
  }
}

BOOST_AUTO_TEST_CASE(a_lost_local_tier_resumes_from_the_durable_tracker_past_a_step_it_never_named) {
  TempDir dir;
  train_ok(straight(dir / "straight", 40));
  train_ok(tiered(dir.path(), 30, 5, 3, false));
  // The upload of step 30 was killed after its rename, before the tracker moved; then the host
  // was lost with its local tier.
  std::ofstream(dir / "durable/latest_ckpt_global_step.txt") << "20\n";
  fs::remove_all(dir / "local");
  auto r = train(tiered(dir.path(), 40, 5, 3, true));
  BOOST_REQUIRE_MESSAGE(r.code == 0, r.output);
  BOOST_TEST(r.output.find("resumed from " + dir / "durable/global_step_20 at step 20") != std::string::npos, r.output);
  BOOST_TEST((test::committed_steps(dir / "durable") == std::vector<std::int64_t>{10, 20, 30, 40}));
  BOOST_TEST(test::read_file(dir / "durable/latest_ckpt_global_step.txt") == "40\n");
  for (int step : {30, 40}) {
    expect_same_files(dir / ("straight/global_step_" + std::to_string(step)),
                      dir / ("durable/global_step_" + std::to_string(step)));
  }
}

BOOST_AUTO_TEST_CASE(a_failed_last_upload_fails_the_run_naming_it_and_the_next_run_uploads_it) {
  TempDir dir;
  train_ok(tiered(dir.path(), 20, 5, 2, false));
  // Something in the way of step 30's folder in the durable tier: its copy cannot commit. The
  // durable tracker names a step that is not there (50): what the durable tier holds is 20.
  std::ofstream(dir / "durable/global_step_30") << "in the way\n";
  std::ofstream(dir / "durable/latest_ckpt_global_step.txt") << "50\n";
  auto cut = train(tiered(dir.path(), 30, 5, 2, true));
  BOOST_TEST(cut.code == 1, cut.output);
  for (const std::string& said : std::vector<std::string>{
           "the upload of step 30 to '" + dir / "durable" + "' failed (the durable tier still holds step 20",
           "did not receive step 30, committed in the local tier", "durable tier: 0 uploads to " + dir / "durable" +
                                                                       ", 1 failed; it holds step 20"}) {
    BOOST_TEST(cut.output.find(said) != std::string::npos, said << " in: " << cut.output);
  }
  BOOST_TEST(test::read_file(dir / "durable/latest_ckpt_global_step.txt") == "50\n");
  BOOST_TEST((test::committed_steps(dir / "durable") == std::vector<std::int64_t>{10, 20}));
  fs::remove(dir / "durable/global_step_30");
  auto next = train(tiered(dir.path(), 30, 5, 2, true));
  BOOST_REQUIRE_MESSAGE(next.code == 0, next.output);
  BOOST_TEST(next.output.find("uploading step 30 of the local tier") != std::string::npos, next.output);
  BOOST_TEST(test::read_file(dir / "durable/latest_ckpt_global_step.txt") == "30\n");
  auto verify = test::run_command(kBin + "/stagehand-ckpt verify " + dir / "durable/global_step_30");
  BOOST_TEST(verify.code == 0, verify.output);
}

BOOST_AUTO_TEST_CASE(an_upload_to_a_durable_folder_that_stops_answering_ends_the_run_at_the_call_limit) {
  TempDir dir;
  // Making any file of step 10's copy never returns (a hung NFS or FUSE mount): the upload of
  // step 10 hangs from the start, and step 20's waits behind it. The run must end on its own
  // (`timeout` only guards the test: it would kill with 137).
  auto sets = tiered(dir.path(), 20, 5, 2, false);
  sets.push_back("trainer.call_timeout_s=3");
  auto hung = train(sets, false, "",
                    "STAGEHAND_TEST_HANG_FILES_UNDER='" + dir / "durable/global_step_10" + "' timeout -s KILL 90 ");
  BOOST_TEST(hung.code == 1, hung.output);
  for (const std::string& said : std::vector<std::string>{
           "the upload of step 10 to '" + dir / "durable" +
               "' made no progress for 3 s (trainer.call_timeout_s: a file system that does not answer?); the "
               "durable tier holds no step yet; the local tier keeps the newest step it lacks",
           "the upload of step 20 to '" + dir / "durable" + "' was not started (the run stopped)",
           "the upload of step 10 to '" + dir / "durable" + "' is left behind"}) {
    BOOST_TEST(hung.output.find(said) != std::string::npos, said << " in: " << hung.output);
  }
  BOOST_TEST(!test::read_tracker(dir / "durable")->has_value());
  BOOST_TEST(**test::read_tracker(dir / "local") == 20);
  BOOST_TEST(fs::exists(data_file(dir / "local", 20, "metadata.json")));
  // Once the folder answers again, the next run uploads what the durable tier lacks.
  auto next = train(tiered(dir.path(), 20, 5, 2, true));
  BOOST_REQUIRE_MESSAGE(next.code == 0, next.output);
  BOOST_TEST(next.output.find("uploading step 20 of the local tier") != std::string::npos, next.output);
  BOOST_TEST(test::read_file(dir / "durable/latest_ckpt_global_step.txt") == "20\n");
  auto verify = test::run_command(kBin + "/stagehand-ckpt verify " + dir / "durable/global_step_20");
  BOOST_TEST(verify.code == 0, verify.output);
}

BOOST_AUTO_TEST_CASE(tier_settings_that_cannot_work_are_refused_naming_them) {
  TempDir dir;
  struct Case {
    std::vector<std::string> sets;
    std::string said;
  };
  const std::vector<Case> cases{
      {{"trainer.local_ckpt_path=s3://bucket/local"}, "trainer.local_ckpt_path: must be a node-local folder"},
      {{"trainer.local_ckpt_path=" + dir / "ckpt", "trainer.ckpt_path=" + dir / "ckpt/"},
       "must be separate folders, neither inside the other"},
      {{"trainer.local_ckpt_path=" + dir / "ckpt/local", "trainer.ckpt_path=" + dir / "ckpt"},
       "must be separate folders, neither inside the other"},
      {{"trainer.local_ckpt_path=" + dir / "l/", "trainer.ckpt_path=" + dir / "l/d"},
       "must be separate folders, neither inside the other"},
      {{"trainer.local_ckpt_path=" + dir / "l/../x", "trainer.ckpt_path=" + dir / "x/d"},
       "must be separate folders, neither inside the other"},
      {{"trainer.local_ckpt_path=" + dir / "local", "trainer.ckpt_path=" + dir / "ckpt",
        "trainer.local_ckpt_interval=0"},
       "trainer.local_ckpt_interval"},
      {{"trainer.local_ckpt_path=" + dir / "local", "trainer.ckpt_path=" + dir / "ckpt",
        "trainer.local_replication_factor=2"},
       "copies on other hosts need each host's own folder: trainer.local_ckpt_path must hold {host}"},
      {{"trainer.local_ckpt_path=" + dir / "h{host}", "trainer.ckpt_path=" + dir / "ckpt", "trainer.ranks_per_host=2",
        "trainer.local_replication_factor=3"},
       "3 copies of each rank's files, hosts 1 apart, over the 2 host(s) of 4 ranks at 2 per host would put two on "
       "one host: at most 2"},
      {{"trainer.local_ckpt_path=" + dir / "local", "trainer.ckpt_path=" + dir / "ckpt",
        "trainer.local_replication_transport=network"},
       "network reaches other hosts' folders of the local tier: trainer.local_ckpt_path must hold {host}"},
      {{"trainer.local_replication_transport=tcp"}, "trainer.local_replication_transport"},
      // In one process every host's folder is this process's: there is no other host to serve.
      {{"trainer.local_ckpt_path=" + dir / "h{host}", "trainer.ckpt_path=" + dir / "ckpt", "trainer.ranks_per_host=2",
        "trainer.local_replication_factor=2", "trainer.local_replication_transport=network"},
       "trainer.local_replication_transport network needs one process per rank"},
      {{"trainer.local_ckpt_path=" + dir / "h{host}", "trainer.ckpt_path=" + dir / "ckpt{host}"},
       "trainer.ckpt_path: holds {host}, which only trainer.local_ckpt_path may"},
      {{"trainer.local_ckpt_path=" + dir / "h{host}", "trainer.ckpt_path=" + dir / "h1/durable", "trainer.ranks_per_host=1"},
       "host 1's folder '" + dir / "h1" + "' of the local tier and the durable tier '" + dir / "h1/durable" +
           "' must be separate folders"},
  };
  for (const auto& c : cases) {
    auto r = train(c.sets, true);
    BOOST_TEST(r.code != 0, r.output);
    BOOST_TEST(r.output.find(c.said) != std::string::npos, c.said << " in: " << r.output);
  }
  // A fresh start over a durable tier that holds checkpoints is refused as without tiers.
  train_ok(tiered(dir.path(), 10, 5, 2, false));
  fs::remove_all(dir / "local");
  auto again = train(tiered(dir.path(), 10, 5, 2, false), true);
  BOOST_TEST(again.code != 0, again.output);
  BOOST_TEST(again.output.find("trainer.ckpt_path '" + dir / "durable" + "' holds committed checkpoints") !=
                 std::string::npos,
             again.output);
}

BOOST_AUTO_TEST_CASE(sigterm_names_what_each_tier_holds) {
  TempDir dir;
  // A long run stopped by SIGTERM after a few seconds (`timeout` sends it and passes the exit code on).
  auto r = train(tiered(dir.path(), 1000000, 3, 2, false), false, "", "timeout --preserve-status -s TERM 4 ");
  BOOST_TEST(r.code == 0, r.output);
  const auto at = r.output.find("stopped by signal: checkpoint of step ");
  BOOST_REQUIRE_MESSAGE(at != std::string::npos, r.output);
  const std::int64_t step = std::stoll(r.output.substr(at + 38));
  auto tracked = test::read_tracker(dir / "durable");
  BOOST_REQUIRE_MESSAGE(tracked.is_ok() && tracked->has_value(), "no upload landed in the run: " << r.output);
  const std::int64_t durable = **tracked;
  BOOST_TEST(r.output.find("is committed in the local tier '" + dir / "local" + "'; the durable tier '" + dir /
                           "durable" + "' holds step " + std::to_string(durable) + "; exiting") != std::string::npos,
             r.output);
  BOOST_TEST(**test::read_tracker(dir / "local") == step);
  BOOST_TEST(durable <= step);
  BOOST_TEST(durable % 10 == 0);
  // What the durable tier lacks is in the local tier: the newest tenth step after its tracker's
  // (when there is one) is kept there; no half-copied step is left in the durable tier.
  const std::int64_t owed = step / 10 * 10;
  if (owed > durable) {
    BOOST_TEST(fs::exists(dir / ("local/global_step_" + std::to_string(owed) + "/policy/metadata.json")), owed);
  }
  for (const auto& entry : fs::directory_iterator(dir / "durable")) {
    BOOST_TEST(entry.path().extension() != ".tmp", entry.path());
  }
}

BOOST_AUTO_TEST_CASE(an_object_store_durable_tier_is_not_taken_for_a_folder_inside_the_local_one) {
  TempDir dir;
  // Started from inside the local tier's folder, with an s3:// durable tier: the nesting check
  // must not read the URL as a relative path below the working folder. The store is unreachable,
  // so the run fails, for that reason.
  fs::create_directories(dir / "local/job");
  auto r = test::run_command("cd " + dir / "local/job" +
                             " && AWS_ACCESS_KEY_ID=a AWS_SECRET_ACCESS_KEY=b AWS_ENDPOINT_URL=http://127.0.0.1:1 " +
                             kBin + "/stagehand-train --quiet --config " + kConfig + " --set trainer.local_ckpt_path=" +
                             dir / "local" + " --set trainer.ckpt_path=s3://bucket/run --set storage.s3.max_attempts=1");
  BOOST_TEST(r.code != 0, r.output);
  BOOST_TEST(r.output.find("cannot reach the object store") != std::string::npos, r.output);
  BOOST_TEST(r.output.find("separate folders") == std::string::npos, r.output);
}
