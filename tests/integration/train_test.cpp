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
#include <nlohmann/json.hpp>
#include <thread>

#include "stagehand/checkpoint/commit.hpp"
#include "stagehand/checkpoint/loader.hpp"
#include "tests/test_util.hpp"

using namespace stagehand;
using stagehand::test::TempDir;
namespace fs = std::filesystem;

namespace {

const std::string kBin = test::bin_dir();
const std::string kConfigs = test::source_dir() + "/examples/configs/";


using Run = test::CommandRun;

Run train(const std::string& config, const std::vector<std::string>& sets, const std::string& metrics = "") {
  std::string cmd = kBin + "/stagehand-train --quiet --config " + kConfigs + config;
  for (const auto& s : sets) cmd += " --set " + s;
  if (!metrics.empty()) cmd += " --metrics-out " + metrics;
  return test::run_command(cmd);
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
      BOOST_TEST(!lines_of(dir / "metrics.jsonl", "save").empty());
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
        auto a = test::files_of(dir / "straight/global_step_40");
        auto b = test::files_of(dir / "split/global_step_40");
        BOOST_TEST(a.size() == b.size());
        BOOST_TEST(a.count("policy/metadata.json") == 1u);
        for (const auto& [name, bytes] : a) BOOST_TEST((b[name] == bytes), name << " differs after resume");
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(retention_keeps_exactly_the_newest_committed) {
  for (std::string async : {"true", "false"}) {
    TempDir dir;
    Run r = train("sync_rl.yaml", {"trainer.ckpt_path=" + dir / "ckpt", "trainer.total_steps=50", "trainer.ckpt_interval=10",
                                   "trainer.max_ckpts_to_keep=2", "megatron_config.async_dist_ckpt_save=" + async});
    BOOST_REQUIRE_MESSAGE(r.code == 0, r.output);
    BOOST_TEST((committed_steps(dir / "ckpt") == std::vector<std::int64_t>{40, 50}));
    BOOST_TEST(**read_tracker(dir / "ckpt") == 50);
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
}

BOOST_AUTO_TEST_CASE(sigterm_saves_drains_and_exits_cleanly) {
  TempDir dir;
  std::string out = dir / "out.txt";
  pid_t pid = ::fork();
  if (pid == 0) {
    std::string cmd = kBin + "/stagehand-train --quiet --config " + kConfigs + "sync_rl.yaml --set trainer.ckpt_path=" +
                      dir / "ckpt" + " --set trainer.total_steps=100000000 --set trainer.ckpt_interval=0" +
                      " --set megatron_config.async_dist_ckpt_save=true --set model.hidden=2048 > " + out + " 2>&1";
    ::execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), nullptr);
    ::_exit(127);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  ::kill(pid, SIGTERM);
  int status = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (::waitpid(pid, &status, WNOHANG) == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  BOOST_REQUIRE(WIFEXITED(status));
  std::string text = test::read_file(out);
  BOOST_TEST(WEXITSTATUS(status) == 0, text);
  auto pos = text.find("stopped by signal: checkpoint of step ");
  BOOST_REQUIRE_MESSAGE(pos != std::string::npos, text);
  std::int64_t step = std::stoll(text.substr(pos + 38));
  BOOST_TEST(step > 0);
  // By the time the process exited, that checkpoint was committed.
  BOOST_TEST(**read_tracker(dir / "ckpt") == step);
  BOOST_TEST(!fs::exists(dir / ("ckpt/global_step_" + std::to_string(step) + ".tmp")));
  BOOST_TEST(verify_checkpoint(dir / ("ckpt/global_step_" + std::to_string(step)))->ok());
  Run resumed = train("sync_rl.yaml", {"trainer.ckpt_path=" + dir / "ckpt", "trainer.resume_mode=latest",
                                       "trainer.total_steps=" + std::to_string(step + 2), "model.hidden=2048"});
  BOOST_TEST(resumed.code == 0, resumed.output);
  BOOST_TEST(**read_tracker(dir / "ckpt") == step + 2);
}
