#define BOOST_TEST_MODULE s3_train
#include <boost/test/unit_test.hpp>

#include <cstdlib>
#include <filesystem>

#include "tests/checkpoint_test_util.hpp"
#include "tests/s3_test_util.hpp"
#include "tests/test_util.hpp"

using namespace stagehand;
using namespace stagehand::test;
namespace fs = std::filesystem;

namespace {

const std::string kBin = bin_dir();
const std::string kConfigs = source_dir() + "/examples/configs/";

CommandRun train(const std::string& env, const std::vector<std::string>& sets, bool quiet = true) {
  std::string cmd = "env " + env + " " + kBin + "/stagehand-train" + (quiet ? " --quiet" : "") + " --config " +
                    kConfigs + "sync_rl.yaml";
  for (const auto& s : sets) cmd += " --set " + s;
  return run_command(cmd);
}

}  // namespace

BOOST_AUTO_TEST_CASE(train_save_resume_through_s3_is_exact_and_saves_synchronously) {
  S3Server server({"train-bucket"});
  TempDir dir;
  const std::string url = "s3://train-bucket/runs/sync";
  std::vector<std::string> common{"megatron_config.async_dist_ckpt_save=true", "trainer.ckpt_interval=10",
                                  "megatron_config.local_work_dir=" + dir / "work"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), common.begin(), common.end());
    return extra;
  };
  CommandRun straight = train(server.env(), with({"trainer.ckpt_path=" + dir / "local", "trainer.total_steps=40"}));
  BOOST_REQUIRE_MESSAGE(straight.code == 0, straight.output);
  CommandRun first = train(server.env(), with({"trainer.ckpt_path=" + url, "trainer.total_steps=20",
                                               "trainer.max_ckpts_to_keep=1"}), false);
  BOOST_REQUIRE_MESSAGE(first.code == 0, first.output);
  BOOST_TEST(first.output.find("checkpoints sync (an object store; async_dist_ckpt_save is ignored) in " + url) !=
                 std::string::npos,
             first.output);
  BOOST_TEST(first.output.find("async_dist_ckpt_save is ignored and saves run synchronously") != std::string::npos,
             first.output);
  auto root = test::CloudRoot::open(url, server.options());
  BOOST_REQUIRE(root.is_ok());
  BOOST_TEST(**root->read_tracker() == 20);
  // Retention ran in the store: only the newest step is left.
  BOOST_TEST((*root->committed_steps() == std::vector<std::int64_t>{20}));
  BOOST_TEST(root->bucket().list("runs/sync/global_step_10")->empty());

  CommandRun second = train(server.env(), with({"trainer.ckpt_path=" + url, "trainer.total_steps=40",
                                                "trainer.resume_mode=latest"}));
  BOOST_REQUIRE_MESSAGE(second.code == 0, second.output);
  BOOST_TEST(**root->read_tracker() == 40);
  // Every file of the resumed run's last checkpoint equals the uninterrupted local run's.
  for (const std::string rel : {"trainer_state.json", "policy/metadata.json"}) {
    auto remote = root->bucket().get("runs/sync/global_step_40/" + rel);
    BOOST_REQUIRE(remote.is_ok() && remote->has_value());
    BOOST_TEST((**remote == read_file(dir / "local/global_step_40/" + rel)), rel);
  }
  auto check = run_command(server.env() + " python3 " + source_dir() + "/tests/integration/s3_check.py " + url +
                           " --compare-local " + dir / "local");
  BOOST_TEST(check.code == 0, check.output);
  // Nothing stays behind in the local work folder: every spooled file went up and was removed.
  BOOST_TEST(fs::is_empty(dir / "work"));

  // The checkpoint tool reads the store too.
  auto verify = run_command("env " + server.env() + " " + kBin + "/stagehand-ckpt verify " + url);
  BOOST_TEST(verify.code == 0, verify.output);
  BOOST_TEST(verify.output.find("OK " + url + "/global_step_40") != std::string::npos, verify.output);
  auto inspect = run_command("env " + server.env() + " " + kBin + "/stagehand-ckpt inspect " + url + "/global_step_40");
  BOOST_TEST(inspect.code == 0, inspect.output);
  BOOST_TEST(inspect.output.find("step 40") != std::string::npos, inspect.output);
  BOOST_TEST(inspect.output.find("trainer: sync") != std::string::npos, inspect.output);
  // Export reads the store with ranged GETs, verifying every chunk: the same files as an export
  // of the uninterrupted local run.
  auto exported = run_command("env " + server.env() + " " + kBin + "/stagehand-ckpt export " + url +
                              " " + dir / "hf-s3");
  BOOST_TEST(exported.code == 0, exported.output);
  auto exported_local =
      run_command(kBin + "/stagehand-ckpt export " + dir / "local" + " " + dir / "hf-local");
  BOOST_TEST(exported_local.code == 0, exported_local.output);
  const auto from_store = files_of(dir / "hf-s3");
  BOOST_TEST(from_store.count("model.safetensors") == 1u);
  BOOST_TEST((from_store == files_of(dir / "hf-local")));
}

BOOST_AUTO_TEST_CASE(wrong_credentials_a_missing_bucket_and_an_unreachable_endpoint_fail_before_training) {
  S3Server server({"train-bucket"});
  TempDir dir;
  std::vector<std::string> sets{"trainer.total_steps=5", "megatron_config.local_work_dir=" + dir / "work"};
  auto run = [&](const std::string& env, const std::string& url) {
    auto s = sets;
    s.push_back("trainer.ckpt_path=" + url);
    s.push_back("storage.s3.max_attempts=2");
    return train(env, s);
  };
  CommandRun wrong = run("AWS_ACCESS_KEY_ID=" + server.access_key() + " AWS_SECRET_ACCESS_KEY=wrong AWS_ENDPOINT_URL=" +
                             server.endpoint(),
                         "s3://train-bucket/x");
  BOOST_TEST(wrong.code != 0);
  BOOST_TEST(wrong.output.find("SignatureDoesNotMatch") != std::string::npos, wrong.output);
  BOOST_TEST(wrong.output.find("check the credentials") != std::string::npos, wrong.output);

  CommandRun missing = run(server.env(), "s3://no-such-bucket/x");
  BOOST_TEST(missing.code != 0);
  BOOST_TEST(missing.output.find("bucket 'no-such-bucket' does not exist") != std::string::npos, missing.output);

  CommandRun nowhere = run("AWS_ACCESS_KEY_ID=a AWS_SECRET_ACCESS_KEY=b AWS_ENDPOINT_URL=http://127.0.0.1:1",
                           "s3://train-bucket/x");
  BOOST_TEST(nowhere.code != 0);
  BOOST_TEST(nowhere.output.find("cannot reach the object store at http://127.0.0.1:1") != std::string::npos,
             nowhere.output);

  CommandRun no_credentials = run("-u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY", "s3://train-bucket/x");
  BOOST_TEST(no_credentials.code != 0);
  BOOST_TEST(no_credentials.output.find("no credentials") != std::string::npos, no_credentials.output);
  for (const auto* r : {&wrong, &missing, &nowhere, &no_credentials}) {
    BOOST_TEST(r->output.find("step 1") == std::string::npos, "failed only after training: " << r->output);
  }
}

BOOST_AUTO_TEST_CASE(a_local_tier_saves_async_and_fills_an_s3_durable_tier_in_the_background) {
  S3Server server({"train-bucket"}, /*proxy=*/true);
  TempDir dir;
  // A wider model, so that one upload is about a megabyte.
  std::vector<std::string> common{"megatron_config.async_dist_ckpt_save=true", "trainer.ckpt_interval=10",
                                  "model.hidden=2048",                         "trainer.local_ckpt_interval=2",
                                  "trainer.local_max_ckpts_to_keep=2",         "storage.s3.max_attempts=2",
                                  "megatron_config.local_work_dir=" + dir / "work"};
  auto with = [&](const std::string& name, int total, std::vector<std::string> extra) {
    extra.insert(extra.end(), common.begin(), common.end());
    extra.push_back("trainer.total_steps=" + std::to_string(total));
    extra.push_back("trainer.local_ckpt_path=" + dir / ("local-" + name));
    extra.push_back("trainer.ckpt_path=s3://train-bucket/" + name);
    return extra;
  };
  CommandRun straight = train(server.env(), {"trainer.ckpt_path=" + dir / "straight", "trainer.total_steps=30",
                                             "trainer.ckpt_interval=10", "model.hidden=2048"});
  BOOST_REQUIRE_MESSAGE(straight.code == 0, straight.output);

  // The request bytes of a run that uploads step 10, and of one that uploads 10 and 20.
  auto sent = [&] { return nlohmann::json::parse(server.command("stats"))["sent"].get<std::int64_t>(); };
  BOOST_REQUIRE(server.command("reset_stats") == "ok");
  CommandRun ten = train(server.env(true), with("cal10", 10, {}), false);
  BOOST_REQUIRE_MESSAGE(ten.code == 0, ten.output);
  // The saves are async into the local tier: the object store only receives the copies.
  BOOST_TEST(ten.output.find("checkpoints async in " + dir / "local-cal10") != std::string::npos, ten.output);
  BOOST_TEST(ten.output.find("durable tier: 1 uploads to s3://train-bucket/cal10, 0 failed; it holds step 10") !=
                 std::string::npos,
             ten.output);
  const std::int64_t through_ten = sent();
  BOOST_REQUIRE(server.command("reset_stats") == "ok");
  CommandRun twenty = train(server.env(true), with("cal20", 20, {}));
  BOOST_REQUIRE_MESSAGE(twenty.code == 0, twenty.output);
  const std::int64_t through_twenty = sent();
  BOOST_REQUIRE(through_twenty - through_ten > 500000);

  // The proxy goes down halfway through the upload of step 20 and stays down: the run trains on,
  // says that the upload of step 20 failed (or, when step 30 was queued before it started, that
  // 30 superseded it) and that of step 30 failed, that the durable tier did not receive step 30,
  // and fails; the store's tracker still names step 10.
  BOOST_REQUIRE(server.command("down_after " + std::to_string(through_ten + (through_twenty - through_ten) / 2)) == "ok");
  CommandRun cut = train(server.env(true), with("run", 30, {}), false);
  BOOST_TEST(cut.code == 1, cut.output);
  BOOST_TEST((cut.output.find("the upload of step 20 to 's3://train-bucket/run' failed (the durable tier still holds "
                              "step 10; the local tier keeps the newest step it lacks, and a resume uploads it)") !=
                  std::string::npos ||
              cut.output.find("the upload of step 20 is skipped: step 30 supersedes it") != std::string::npos),
             cut.output);
  for (const std::string& said :
       std::vector<std::string>{"the upload of step 30 to 's3://train-bucket/run' failed (the durable tier still holds "
                                "step 10",
                                "did not receive step 30, committed in the local tier"}) {
    BOOST_TEST(cut.output.find(said) != std::string::npos, said << " in: " << cut.output);
  }
  BOOST_REQUIRE(server.command("up") == "ok");
  auto root = test::CloudRoot::open("s3://train-bucket/run", server.options());
  BOOST_REQUIRE(root.is_ok());
  BOOST_TEST(**root->read_tracker() == 10);
  // The local tier kept its newest two and no more: step 20 is of no use once 30 is up.
  BOOST_TEST((test::committed_steps(dir / "local-run") == std::vector<std::int64_t>{28, 30}));

  // The run that resumes uploads what is owed, and the durable tier holds the step exactly.
  CommandRun resumed = train(server.env(true), with("run", 30, {"trainer.resume_mode=latest"}), false);
  BOOST_REQUIRE_MESSAGE(resumed.code == 0, resumed.output);
  BOOST_TEST(resumed.output.find("uploading step 30 of the local tier") != std::string::npos, resumed.output);
  BOOST_TEST(**root->read_tracker() == 30);
  BOOST_TEST((*root->committed_steps() == std::vector<std::int64_t>{10, 30}));
  auto check = run_command(server.env() + " python3 " + source_dir() + "/tests/integration/s3_check.py " +
                           "s3://train-bucket/run --compare-local " + dir / "straight");
  BOOST_TEST(check.code == 0, check.output);

  // The host is lost with its local tier: the resume takes step 30 from the store.
  fs::remove_all(dir / "local-run");
  CommandRun again = train(server.env(), with("run", 40, {"trainer.resume_mode=latest"}), false);
  BOOST_REQUIRE_MESSAGE(again.code == 0, again.output);
  BOOST_TEST(again.output.find("resumed from s3://train-bucket/run/global_step_30 at step 30") != std::string::npos,
             again.output);
  BOOST_TEST(**root->read_tracker() == 40);
}
