#define BOOST_TEST_MODULE train
#include <boost/test/unit_test.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <nlohmann/json.hpp>
#include <thread>

#include "tests/checkpoint_test_util.hpp"
#include "stagehand/checkpoint/format/format.hpp"
#include "stagehand/checkpoint/load/loader.hpp"
#include "stagehand/checkpoint/load/checkpoint_reader.hpp"
#include "stagehand/checkpoint/load/load_plan.hpp"
#include "stagehand/checkpoint/load/resolve.hpp"
#include "stagehand/checkpoint/load/verify.hpp"
#include "stagehand/storage/default_file_system.hpp"
#include "stagehand/checkpoint/format/trainer_state.hpp"
#include "tests/metadata_edit.hpp"
#include "tests/test_util.hpp"

using namespace stagehand;
using stagehand::test::TempDir;
namespace fs = std::filesystem;

namespace {

const std::string kBin = test::bin_dir();
const std::string kConfigs = test::source_dir() + "/examples/configs/";


using Run = test::CommandRun;

std::string train_command(const std::string& config, const std::vector<std::string>& sets, bool quiet = true) {
  std::string cmd = kBin + "/stagehand-train" + (quiet ? " --quiet" : "") + " --config " + kConfigs + config;
  for (const auto& s : sets) cmd += " --set " + s;
  return cmd;
}

Run train(const std::string& config, const std::vector<std::string>& sets, const std::string& metrics = "") {
  std::string cmd = train_command(config, sets);
  if (!metrics.empty()) cmd += " --metrics-out " + metrics;
  return test::run_command(cmd);
}

/// Like train(), with the progress lines (no --quiet).
Run train_verbose(const std::string& config, const std::vector<std::string>& sets) {
  return test::run_command(train_command(config, sets, false));
}

/// Waits (at most 60 s) until `path` exists: a run that created its ckpt_path has its signal
/// handlers installed (a loaded machine may take longer than any fixed sleep to get there).
void wait_for_path(const std::string& path) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!fs::exists(path) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

/// A stagehand-train run in the background, its output going to a file.
class BackgroundRun {
 public:
  BackgroundRun(const std::string& config, const std::vector<std::string>& sets, std::string out, bool quiet = true)
      : out_(std::move(out)) {
    const std::string shell = "exec " + train_command(config, sets, quiet) + " > " + out_ + " 2>&1";
    pid_ = ::fork();
    if (pid_ == 0) {
      ::execl("/bin/sh", "sh", "-c", shell.c_str(), nullptr);
      ::_exit(127);
    }
  }
  ~BackgroundRun() {
    if (code_ == kRunning) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  pid_t pid() const { return pid_; }
  void signal(int sig) const { ::kill(pid_, sig); }
  /// The exit code, or -1 when it did not exit normally within `limit`.
  int wait(std::chrono::seconds limit) {
    auto deadline = std::chrono::steady_clock::now() + limit;
    int status = 0;
    while (code_ == kRunning && std::chrono::steady_clock::now() < deadline) {
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return code_ == kRunning ? -1 : code_;
  }
  std::string output() const { return test::read_file(out_); }

 private:
  static constexpr int kRunning = -2;
  std::string out_;
  pid_t pid_ = -1;
  int code_ = kRunning;
};

/// Waits up to `limit` for `path` to exist.
bool wait_for_file(const std::string& path, std::chrono::seconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (!fs::exists(path)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(test::read_file(path)); }

void write_json(const std::string& path, const nlohmann::json& j) { std::ofstream(path) << j.dump(1) << "\n"; }

std::string hostname() {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  return name;
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

}  // namespace

BOOST_AUTO_TEST_CASE(learning_is_real_for_every_trainer) {
  struct Case {
    const char* config;
    const char* metric;
  };
  for (Case c : {Case{"sync_rl.yaml", "reward"}, Case{"sft.yaml", "loss"}, Case{"fully_async_rl.yaml", "reward"}}) {
    BOOST_TEST_CONTEXT(c.config) {
      TempDir dir;
      Run r = train(c.config, {"trainer.ckpt_path=" + dir / "ckpt"}, dir / "metrics.jsonl");
      BOOST_REQUIRE_MESSAGE(r.code == 0, r.output);
      auto steps = lines_of(dir / "metrics.jsonl", "step");
      BOOST_REQUIRE(!steps.empty());
      BOOST_TEST(steps.front()["accuracy"].get<double>() < 0.35);  // chance is 1/8
      BOOST_TEST(steps.back()["accuracy"].get<double>() >= 0.9);
      BOOST_TEST(steps.back().contains(c.metric));
      auto saves = lines_of(dir / "metrics.jsonl", "save");
      BOOST_REQUIRE(!saves.empty());
      // Each save says where its time went.
      for (const auto& save : saves) {
        for (const char* phase : {"copy_s", "hash_s", "write_s", "fsync_s", "upload_s", "commit_s", "save_s"}) {
          BOOST_TEST((save.contains(phase) && save[phase].is_number()), phase << " missing in " << save.dump());
        }
        BOOST_TEST(save["write_s"].get<double>() > 0.0);
        BOOST_TEST(save["commit_s"].get<double>() > 0.0);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(fully_async_stays_within_the_staleness_bound_and_twice_the_sync_steps) {
  for (int bound : {1, 3}) {
    BOOST_TEST_CONTEXT("max_staleness_steps " << bound) {
      TempDir dir;
      Run r = train("fully_async_rl.yaml",
                    {"trainer.ckpt_path=" + dir / "ckpt", "fully_async.max_staleness_steps=" + std::to_string(bound)},
                    dir / "metrics.jsonl");
      BOOST_REQUIRE_MESSAGE(r.code == 0, r.output);
      auto steps = lines_of(dir / "metrics.jsonl", "step");
      int stale = 0;
      for (const auto& s : steps) {
        std::int64_t staleness = s["staleness"].get<std::int64_t>();
        BOOST_TEST(staleness <= bound);
        BOOST_TEST(staleness >= 0);
        BOOST_TEST(s["step"].get<std::int64_t>() - 1 - s["behaviour_version"].get<std::int64_t>() == staleness);
        stale += staleness > 0;
      }
      BOOST_TEST(stale > static_cast<int>(steps.size()) / 2);  // generation really ran ahead
    }
  }
  auto config = test::read_file(kConfigs + "fully_async_rl.yaml");
  auto sync = test::read_file(kConfigs + "sync_rl.yaml");
  BOOST_TEST(config.find("total_steps: 800") != std::string::npos);
  BOOST_TEST(sync.find("total_steps: 500") != std::string::npos);
}

// Issue 57: the generators get each version over the shared-memory channel and over TCP (every
// trainer rank pushing its part, the replicas split) exactly as over the tensor-parallel collectives.
BOOST_AUTO_TEST_CASE(fully_async_over_shared_memory_and_tcp_trains_what_it_trains_over_collectives) {
  TempDir dir;
  for (std::string transport : {"shm", "tcp", "collective"}) {
    Run r = train("fully_async_rl.yaml", {"trainer.ckpt_path=" + dir / transport, "trainer.total_steps=30",
                                          "fully_async.max_staleness_steps=2", "weight_sync.transport=" + transport},
                  dir / (transport + ".jsonl"));
    BOOST_REQUIRE_MESSAGE(r.code == 0, r.output);
  }
  auto y = lines_of(dir / "collective.jsonl", "step");
  BOOST_REQUIRE(y.size() == 30u);
  for (std::string transport : {"shm", "tcp"}) {
    BOOST_TEST_CONTEXT(transport) {
      BOOST_TEST(test::checkpoint_difference(dir / (transport + "/global_step_30"), dir / "collective/global_step_30") == "");
      auto x = lines_of(dir / (transport + ".jsonl"), "step");
      BOOST_REQUIRE(x.size() == 30u);
      for (std::size_t i = 0; i < x.size(); ++i) {
        BOOST_TEST(x[i]["reward"] == y[i]["reward"]);
        BOOST_TEST(x[i]["behaviour_version"] == y[i]["behaviour_version"]);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(resume_is_bit_exact_for_every_trainer_and_save_mode) {
  for (std::string config : {"sync_rl.yaml", "sft.yaml", "fully_async_rl.yaml"}) {
    for (std::string async : {"true", "false"}) {
      BOOST_TEST_CONTEXT(config << " async " << async) {
        TempDir dir;
        std::vector<std::string> common{"megatron_config.async_dist_ckpt_save=" + async,
                                        "megatron_config.ckpt_save_staging_buckets=0", "trainer.ckpt_interval=0"};
        auto with = [&](std::vector<std::string> extra) {
          extra.insert(extra.end(), common.begin(), common.end());
          return extra;
        };
        Run straight = train(config, with({"trainer.ckpt_path=" + dir / "straight", "trainer.total_steps=40"}));
        BOOST_REQUIRE_MESSAGE(straight.code == 0, straight.output);
        Run first = train(config, with({"trainer.ckpt_path=" + dir / "split", "trainer.total_steps=20"}));
        BOOST_REQUIRE_MESSAGE(first.code == 0, first.output);
        Run second = train(config, with({"trainer.ckpt_path=" + dir / "split", "trainer.total_steps=40",
                                         "trainer.resume_mode=latest"}));
        BOOST_REQUIRE_MESSAGE(second.code == 0, second.output);
        BOOST_TEST(test::checkpoint_difference(dir / "straight/global_step_40", dir / "split/global_step_40") == "");
      }
    }
  }
}

// Issue 15: async saves staged in waves behind the fence (the reference model fences right before
// its Adam update) write what sync saves write, step after step, while training goes on.
BOOST_AUTO_TEST_CASE(async_saves_with_staging_waves_match_sync_saves) {
  TempDir dir;
  struct Mode {
    std::string name;
    std::vector<std::string> sets;
  };
  const std::vector<Mode> modes{
      {"sync", {"megatron_config.async_dist_ckpt_save=false", "megatron_config.ckpt_save_staging_buckets=0"}},
      {"async1", {"megatron_config.async_dist_ckpt_save=true", "megatron_config.ckpt_save_staging_buckets=1"}},
      {"async2_per_save",
       {"megatron_config.async_dist_ckpt_save=true", "megatron_config.ckpt_save_staging_buckets=2",
        "megatron_config.ckpt_staging_memory=per_save"}},
  };
  for (const auto& mode : modes) {
    std::vector<std::string> sets{"trainer.ckpt_path=" + dir / mode.name, "trainer.total_steps=12",
                                  "trainer.ckpt_interval=3", "trainer.max_ckpts_to_keep=0",
                                  "megatron_config.ckpt_save_thread_count=4", "model.hidden=2048"};
    sets.insert(sets.end(), mode.sets.begin(), mode.sets.end());
    Run r = train("sync_rl.yaml", sets, dir / (mode.name + ".jsonl"));
    BOOST_REQUIRE_MESSAGE(r.code == 0, mode.name << ": " << r.output);
    auto saves = lines_of(dir / (mode.name + ".jsonl"), "save");
    BOOST_TEST(saves.size() == 4u, mode.name);
    for (const auto& save : saves) BOOST_TEST(save.contains("fence_wait_s"), save.dump());
    for (const auto& step : lines_of(dir / (mode.name + ".jsonl"), "step")) {
      BOOST_TEST(step.contains("fence_wait_s"), step.dump());
    }
  }
  for (std::string step : {"global_step_3", "global_step_6", "global_step_9", "global_step_12"}) {
    auto sync = test::files_of(dir / "sync/" + step);
    BOOST_REQUIRE(sync.count("policy/metadata.json") == 1u);
    for (std::string mode : {"async1", "async2_per_save"}) {
      auto other = test::files_of(dir / mode + "/" + step);
      BOOST_TEST(other.size() == sync.size(), mode << " " << step);
      for (const auto& [name, bytes] : sync) BOOST_TEST((other[name] == bytes), mode << " " << step << "/" << name);
    }
  }
}

BOOST_AUTO_TEST_CASE(retention_keeps_exactly_the_newest_committed) {
  for (std::string async : {"true", "false"}) {
    TempDir dir;
    Run r = train("sync_rl.yaml", {"trainer.ckpt_path=" + dir / "ckpt", "trainer.total_steps=50", "trainer.ckpt_interval=10",
                                   "trainer.max_ckpts_to_keep=2", "megatron_config.async_dist_ckpt_save=" + async});
    BOOST_REQUIRE_MESSAGE(r.code == 0, r.output);
    BOOST_TEST((test::committed_steps(dir / "ckpt") == std::vector<std::int64_t>{40, 50}));
    BOOST_TEST(**test::read_tracker(dir / "ckpt") == 50);
    // Saves 30-50 wrote over the data files of the steps retention removed (trainer.ckpt_reuse_files,
    // default true): the same bytes as a run that frees them, and no spares left after the run.
    BOOST_TEST(r.output.find("data file(s) of retired steps written over below") != std::string::npos, r.output);
    BOOST_TEST(!fs::exists(dir / "ckpt/.spare_files"));
    Run freed = train("sync_rl.yaml", {"trainer.ckpt_path=" + dir / "freed", "trainer.total_steps=50",
                                       "trainer.ckpt_interval=10", "trainer.max_ckpts_to_keep=2",
                                       "trainer.ckpt_reuse_files=false", "megatron_config.async_dist_ckpt_save=" + async});
    BOOST_REQUIRE_MESSAGE(freed.code == 0, freed.output);
    BOOST_TEST(freed.output.find("written over") == std::string::npos, freed.output);
    for (std::string step : {"global_step_40", "global_step_50"}) {
      auto reused = test::files_of(dir / "ckpt/" + step);
      auto fresh = test::files_of(dir / "freed/" + step);
      BOOST_TEST(reused.size() == fresh.size(), step);
      for (const auto& [name, bytes] : fresh) BOOST_TEST((reused[name] == bytes), step << "/" << name);
    }
  }
}

BOOST_AUTO_TEST_CASE(resume_errors_are_clear) {
  TempDir dir;
  Run missing = train("sync_rl.yaml", {"trainer.ckpt_path=" + dir / "ckpt", "trainer.resume_mode=from_path",
                                       "trainer.resume_path=" + dir / "nothing"});
  BOOST_TEST(missing.code != 0);
  BOOST_TEST(missing.output.find("trainer.resume_path") != std::string::npos, missing.output);
  fs::create_directories(dir / "ckpt/global_step_5.tmp/policy");
  Run tmp = train("sync_rl.yaml", {"trainer.ckpt_path=" + dir / "ckpt", "trainer.resume_mode=from_path",
                                   "trainer.resume_path=" + dir / "ckpt/global_step_5.tmp"});
  BOOST_TEST(tmp.code != 0);
  BOOST_TEST(tmp.output.find("uncommitted") != std::string::npos, tmp.output);
  Run no_parent = train("sync_rl.yaml", {"trainer.ckpt_path=" + dir / "missing/ckpt"}, dir / "m.jsonl");
  BOOST_TEST(no_parent.code != 0);
  BOOST_TEST(no_parent.output.find("does not exist") != std::string::npos, no_parent.output);
  BOOST_TEST(lines_of(dir / "m.jsonl", "step").empty());  // it failed before training
  Run wrong_kind_base = train("sft.yaml", {"trainer.ckpt_path=" + dir / "sft", "trainer.total_steps=5"});
  BOOST_REQUIRE(wrong_kind_base.code == 0);
  Run wrong_kind = train("sync_rl.yaml", {"trainer.ckpt_path=" + dir / "sft", "trainer.resume_mode=latest"});
  BOOST_TEST(wrong_kind.code != 0);
  BOOST_TEST(wrong_kind.output.find("written by the sft trainer") != std::string::npos, wrong_kind.output);
  BOOST_TEST(wrong_kind.output.find("set trainer.init_from") != std::string::npos, wrong_kind.output);
}

BOOST_AUTO_TEST_CASE(sigterm_saves_drains_and_exits_cleanly) {
  TempDir dir;
  BackgroundRun run("sync_rl.yaml",
                    {"trainer.ckpt_path=" + dir / "ckpt", "trainer.total_steps=100000000", "trainer.ckpt_interval=0",
                     "megatron_config.async_dist_ckpt_save=true", "model.hidden=2048"},
                    dir / "out.txt");
  wait_for_path(dir / "ckpt");
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  run.signal(SIGTERM);
  int code = run.wait(std::chrono::seconds(120));
  std::string text = run.output();
  BOOST_TEST(code == 0, text);
  auto pos = text.find("stopped by signal: checkpoint of step ");
  BOOST_REQUIRE_MESSAGE(pos != std::string::npos, text);
  std::int64_t step = std::stoll(text.substr(pos + 38));
  BOOST_TEST(step > 0);
  // By the time the process exited, that checkpoint was committed.
  BOOST_TEST(**test::read_tracker(dir / "ckpt") == step);
  BOOST_TEST(!fs::exists(dir / ("ckpt/global_step_" + std::to_string(step) + ".tmp")));
  BOOST_TEST(verify_checkpoint(dir / ("ckpt/global_step_" + std::to_string(step)))->ok());
  Run resumed = train("sync_rl.yaml", {"trainer.ckpt_path=" + dir / "ckpt", "trainer.resume_mode=latest",
                                       "trainer.total_steps=" + std::to_string(step + 2), "model.hidden=2048"});
  BOOST_TEST(resumed.code == 0, resumed.output);
  BOOST_TEST(**test::read_tracker(dir / "ckpt") == step + 2);
}

// Issue 15: SIGKILL while async saves with staging waves are in flight (the later waves staged
// behind the fence) leaves the newest committed checkpoint whole, and a run resumes from it.
BOOST_AUTO_TEST_CASE(sigkill_during_async_staging_waves_keeps_the_committed_checkpoint) {
  TempDir dir;
  const std::string root = dir / "ckpt";
  BackgroundRun run("sync_rl.yaml",
                    {"trainer.ckpt_path=" + root, "trainer.total_steps=100000000", "trainer.ckpt_interval=1",
                     "trainer.max_ckpts_to_keep=2", "megatron_config.async_dist_ckpt_save=true",
                     "megatron_config.ckpt_save_thread_count=4", "megatron_config.ckpt_save_staging_buckets=1",
                     "model.hidden=4096"},
                    dir / "out.txt");
  // A save of step 3 or later is in flight: a committed step before it and a .tmp folder.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  bool in_flight = false;
  while (!in_flight && std::chrono::steady_clock::now() < deadline) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(root, ec)) {
      auto step = parse_step_dir_name(e.path().filename().string(), true);
      if (step && *step >= 3) in_flight = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  BOOST_REQUIRE_MESSAGE(in_flight, run.output());
  run.signal(SIGKILL);
  BOOST_TEST(run.wait(std::chrono::seconds(60)) == -1);  // killed, not exited
  auto tracked = test::read_tracker(root);
  BOOST_REQUIRE(tracked.is_ok() && tracked->has_value());
  const std::string committed = CheckpointLayout{root}.step_dir(**tracked);
  BOOST_TEST(verify_checkpoint(committed)->ok());
  Run resumed = train("sync_rl.yaml", {"trainer.ckpt_path=" + root, "trainer.resume_mode=latest",
                                       "trainer.total_steps=" + std::to_string(**tracked + 2), "model.hidden=4096",
                                       "trainer.ckpt_interval=1", "megatron_config.async_dist_ckpt_save=true",
                                       "megatron_config.ckpt_save_thread_count=4",
                                       "megatron_config.ckpt_save_staging_buckets=1"});
  BOOST_TEST(resumed.code == 0, resumed.output);
  BOOST_TEST(**test::read_tracker(root) == **tracked + 2);
}

BOOST_AUTO_TEST_CASE(a_malformed_trainer_state_fails_the_run_naming_the_file_and_field) {
  TempDir dir;
  for (std::string config : {"sync_rl.yaml", "fully_async_rl.yaml"}) {
    Run base = train(config, {"trainer.ckpt_path=" + dir / config, "trainer.total_steps=3"});
    BOOST_REQUIRE_MESSAGE(base.code == 0, base.output);
  }
  struct Case {
    const char* what;
    const char* config;
    std::function<void(nlohmann::json&)> spoil;
    const char* field;
  };
  const std::vector<Case> cases{
      {"seed as a string", "sync_rl.yaml", [](nlohmann::json& j) { j["seed"] = "1234"; }, "seed"},
      {"kind as a number", "sync_rl.yaml", [](nlohmann::json& j) { j["kind"] = 3; }, "kind"},
      {"data_cursor as a string", "sync_rl.yaml", [](nlohmann::json& j) { j["data_cursor"] = "384"; }, "data_cursor"},
      {"negative seed", "sync_rl.yaml", [](nlohmann::json& j) { j["seed"] = -1; }, "seed"},
      {"fully_async not an object", "fully_async_rl.yaml", [](nlohmann::json& j) { j["fully_async"] = 7; },
       "fully_async"},
      {"batch actions not an array", "fully_async_rl.yaml",
       [](nlohmann::json& j) { j["fully_async"]["pending_batches"][0]["actions"] = "many"; },
       "fully_async.pending_batches[0].actions"},
      {"batch version as a string", "fully_async_rl.yaml",
       [](nlohmann::json& j) { j["fully_async"]["pending_batches"][0]["version"] = "2"; },
       "fully_async.pending_batches[0].version"},
      {"batch without a step", "fully_async_rl.yaml",
       [](nlohmann::json& j) { j["fully_async"]["pending_batches"][0].erase("step"); },
       "fully_async.pending_batches[0].step"},
      {"batch with too few actions", "fully_async_rl.yaml",
       [](nlohmann::json& j) { j["fully_async"]["pending_batches"][0]["actions"] = {1, 2}; },
       "fully_async.pending_batches[0].actions"},
      {"batch with an action out of range", "fully_async_rl.yaml",
       [](nlohmann::json& j) { j["fully_async"]["pending_batches"][0]["actions"][0] = 99; },
       "fully_async.pending_batches[0].actions"},
  };
  for (const auto& c : cases) {
    BOOST_TEST_CONTEXT(c.what) {
      std::string root = dir / "spoiled";
      fs::remove_all(root);
      fs::copy(dir / c.config, root, fs::copy_options::recursive);
      std::string state_file = root + "/global_step_3/trainer_state.json";
      nlohmann::json state = read_json(state_file);
      c.spoil(state);
      write_json(state_file, state);
      // As if saved so: the metadata records the spoiled file, so that its fields are what fails.
      test::edit_metadata(root + "/global_step_3", [&](CheckpointMetadata& m) {
        auto recorded = test::trainer_state_meta(root + "/global_step_3");
        BOOST_REQUIRE(recorded.is_ok());
        m.trainer_state = *recorded;
      });
      Run r = train_verbose(c.config, {"trainer.ckpt_path=" + root, "trainer.total_steps=6",
                                       "trainer.resume_mode=latest"});
      BOOST_TEST(r.code == 1, r.output);
      BOOST_TEST(r.output.find(state_file) != std::string::npos, r.output);
      BOOST_TEST(r.output.find("'" + std::string(c.field) + "'") != std::string::npos, r.output);
      BOOST_TEST(r.output.find("unhandled exception") == std::string::npos, r.output);
      BOOST_TEST(**test::read_tracker(root) == 3);
    }
  }
}

BOOST_AUTO_TEST_CASE(malformed_model_objects_fail_the_run_naming_the_object_and_field) {
  TempDir dir;
  Run base = train("sync_rl.yaml", {"trainer.ckpt_path=" + dir / "base", "trainer.total_steps=3"});
  BOOST_REQUIRE_MESSAGE(base.code == 0, base.output);
  struct Case {
    const char* object;
    const char* field;
    nlohmann::json value;
  };
  for (const Case& c : {Case{"scheduler", "step", "3"}, Case{"rng.rank0", "seed", "1234"}}) {
    BOOST_TEST_CONTEXT(c.object << "." << c.field) {
      std::string root = dir / "spoiled";
      fs::remove_all(root);
      fs::copy(dir / "base", root, fs::copy_options::recursive);
      // Saved so (the metadata's checksum matches), so that the object's field is what fails.
      test::edit_metadata(root + "/global_step_3", [&](CheckpointMetadata& m) {
        auto object = nlohmann::json::parse(m.objects.at(c.object));
        object[c.field] = c.value;
        m.objects[c.object] = object.dump();
      });
      Run r = train("sync_rl.yaml",
                    {"trainer.ckpt_path=" + root, "trainer.total_steps=6", "trainer.resume_mode=latest"});
      BOOST_TEST(r.code == 1, r.output);
      BOOST_TEST(r.output.find(c.object) != std::string::npos, r.output);
      BOOST_TEST(r.output.find("'" + std::string(c.field) + "'") != std::string::npos, r.output);
      BOOST_TEST(r.output.find("unhandled exception") == std::string::npos, r.output);
    }
  }
}

// Issue 12 case 5: the step a run resumes at is the checkpoint's, proven by its checksums and by
// agreement of the tracker, the folder name, metadata.json and trainer_state.json.
// Issue 30: resume_mode latest checks before it trusts. A step that does not load whole (a flipped
// byte, a missing file) or a tracker that names a step that is not there is passed over for the
// next older step, named in the output; the run then equals an uninterrupted one bit for bit, and
// the steps it saves again replace the corrupt ones.
BOOST_AUTO_TEST_CASE(resume_latest_falls_back_to_the_newest_step_that_loads_naming_what_it_rejected) {
  TempDir dir;
  auto sets = [&](const std::string& root, int total, bool resume) {
    std::vector<std::string> out{"trainer.ckpt_path=" + root, "trainer.total_steps=" + std::to_string(total),
                                 "trainer.ckpt_interval=10", "trainer.max_ckpts_to_keep=0"};
    if (resume) out.push_back("trainer.resume_mode=latest");
    return out;
  };
  Run straight = train("sync_rl.yaml", sets(dir / "straight", 40, false));
  BOOST_REQUIRE_MESSAGE(straight.code == 0, straight.output);
  Run base = train("sync_rl.yaml", sets(dir / "base", 30, false));
  BOOST_REQUIRE_MESSAGE(base.code == 0, base.output);
  const std::string root = dir / "run";
  auto data_file = [&](int step, const std::string& name) {
    return root + "/global_step_" + std::to_string(step) + "/policy/" + name;
  };
  auto flip = [&](int step) {
    const std::string path = data_file(step, "__0_0.safetensors");
    std::string bytes = test::read_file(path);
    BOOST_REQUIRE(bytes.size() > 200);
    bytes[bytes.size() - 100] = static_cast<char>(bytes[bytes.size() - 100] ^ 0x5a);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  };
  struct Case {
    std::string what;
    std::function<void()> spoil;
    std::int64_t resumed;
    std::vector<std::string> said;
  };
  const std::vector<Case> cases{
      {"a flipped byte in step 30", [&] { flip(30); }, 20, {"step 30 rejected: ", "checksum mismatch"}},
      {"a missing file in step 30, a flipped byte in step 20",
       [&] {
         fs::remove(data_file(30, "__1_0.safetensors"));
         flip(20);
       },
       10,
       {"step 30 rejected: ", "__1_0.safetensors", "step 20 rejected: ", "checksum mismatch"}},
      // Issue 59: a file the checkpoint names that is a folder is damage like any other.
      {"a data file replaced by a folder in step 30",
       [&] {
         fs::remove(data_file(30, "__1_0.safetensors"));
         fs::create_directory(data_file(30, "__1_0.safetensors"));
       },
       20,
       {"step 30 rejected: ", "__1_0.safetensors", "not a regular file"}},
      {"metadata.json replaced by a folder in step 30, trainer_state.json in step 20",
       [&] {
         fs::remove(data_file(30, "metadata.json"));
         fs::create_directory(data_file(30, "metadata.json"));
         const std::string state = root + "/global_step_20/trainer_state.json";
         fs::remove(state);
         fs::create_directory(state);
       },
       10,
       {"step 30 rejected: ", "metadata.json", "step 20 rejected: ", "trainer_state.json"}},
      {"a stale tracker", [&] { std::ofstream(root + "/latest_ckpt_global_step.txt") << "50\n"; }, 30,
       {"names step 50, but '" + root + "/global_step_50' is not a committed checkpoint"}},
  };
  for (const auto& c : cases) {
    BOOST_TEST_CONTEXT(c.what) {
      fs::remove_all(root);
      fs::copy(dir / "base", root, fs::copy_options::recursive);
      c.spoil();
      Run r = train_verbose("sync_rl.yaml", sets(root, 40, true));
      BOOST_REQUIRE_MESSAGE(r.code == 0, r.output);
      const std::string resumed = "resumed from " + root + "/global_step_" + std::to_string(c.resumed) + " at step " +
                                  std::to_string(c.resumed);
      BOOST_TEST(r.output.find(resumed) != std::string::npos, r.output);
      BOOST_TEST(r.output.find("resume_mode latest: resumed step " + std::to_string(c.resumed) +
                               " after rejecting") != std::string::npos,
                 r.output);
      for (const auto& said : c.said) BOOST_TEST(r.output.find(said) != std::string::npos, said << " in: " << r.output);
      BOOST_TEST((test::committed_steps(root) == std::vector<std::int64_t>{10, 20, 30, 40}));
      auto a = test::files_of(dir / "straight/global_step_40");
      auto b = test::files_of(root + "/global_step_40");
      BOOST_TEST(a.size() == b.size());
      for (const auto& [name, bytes] : a) BOOST_TEST((b[name] == bytes), name << " differs after the fallback");
      // The steps saved again replaced the corrupt ones.
      for (int step : {20, 30}) {
        Run verify = test::run_command(kBin + "/stagehand-ckpt verify " + root + "/global_step_" + std::to_string(step));
        BOOST_TEST(verify.code == 0, verify.output);
      }
    }
  }
  // Nothing loads: the run fails naming every step it rejected, and changes nothing.
  fs::remove_all(root);
  fs::copy(dir / "base", root, fs::copy_options::recursive);
  for (int step : {10, 20, 30}) flip(step);
  Run none = train_verbose("sync_rl.yaml", sets(root, 40, true));
  BOOST_TEST(none.code == 1, none.output);
  for (const std::string& said : std::vector<std::string>{"no committed checkpoint in '" + root + "' could be resumed", "step 30 rejected",
                                 "step 20 rejected", "step 10 rejected", "nothing was changed"}) {
    BOOST_TEST(none.output.find(said) != std::string::npos, said << " in: " << none.output);
  }
  BOOST_TEST(none.output.find("resumed from") == std::string::npos, none.output);
  BOOST_TEST(test::read_file(root + "/latest_ckpt_global_step.txt") == "30\n");
  BOOST_TEST((test::committed_steps(root) == std::vector<std::int64_t>{10, 20, 30}));
}

BOOST_AUTO_TEST_CASE(edited_steps_and_states_are_refused_not_resumed) {
  TempDir dir;
  Run base = train("sync_rl.yaml", {"trainer.ckpt_path=" + dir / "base", "trainer.total_steps=3"});
  BOOST_REQUIRE_MESSAGE(base.code == 0, base.output);
  const std::string root = dir / "spoiled";
  const std::string ckpt = root + "/global_step_3";
  const std::string state_file = ckpt + "/trainer_state.json";
  auto set_state_step = [&](nlohmann::json step) {
    nlohmann::json state = read_json(state_file);
    state["step"] = std::move(step);
    write_json(state_file, state);
  };
  struct Case {
    std::string what;
    std::function<void()> spoil;
    std::vector<std::string> said;
    std::int64_t total_steps = 6;
  };
  const std::vector<Case> cases{
      {"trainer_state step 10", [&] { set_state_step(10); }, {state_file, "changed after it was saved"}},
      {"trainer_state step -3", [&] { set_state_step(-3); }, {state_file, "changed after it was saved"}},
      {"trainer_state step INT64_MAX", [&] { set_state_step(INT64_MAX); }, {state_file, "changed after it was saved"}},
      {"trainer_state step 10, recorded in the metadata",
       [&] {
         set_state_step(10);
         test::edit_metadata(ckpt, [&](CheckpointMetadata& m) {
           auto recorded = test::trainer_state_meta(ckpt);
           BOOST_REQUIRE(recorded.is_ok());
           m.trainer_state = *recorded;
         });
       },
       {state_file, "field 'step' is 10, not the checkpoint's step 3"}},
      {"trainer_state removed", [&] { fs::remove(state_file); }, {state_file, "does not exist"}},
      {"metadata step 10", [&] { test::edit_metadata(ckpt, [](CheckpointMetadata& m) { m.step = 10; }); },
       {"metadata.json' holds step 10, but its folder is named for step 3"}},
      {"folder and tracker renamed to step 5",
       [&] {
         fs::rename(ckpt, root + "/global_step_5");
         std::ofstream(root + "/latest_ckpt_global_step.txt") << "5\n";
       },
       {"holds step 3, but its folder is named for step 5"}},
      {"scheduler object edited by hand",
       [&] {
         std::string meta = ckpt + "/policy/metadata.json";
         std::string text = test::read_file(meta);
         const std::string saved = R"({\"step\":3})";
         auto at = text.find(saved);
         BOOST_REQUIRE(at != std::string::npos);
         text.replace(at, saved.size(), R"({\"step\":9})");
         std::ofstream(meta) << text;
       },
       {"metadata.json", "was changed after it was written"}},
      {"resume beyond total_steps", [] {}, {"is at step 3, beyond trainer.total_steps 2"}, 2},
  };
  for (const auto& c : cases) {
    BOOST_TEST_CONTEXT(c.what) {
      fs::remove_all(root);
      fs::copy(dir / "base", root, fs::copy_options::recursive);
      c.spoil();
      const std::string tracked = test::read_file(root + "/latest_ckpt_global_step.txt");
      Run r = train_verbose("sync_rl.yaml", {"trainer.ckpt_path=" + root, "trainer.resume_mode=latest",
                                             "trainer.total_steps=" + std::to_string(c.total_steps)});
      BOOST_TEST(r.code == 1, r.output);
      for (const auto& s : c.said) BOOST_TEST(r.output.find(s) != std::string::npos, s << " in: " << r.output);
      BOOST_TEST(r.output.find("resumed from") == std::string::npos, r.output);
      BOOST_TEST(test::read_file(root + "/latest_ckpt_global_step.txt") == tracked);
      if (c.total_steps != 2) {
        // verify says the same as the resume: a checkpoint that verifies resumes.
        Run verify = test::run_command(kBin + "/stagehand-ckpt verify " + root);
        BOOST_TEST(verify.code != 0, verify.output);
      }
    }
  }
  Run verify = test::run_command(kBin + "/stagehand-ckpt verify " + dir / "base");
  BOOST_TEST(verify.code == 0, verify.output);
}

BOOST_AUTO_TEST_CASE(sigterm_with_a_failing_final_save_says_it_is_not_committed) {
  TempDir dir;
  std::string root = dir / "ckpt";
  std::vector<std::string> common{"trainer.ckpt_path=" + root, "trainer.ckpt_interval=0", "model.hidden=2048",
                                  "megatron_config.async_dist_ckpt_save=true"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), common.begin(), common.end());
    return extra;
  };
  Run first = train("sync_rl.yaml", with({"trainer.total_steps=5"}));
  BOOST_REQUIRE_MESSAGE(first.code == 0, first.output);
  BackgroundRun run("sync_rl.yaml", with({"trainer.total_steps=100000000", "trainer.resume_mode=latest"}),
                    dir / "out.txt");
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  // The final save cannot create its folder: a file stands where the checkpoint folder was.
  fs::rename(root, dir / "moved");
  std::ofstream(root) << "not a folder\n";
  run.signal(SIGTERM);
  int code = run.wait(std::chrono::seconds(120));
  std::string text = run.output();
  BOOST_TEST(code == 1, text);
  BOOST_TEST(text.find("is committed") == std::string::npos, text);
  auto pos = text.find("stopped by signal: the checkpoint of step ");
  BOOST_REQUIRE_MESSAGE(pos != std::string::npos, text);
  BOOST_TEST(text.find("is not committed", pos) != std::string::npos, text);
  BOOST_TEST(**test::read_tracker(dir / "moved") == 5);
}

BOOST_AUTO_TEST_CASE(committed_checkpoints_are_not_replaced_without_asking) {
  TempDir dir;
  std::string root = dir / "ckpt";
  Run first = train("sync_rl.yaml", {"trainer.ckpt_path=" + root, "trainer.total_steps=5"});
  BOOST_REQUIRE_MESSAGE(first.code == 0, first.output);
  auto before = test::files_of(root + "/global_step_5");

  // resume_mode none over a committed step.
  Run none = train("sync_rl.yaml", {"trainer.ckpt_path=" + root, "trainer.total_steps=5"});
  BOOST_TEST(none.code == 1, none.output);
  BOOST_TEST(none.output.find("global_step_5") != std::string::npos, none.output);
  BOOST_TEST(none.output.find("trainer.overwrite_checkpoints") != std::string::npos, none.output);
  BOOST_TEST(none.output.find("trainer.resume_mode") != std::string::npos, none.output);
  BOOST_TEST((test::files_of(root + "/global_step_5") == before));

  // resume_mode latest with the tracker gone: retention would remove step 5 after a fresh start.
  fs::remove(root + "/latest_ckpt_global_step.txt");
  Run latest = train("sync_rl.yaml", {"trainer.ckpt_path=" + root, "trainer.total_steps=10",
                                      "trainer.resume_mode=latest", "trainer.max_ckpts_to_keep=1"});
  BOOST_TEST(latest.code == 1, latest.output);
  BOOST_TEST(latest.output.find("latest_ckpt_global_step.txt") != std::string::npos, latest.output);
  BOOST_TEST(latest.output.find("global_step_5") != std::string::npos, latest.output);
  BOOST_TEST(latest.output.find("trainer.overwrite_checkpoints") != std::string::npos, latest.output);
  BOOST_TEST((test::committed_steps(root) == std::vector<std::int64_t>{5}));
  BOOST_TEST((test::files_of(root + "/global_step_5") == before));

  // Asked for: both start over.
  for (std::string mode : {"none", "latest"}) {
    BOOST_TEST_CONTEXT(mode) {
      Run over = train("sync_rl.yaml", {"trainer.ckpt_path=" + root, "trainer.total_steps=10",
                                        "trainer.resume_mode=" + mode, "trainer.max_ckpts_to_keep=1",
                                        "trainer.overwrite_checkpoints=true"});
      BOOST_TEST(over.code == 0, over.output);
      BOOST_TEST((test::committed_steps(root) == std::vector<std::int64_t>{10}));
      fs::remove(root + "/latest_ckpt_global_step.txt");
    }
  }
}

BOOST_AUTO_TEST_CASE(a_from_path_resume_into_a_ckpt_path_with_newer_steps_is_refused_unless_asked) {
  TempDir dir;
  Run older = train("sync_rl.yaml", {"trainer.ckpt_path=" + dir / "older", "trainer.total_steps=5"});
  BOOST_REQUIRE_MESSAGE(older.code == 0, older.output);
  const std::string root = dir / "ckpt";
  Run newer = train("sync_rl.yaml", {"trainer.ckpt_path=" + root, "trainer.total_steps=30",
                                     "trainer.ckpt_interval=10", "trainer.max_ckpts_to_keep=0"});
  BOOST_REQUIRE_MESSAGE(newer.code == 0, newer.output);
  // Every file but the lock, which each run that takes it rewrites (its holder).
  auto checkpoints = [&] {
    auto files = test::files_of(root);
    files.erase(kRootLockFile);
    return files;
  };
  const auto before = checkpoints();
  const std::vector<std::string> from_older{"trainer.ckpt_path=" + root, "trainer.total_steps=30",
                                            "trainer.ckpt_interval=10", "trainer.max_ckpts_to_keep=1",
                                            "trainer.resume_mode=from_path",
                                            "trainer.resume_path=" + dir / "older/global_step_5"};
  Run refused = train("sync_rl.yaml", from_older, dir / "refused.jsonl");
  BOOST_TEST(refused.code == 1, refused.output);
  BOOST_TEST(refused.output.find("holds committed checkpoints of steps after 5") != std::string::npos, refused.output);
  BOOST_TEST(refused.output.find("global_step_10 ... global_step_30, 3 in all") != std::string::npos, refused.output);
  BOOST_TEST(refused.output.find("trainer.overwrite_checkpoints") != std::string::npos, refused.output);
  BOOST_TEST(lines_of(dir / "refused.jsonl", "step").empty());  // refused before training
  // Nothing was deleted or replaced, the tracker included.
  BOOST_TEST((checkpoints() == before));
  // Asked for: the run trains on from step 6, replacing them (retention keeps the newest).
  auto asked = from_older;
  asked.push_back("trainer.overwrite_checkpoints=true");
  Run replaced = train("sync_rl.yaml", asked);
  BOOST_TEST(replaced.code == 0, replaced.output);
  BOOST_TEST((test::committed_steps(root) == std::vector<std::int64_t>{30}));
}

namespace {

/// `ulimit -v` leaves AddressSanitizer no room for its shadow memory (it reserves terabytes of
/// address space): the case is reported as skipped in the sanitizer suite; the Release suite
/// (scripts/test.sh) runs it.
boost::test_tools::assertion_result not_under_address_sanitizer(boost::unit_test::test_unit_id) {
#if defined(__SANITIZE_ADDRESS__)
  boost::test_tools::assertion_result skip(false);
  skip.message() << "skipped under AddressSanitizer: ulimit -v leaves no room for its shadow memory";
  return skip;
#else
  return true;
#endif
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_model_that_does_not_fit_in_memory_fails_cleanly_naming_its_sizes,
                     *boost::unit_test::precondition(not_under_address_sanitizer)) {
  TempDir dir;
  // 2 GB of address space: each rank's share of a 2048 x 16384 model is about 330 MB.
  Run r = test::run_command("ulimit -v 2000000; exec " +
                            train_command("sync_rl.yaml", {"trainer.ckpt_path=" + dir / "ckpt", "model.context_dim=16384",
                                                           "model.hidden=2048"}));
  BOOST_TEST(r.code == 2, r.output);
  BOOST_TEST(r.output.find("terminate called") == std::string::npos, r.output);
  BOOST_TEST(r.output.find("does not fit in host memory") != std::string::npos, r.output);
  BOOST_TEST(r.output.find("model.hidden x model.context_dim = 2048 x 16384") != std::string::npos, r.output);
  BOOST_TEST(test::committed_steps(dir / "ckpt").empty());
}

BOOST_AUTO_TEST_CASE(a_failed_tracker_update_says_what_state_the_checkpoint_is_in) {
  TempDir dir;
  std::string root = dir / "ckpt";
  // A folder where the tracker must go: the step's folder is renamed into place, the tracker fails.
  fs::create_directories(root + "/latest_ckpt_global_step.txt");
  Run r = train("sync_rl.yaml", {"trainer.ckpt_path=" + root, "trainer.total_steps=3"});
  BOOST_TEST(r.code == 1, r.output);
  BOOST_TEST(r.output.find("'" + root + "/global_step_3' is complete") != std::string::npos, r.output);
  BOOST_TEST(r.output.find("was not updated") != std::string::npos, r.output);
  BOOST_TEST(!fs::exists(root + "/latest_ckpt_global_step.txt.tmp"));
  BOOST_TEST(verify_checkpoint(root + "/global_step_3")->ok());
}

BOOST_AUTO_TEST_CASE(a_new_ckpt_path_with_a_trailing_slash_is_accepted) {
  TempDir dir;
  Run r = train("sync_rl.yaml", {"trainer.ckpt_path=" + dir / "new/", "trainer.total_steps=3"});
  BOOST_TEST(r.code == 0, r.output);
  BOOST_TEST(**test::read_tracker(dir / "new") == 3);
  Run resumed = train("sync_rl.yaml", {"trainer.ckpt_path=" + dir / "new/", "trainer.total_steps=4",
                                       "trainer.resume_mode=latest"});
  BOOST_TEST(resumed.code == 0, resumed.output);
  BOOST_TEST(**test::read_tracker(dir / "new") == 4);
}

BOOST_AUTO_TEST_CASE(resume_latest_with_nothing_to_resume_says_so) {
  TempDir dir;
  Run r = train_verbose("sync_rl.yaml", {"trainer.ckpt_path=" + dir / "ckpt", "trainer.total_steps=3",
                                         "trainer.resume_mode=latest"});
  BOOST_TEST(r.code == 0, r.output);
  BOOST_TEST(r.output.find("nothing to resume in '" + dir / "ckpt" + "'") != std::string::npos, r.output);
  BOOST_TEST(r.output.find("starting from step 1") != std::string::npos, r.output);
}

BOOST_AUTO_TEST_CASE(a_second_run_on_the_same_ckpt_path_is_refused) {
  TempDir dir;
  std::string root = dir / "ckpt";
  BackgroundRun first("sync_rl.yaml",
                      {"trainer.ckpt_path=" + root, "trainer.total_steps=100000000", "trainer.ckpt_interval=1",
                       "trainer.max_ckpts_to_keep=2", "megatron_config.async_dist_ckpt_save=true"},
                      dir / "first.txt");
  BOOST_REQUIRE_MESSAGE(wait_for_file(root + "/latest_ckpt_global_step.txt", std::chrono::seconds(60)), first.output());
  Run second = train("sync_rl.yaml", {"trainer.ckpt_path=" + root, "trainer.total_steps=3",
                                      "trainer.resume_mode=latest", "trainer.max_ckpts_to_keep=1"});
  BOOST_TEST(second.code == 1, second.output);
  BOOST_TEST(second.output.find("pid " + std::to_string(first.pid())) != std::string::npos, second.output);
  BOOST_TEST(second.output.find("host " + hostname()) != std::string::npos, second.output);
  first.signal(SIGTERM);
  std::string text;
  int code = first.wait(std::chrono::seconds(120));
  text = first.output();
  BOOST_TEST(code == 0, text);
  auto pos = text.find("stopped by signal: checkpoint of step ");
  BOOST_REQUIRE_MESSAGE(pos != std::string::npos, text);
  std::int64_t step = std::stoll(text.substr(pos + 38));
  // The lock file in the root is invisible to what lists or verifies checkpoints.
  auto latest = resolve_checkpoint(root);
  BOOST_REQUIRE_MESSAGE(latest.is_ok(), latest.status().message());
  BOOST_TEST(verify_checkpoint(*latest)->ok());
  BOOST_TEST(test::committed_steps(root).size() == 2u);
  BOOST_TEST(*test::clean_stale_tmp_dirs(root) == 0);
  // Once the first run is gone, the lock is free again.
  Run third = train("sync_rl.yaml", {"trainer.ckpt_path=" + root, "trainer.total_steps=" + std::to_string(step + 2),
                                     "trainer.resume_mode=latest", "trainer.max_ckpts_to_keep=2"});
  BOOST_TEST(third.code == 0, third.output);
}

namespace {

/// A verbose run (its progress lines say what was loaded) with metrics.
Run train_with_progress(const std::string& config, const std::vector<std::string>& sets, const std::string& metrics) {
  return test::run_command(train_command(config, sets, false) + " --metrics-out " + metrics);
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_2x2_checkpoint_resumes_under_every_layout_that_divides_the_model) {
  for (const std::string async : {"false", "true"}) {
    BOOST_TEST_CONTEXT("async_dist_ckpt_save " << async) {
      TempDir dir;
      Run base = train("sync_rl.yaml",
                       {"trainer.ckpt_path=" + dir / "base", "trainer.total_steps=20", "trainer.ckpt_interval=20",
                        "megatron_config.async_dist_ckpt_save=" + async},
                       dir / "base.jsonl");
      BOOST_REQUIRE_MESSAGE(base.code == 0, base.output);
      const double saved_accuracy = lines_of(dir / "base.jsonl", "step").back()["accuracy"].get<double>();
      BOOST_TEST(saved_accuracy > 0.4);  // chance is 1/8: the weights are worth resuming
      const std::string ckpt = dir / "base/global_step_20";
      std::optional<double> reference;  // the 2 x 2 resume's final accuracy
      for (auto [tp, dp] : {std::pair{2, 2}, {1, 1}, {1, 2}, {2, 1}, {4, 1}, {2, 4}}) {
        BOOST_TEST_CONTEXT("tensor " << tp << " x data " << dp) {
          const std::string name = std::to_string(tp) + "x" + std::to_string(dp);
          Run r = train_with_progress(
              "sync_rl.yaml",
              {"trainer.ckpt_path=" + dir / name, "trainer.total_steps=30", "trainer.ckpt_interval=10",
               "trainer.resume_mode=from_path", "trainer.resume_path=" + ckpt, "megatron_config.async_dist_ckpt_save=" + async,
               "parallel.tensor_parallel=" + std::to_string(tp), "parallel.data_parallel=" + std::to_string(dp)},
              dir / (name + ".jsonl"));
          BOOST_REQUIRE_MESSAGE(r.code == 0, r.output);
          BOOST_TEST(r.output.find("resumed from " + ckpt + " at step 20, saved with tensor_parallel 2 x data_parallel 2") !=
                         std::string::npos,
                     r.output);
          // Only the ranks a 4-rank save had no RNG for re-derive theirs, said in one line.
          const bool more_ranks = tp * dp > 4;
          BOOST_TEST((r.output.find("has no RNG state for rng.rank4, rng.rank5, rng.rank6, rng.rank7 (saved by fewer ranks)") !=
                      std::string::npos) == more_ranks,
                     r.output);
          auto steps = lines_of(dir / (name + ".jsonl"), "step");
          BOOST_REQUIRE(steps.size() == 10u);
          BOOST_TEST(steps.front()["step"].get<int>() == 21);
          // The first step trains from the saved weights and optimizer, not from scratch, and
          // training goes on learning as it does in the saved layout.
          BOOST_TEST(steps.front()["accuracy"].get<double>() > saved_accuracy - 0.05);
          const double final_accuracy = steps.back()["accuracy"].get<double>();
          if (!reference) reference = final_accuracy;
          BOOST_TEST(final_accuracy > saved_accuracy);
          BOOST_TEST(final_accuracy == *reference, boost::test_tools::tolerance(0.05));
          BOOST_TEST(lines_of(dir / (name + ".jsonl"), "save").size() == 1u);
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(sync_rl_starts_from_an_sft_run_s_weights_with_init_from) {
  TempDir dir;
  Run sft = train("sft.yaml",
                  {"trainer.ckpt_path=" + dir / "sft", "trainer.total_steps=60", "trainer.ckpt_interval=60",
                   "parallel.tensor_parallel=1", "parallel.data_parallel=2"},
                  dir / "sft.jsonl");
  BOOST_REQUIRE_MESSAGE(sft.code == 0, sft.output);
  const double sft_accuracy = lines_of(dir / "sft.jsonl", "step").back()["accuracy"].get<double>();
  BOOST_TEST(sft_accuracy > 0.6);

  // From scratch, RL starts near chance; from the SFT run's weights (a 1 x 2 layout, another
  // trainer kind) it starts where SFT ended.
  Run scratch = train("sync_rl.yaml", {"trainer.ckpt_path=" + dir / "scratch", "trainer.total_steps=1"},
                      dir / "scratch.jsonl");
  BOOST_REQUIRE_MESSAGE(scratch.code == 0, scratch.output);
  BOOST_TEST(lines_of(dir / "scratch.jsonl", "step").front()["accuracy"].get<double>() < 0.35);
  Run rl = train_with_progress("sync_rl.yaml",
                               {"trainer.ckpt_path=" + dir / "rl", "trainer.total_steps=5", "trainer.ckpt_interval=5",
                                "trainer.init_from=" + dir / "sft"},
                               dir / "rl.jsonl");
  BOOST_REQUIRE_MESSAGE(rl.code == 0, rl.output);
  BOOST_TEST(rl.output.find("initialized from " + dir / "sft/global_step_60" +
                            " (the sft trainer's step 60, saved with tensor_parallel 1 x data_parallel 2): weights, a "
                            "fresh optimizer") != std::string::npos,
             rl.output);
  auto steps = lines_of(dir / "rl.jsonl", "step");
  BOOST_REQUIRE(!steps.empty());
  BOOST_TEST(steps.front()["step"].get<int>() == 1);
  BOOST_TEST(steps.front()["accuracy"].get<double>() > sft_accuracy - 0.05);
  auto state = read_trainer_state(*local_file_system(), dir / "rl/global_step_5");
  BOOST_REQUIRE(state.is_ok());
  BOOST_TEST(state->kind == "sync");

  // A later start of the same run resumes its own checkpoint: init_from only starts fresh runs.
  Run again = train_with_progress("sync_rl.yaml",
                                  {"trainer.ckpt_path=" + dir / "rl", "trainer.total_steps=8", "trainer.resume_mode=latest",
                                   "trainer.init_from=" + dir / "sft"},
                                  dir / "again.jsonl");
  BOOST_REQUIRE_MESSAGE(again.code == 0, again.output);
  BOOST_TEST(again.output.find("resumed from " + dir / "rl/global_step_5") != std::string::npos, again.output);
  BOOST_TEST(again.output.find("initialized from") == std::string::npos, again.output);

  // Asked for, the optimizer state comes along; a path that holds nothing is named.
  Run with_optimizer = train_with_progress("sync_rl.yaml",
                                           {"trainer.ckpt_path=" + dir / "rl2", "trainer.total_steps=1",
                                            "trainer.init_from=" + dir / "sft", "trainer.load_optimizer=true"},
                                           dir / "rl2.jsonl");
  BOOST_REQUIRE_MESSAGE(with_optimizer.code == 0, with_optimizer.output);
  BOOST_TEST(with_optimizer.output.find("weights, optimizer state") != std::string::npos, with_optimizer.output);
  Run nothing = train("sync_rl.yaml", {"trainer.ckpt_path=" + dir / "rl3", "trainer.init_from=" + dir / "nothing"});
  BOOST_TEST(nothing.code != 0);
  BOOST_TEST(nothing.output.find("trainer.init_from") != std::string::npos, nothing.output);
}

BOOST_AUTO_TEST_CASE(periodic_exports_run_in_the_background_and_a_failed_one_is_reported) {
  TempDir dir;
  // The export of step 10 cannot be written (its folder is taken); step 20's is.
  fs::create_directories(dir / "hf/global_step_10");
  std::ofstream(dir / "hf/global_step_10/taken") << "x";
  Run r = train_with_progress("sync_rl.yaml",
                              {"trainer.ckpt_path=" + dir / "ckpt", "trainer.total_steps=20", "trainer.ckpt_interval=10",
                               "trainer.max_ckpts_to_keep=1", "trainer.export_interval=10",
                               "trainer.export_path=" + dir / "hf"},
                              dir / "m.jsonl");
  BOOST_REQUIRE_MESSAGE(r.code == 0, r.output);
  BOOST_TEST(r.output.find("the export of step 10 to " + dir / "hf/global_step_10" +
                           " failed (the checkpoint is untouched)") != std::string::npos,
             r.output);
  BOOST_TEST(r.output.find("exported step 20 to " + dir / "hf/global_step_20") != std::string::npos, r.output);
  BOOST_TEST(r.output.find("exports: 1 written to " + dir / "hf" + ", 1 failed") != std::string::npos, r.output);
  auto exports = lines_of(dir / "m.jsonl", "export");
  BOOST_REQUIRE(exports.size() == 2u);
  BOOST_TEST(!exports[0]["ok"].get<bool>());
  BOOST_TEST(exports[0]["error"].get<std::string>().find("is not an empty folder") != std::string::npos,
             exports[0].dump());
  BOOST_TEST(exports[1]["ok"].get<bool>());
  BOOST_TEST(fs::exists(dir / "hf/global_step_20/model.safetensors"));
  BOOST_TEST(test::read_file(dir / "hf/global_step_10/taken") == "x");
  // The failed export left the checkpoints as retention wants them, and the export is the
  // checkpoint's model weights: starting from it gives the run's accuracy.
  BOOST_TEST(test::committed_steps(dir / "ckpt") == std::vector<std::int64_t>{20});
  const double accuracy = lines_of(dir / "m.jsonl", "step").back()["accuracy"].get<double>();
  Run from_export = train("sync_rl.yaml",
                          {"trainer.ckpt_path=" + dir / "again", "trainer.total_steps=1",
                           "trainer.init_from=" + dir / "hf/global_step_20"},
                          dir / "again.jsonl");
  BOOST_REQUIRE_MESSAGE(from_export.code == 0, from_export.output);
  BOOST_TEST(lines_of(dir / "again.jsonl", "step").front()["accuracy"].get<double>() > accuracy - 0.05);
}

// A run that dies between a commit and that checkpoint's export (SIGKILL) owes the export. Here
// the first run's exports fail without leaving anything at their folders (trainer.export_path is
// a file), as a killed run's never start: retention keeps those checkpoints, the run that resumes
// exports them first, and once they are exported retention removes them.
BOOST_AUTO_TEST_CASE(owed_exports_are_kept_by_retention_and_done_by_the_run_that_resumes) {
  TempDir dir;
  const std::string root = dir / "ckpt";
  const std::string hf = dir / "hf";
  std::ofstream(hf) << "not a folder";
  const std::vector<std::string> common{"trainer.ckpt_path=" + root, "trainer.ckpt_interval=10",
                                        "trainer.max_ckpts_to_keep=1", "trainer.export_interval=10",
                                        "trainer.export_path=" + hf};
  auto with = [&](std::vector<std::string> sets) {
    sets.insert(sets.end(), common.begin(), common.end());
    return sets;
  };
  Run first = train_with_progress("sync_rl.yaml", with({"trainer.total_steps=20"}), dir / "first.jsonl");
  BOOST_REQUIRE_MESSAGE(first.code == 0, first.output);
  BOOST_TEST(first.output.find("exports: 0 written to " + hf + ", 2 failed") != std::string::npos, first.output);
  BOOST_TEST((test::committed_steps(root) == std::vector<std::int64_t>{10, 20}));

  fs::remove(hf);
  Run resumed = train_with_progress("sync_rl.yaml", with({"trainer.total_steps=30", "trainer.resume_mode=latest"}),
                                    dir / "second.jsonl");
  BOOST_REQUIRE_MESSAGE(resumed.code == 0, resumed.output);
  for (int step : {10, 20}) {
    BOOST_TEST(resumed.output.find("exporting step " + std::to_string(step) +
                                   ", committed but not exported yet") != std::string::npos,
               resumed.output);
  }
  for (int step : {10, 20, 30}) {
    BOOST_TEST(fs::exists(hf + "/global_step_" + std::to_string(step) + "/model.safetensors"), step);
  }
  BOOST_TEST(resumed.output.find("exports: 3 written to " + hf + ", 0 failed") != std::string::npos, resumed.output);
  BOOST_TEST(lines_of(dir / "second.jsonl", "export").size() == 3u);
  // Nothing is owed any more: retention keeps the newest only.
  BOOST_TEST((test::committed_steps(root) == std::vector<std::int64_t>{30}));
}

// SIGTERM while exports run: the export running then stops at its next batch of tensors (here,
// with a small model, it has mostly ended already) and the queued ones are dropped; the summary
// counts the exports on disk, the others are left owed (their checkpoints kept), and the run
// that resumes does them.
BOOST_AUTO_TEST_CASE(after_sigterm_the_summary_counts_the_exports_that_exist_and_a_resume_does_the_rest) {
  TempDir dir;
  const std::string root = dir / "ckpt";
  const std::string hf = dir / "hf";
  const std::vector<std::string> common{"trainer.ckpt_path=" + root, "trainer.ckpt_interval=1",
                                        "trainer.max_ckpts_to_keep=2", "trainer.export_interval=1",
                                        "trainer.export_path=" + hf};
  auto with = [&](std::vector<std::string> sets) {
    sets.insert(sets.end(), common.begin(), common.end());
    return sets;
  };
  auto exports_on_disk = [&] {
    std::int64_t n = 0;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(hf, ec)) n += parse_step_dir_name(e.path().filename().string(), false) ? 1 : 0;
    return n;
  };
  BackgroundRun run("sync_rl.yaml", with({"trainer.total_steps=100000000"}), dir / "out.txt", /*quiet=*/false);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (exports_on_disk() < 5 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  run.signal(SIGTERM);
  BOOST_REQUIRE_MESSAGE(run.wait(std::chrono::seconds(120)) == 0, run.output());
  const std::string text = run.output();
  const auto pos = text.find("exports: ");
  BOOST_REQUIRE_MESSAGE(pos != std::string::npos, text);
  BOOST_TEST(std::stoll(text.substr(pos + 9)) == exports_on_disk(), text);
  const auto stopped = text.find("stopped by signal: checkpoint of step ");
  BOOST_REQUIRE_MESSAGE(stopped != std::string::npos, text);
  const std::int64_t step = std::stoll(text.substr(stopped + 38));

  Run resumed = train("sync_rl.yaml", with({"trainer.total_steps=" + std::to_string(step + 1), "trainer.resume_mode=latest"}));
  BOOST_REQUIRE_MESSAGE(resumed.code == 0, resumed.output);
  BOOST_TEST(exports_on_disk() == step + 1);
  for (std::int64_t s = 1; s <= step + 1; ++s) {
    BOOST_TEST(fs::exists(hf + "/global_step_" + std::to_string(s) + "/model.safetensors"), s);
  }
  BOOST_TEST((test::committed_steps(root) == std::vector<std::int64_t>{step, step + 1}));
}

BOOST_AUTO_TEST_CASE(load_strict_refuses_missing_and_extra_tensors_unless_told_to_warn) {
  TempDir dir;
  Run base = train("sync_rl.yaml", {"trainer.ckpt_path=" + dir / "ckpt", "trainer.total_steps=5"});
  BOOST_REQUIRE_MESSAGE(base.code == 0, base.output);
  Run exported = test::run_command(kBin + "/stagehand-ckpt export " + dir / "ckpt" + " " + dir / "hf");
  BOOST_REQUIRE_MESSAGE(exported.code == 0, exported.output);
  // A tensor the model does not have, in a second file of the folder.
  Tensor extra = *Tensor::empty(DType::f32, Shape{2}, Device::host());
  std::fill_n(extra.host_data<float>(), 2, 1.0f);
  std::string bytes = make_safetensors_header({{"lm_head.weight", DType::f32, Shape{2}, 0, 8}});
  bytes.append(static_cast<const char*>(extra.data()), 8);
  std::ofstream(dir / "hf/extra.safetensors", std::ios::binary) << bytes;
  auto index = nlohmann::json::object();
  auto header = parse_safetensors_header(dir / "hf/model.safetensors");
  BOOST_REQUIRE(header.is_ok());
  for (const auto& e : header->entries) index["weight_map"][e.key] = "model.safetensors";
  index["weight_map"]["lm_head.weight"] = "extra.safetensors";
  std::ofstream(dir / "hf/model.safetensors.index.json") << index.dump();

  const std::vector<std::string> from = {"trainer.total_steps=1", "trainer.init_from=" + dir / "hf"};
  auto with = [&](std::vector<std::string> sets, const std::string& root) {
    sets.insert(sets.end(), from.begin(), from.end());
    sets.push_back("trainer.ckpt_path=" + dir / root);
    return train("sync_rl.yaml", sets);
  };
  Run strict = with({}, "a");
  BOOST_TEST(strict.code != 0);
  BOOST_TEST(strict.output.find("trainer.init_from: '" + dir / "hf" + "' holds 1 tensor(s) the model does not have: "
                               "lm_head.weight (trainer.load_strict: false loads without them)") != std::string::npos,
             strict.output);
  BOOST_TEST(strict.output.find("trainer.init_from") != std::string::npos, strict.output);
  Run lenient = with({"trainer.load_strict=false"}, "b");
  BOOST_TEST(lenient.code == 0, lenient.output);
  BOOST_TEST(lenient.output.find("warning: trainer.init_from: 1 tensor(s) of '" + dir / "hf" +
                                 "' that the model does not have were ignored (trainer.load_strict: false): "
                                 "lm_head.weight") != std::string::npos,
             lenient.output);
  // The export holds no optimizer state: asking for it names what is missing.
  Run optimizer = with({"trainer.load_optimizer=true", "trainer.load_strict=false"}, "c");
  BOOST_TEST(optimizer.code == 0, optimizer.output);
  BOOST_TEST(optimizer.output.find("not in '" + dir / "hf" + "', left as initialized (trainer.load_strict: false): "
                                   "optimizer.exp_avg.model.fc1.bias") != std::string::npos,
             optimizer.output);
  BOOST_TEST(optimizer.output.find("1 object(s) not in '" + dir / "hf" + "', left as initialized "
                                   "(trainer.load_strict: false): scheduler") != std::string::npos,
             optimizer.output);
  Run optimizer_strict = with({"trainer.load_optimizer=true"}, "d");
  BOOST_TEST(optimizer_strict.code != 0);
  BOOST_TEST(optimizer_strict.output.find("not in the checkpoint") != std::string::npos, optimizer_strict.output);
}
