#define BOOST_TEST_MODULE config
#include <boost/test/unit_test.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>

#include "stagehand/config/load.hpp"
#include "stagehand/config/rules.hpp"

using namespace stagehand;

namespace {

/// The source tree, for the example configs; STAGEHAND_SOURCE_DIR in the environment overrides it.
std::string source_dir() {
  const char* env = std::getenv("STAGEHAND_SOURCE_DIR");
  return env != nullptr ? env : STAGEHAND_SOURCE_DIR;
}

/// A fresh folder under the temporary directory, removed with its contents at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "stagehand-config-test-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

/// Checks that `result` is an error whose message contains every one of `expect`.
void expect_error(const Result<Config>& result, ErrorCode code,
                  const std::vector<std::string>& expect) {
  BOOST_TEST(!result.is_ok(), "accepted, expected an error with '" << expect.front() << "'");
  if (result.is_ok()) return;
  BOOST_TEST(result.status().code() == code,
             "code " << result.status().code() << ": " << result.status().message());
  for (const auto& needle : expect) {
    BOOST_TEST(result.status().message().find(needle) != std::string::npos,
               "'" << needle << "' not in: " << result.status().message());
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(defaults_when_empty) {
  auto c = load_config_string("");
  BOOST_REQUIRE(c.is_ok());
  BOOST_TEST(!c->megatron_config.async_dist_ckpt_save);
  BOOST_TEST(c->megatron_config.ckpt_save_staging_buckets == 0);
  BOOST_TEST(c->megatron_config.ckpt_save_thread_count == 2);
  BOOST_TEST(c->megatron_config.ckpt_load_thread_count == 4);
  BOOST_TEST(c->megatron_config.ckpt_writer_low_priority);
  BOOST_TEST(c->megatron_config.ckpt_save_uncached);
  BOOST_TEST((c->megatron_config.ckpt_staging_memory == StagingMemory::persistent));
  BOOST_TEST((c->trainer.kind == TrainerKind::sync));
  BOOST_TEST(c->parallel.tensor_parallel == 1);
  // Unset: the trainer decides (yes for a resume, no for init_from).
  BOOST_TEST(!c->trainer.load_optimizer.has_value());
  BOOST_TEST(!c->trainer.load_rng.has_value());
  BOOST_TEST(c->trainer.load_strict);
  BOOST_TEST(c->trainer.init_from.empty());
  BOOST_TEST(c->trainer.export_interval == 0);
}

BOOST_AUTO_TEST_CASE(every_key_is_read) {
  auto c = load_config_string(R"(
trainer:
  kind: fully_async
  total_steps: 40
  ckpt_path: /tmp/ck
  ckpt_interval: 5
  max_ckpts_to_keep: 3
  resume_mode: from_path
  resume_path: /tmp/ck/global_step_5
  seed: 99
  call_timeout_s: 30
  overwrite_checkpoints: true
  init_from: /tmp/sft/global_step_9
  load_optimizer: false
  load_rng: true
  load_strict: false
  export_interval: 10
  export_path: /tmp/hf
megatron_config:
  async_dist_ckpt_save: true
  ckpt_save_staging_buckets: 2
  ckpt_staging_memory: per_save
  ckpt_save_thread_count: 8
  ckpt_load_thread_count: 16
  ckpt_writer_low_priority: false
  ckpt_save_uncached: false
  local_work_dir: /tmp/work
parallel:
  tensor_parallel: 2
  data_parallel: 4
fully_async:
  max_staleness_steps: 2
  num_generators: 3
weight_sync:
  transport: shm
  channel: rollout-1
  tensors: model.layers.
  receivers: 2
  bucket_mib: 16
  receiver_timeout_s: 5
storage:
  s3:
    endpoint: http://127.0.0.1:9000
    region: eu-west-1
    path_style: false
)");
  BOOST_REQUIRE_MESSAGE(c.is_ok(), c.status().to_string());
  BOOST_TEST((c->trainer.kind == TrainerKind::fully_async));
  BOOST_TEST(c->trainer.total_steps == 40);
  BOOST_TEST(c->trainer.ckpt_path == "/tmp/ck");
  BOOST_TEST(c->trainer.ckpt_interval == 5);
  BOOST_TEST(c->trainer.max_ckpts_to_keep == 3);
  BOOST_TEST((c->trainer.resume_mode == ResumeMode::from_path));
  BOOST_TEST(c->trainer.resume_path == "/tmp/ck/global_step_5");
  BOOST_TEST(c->trainer.seed == 99u);
  BOOST_TEST(c->trainer.call_timeout_s == 30);
  BOOST_TEST(c->trainer.overwrite_checkpoints);
  BOOST_TEST(c->trainer.init_from == "/tmp/sft/global_step_9");
  BOOST_TEST((c->trainer.load_optimizer == std::optional<bool>(false)));
  BOOST_TEST((c->trainer.load_rng == std::optional<bool>(true)));
  BOOST_TEST(!c->trainer.load_strict);
  BOOST_TEST(c->trainer.export_interval == 10);
  BOOST_TEST(c->trainer.export_path == "/tmp/hf");
  BOOST_TEST(c->megatron_config.async_dist_ckpt_save);
  BOOST_TEST(c->megatron_config.ckpt_save_thread_count == 8);
  BOOST_TEST(c->megatron_config.ckpt_load_thread_count == 16);
  // Async saves with staging waves: the rest is staged behind the fence.
  BOOST_TEST(c->megatron_config.ckpt_save_staging_buckets == 2);
  BOOST_TEST((c->megatron_config.ckpt_staging_memory == StagingMemory::per_save));
  BOOST_TEST(c->megatron_config.local_work_dir == "/tmp/work");
  BOOST_TEST(!c->megatron_config.ckpt_writer_low_priority);
  BOOST_TEST(!c->megatron_config.ckpt_save_uncached);
  BOOST_TEST(c->parallel.tensor_parallel == 2);
  BOOST_TEST(c->parallel.data_parallel == 4);
  BOOST_TEST(c->fully_async.max_staleness_steps == 2);
  BOOST_TEST(c->fully_async.num_generators == 3);
  BOOST_TEST((c->weight_sync.transport == WeightTransport::shm));
  BOOST_TEST(c->weight_sync.channel == "rollout-1");
  BOOST_TEST(c->weight_sync.tensors == "model.layers.");
  BOOST_TEST(c->weight_sync.receivers == 2);
  BOOST_TEST(c->weight_sync.bucket_mib == 16);
  BOOST_TEST(c->weight_sync.receiver_timeout_s == 5);
  BOOST_TEST(c->storage.s3.endpoint == "http://127.0.0.1:9000");
  BOOST_TEST(c->storage.s3.region == "eu-west-1");
  BOOST_TEST(!c->storage.s3.path_style);
  // TCP: the channel is trainer rank 0's address.
  auto tcp = load_config_string("weight_sync:\n  transport: tcp\n  channel: trainer-0.cluster:29700\n", "tcp.yaml", {});
  BOOST_REQUIRE_MESSAGE(tcp.is_ok(), tcp.status().to_string());
  BOOST_TEST((tcp->weight_sync.transport == WeightTransport::tcp));
  BOOST_TEST(tcp->weight_sync.channel == "trainer-0.cluster:29700");
}

struct BadCase {
  const char* name;
  const char* yaml;
  /// Substrings that the error must contain.
  std::vector<std::string> expect;
};

BOOST_AUTO_TEST_CASE(malformed_configs_give_their_own_error) {
  const std::vector<BadCase> cases = {
      {"unknown top key", "trainr:\n  total_steps: 3\n", {"bad.yaml:1", "trainr", "unknown key"}},
      {"unknown nested key", "trainer:\n  total_step: 3\n",
       {"bad.yaml:2", "trainer.total_step", "unknown key", "total_steps"}},
      {"wrong type int", "trainer:\n  total_steps: many\n",
       {"bad.yaml:2", "trainer.total_steps", "expected an integer, got 'many'"}},
      {"zero steps", "trainer:\n  total_steps: 0\n", {"trainer.total_steps", "at least 1, got 0"}},
      {"negative interval", "trainer:\n  ckpt_interval: -5\n",
       {"trainer.ckpt_interval", "at least 0, got -5"}},
      {"bool typo", "megatron_config:\n  async_dist_ckpt_save: ture\n",
       {"bad.yaml:2", "megatron_config.async_dist_ckpt_save", "true or false, got 'ture'"}},
      {"zero threads", "megatron_config:\n  ckpt_save_thread_count: 0\n",
       {"megatron_config.ckpt_save_thread_count", "between 1 and 256, got 0"}},
      {"zero load threads", "megatron_config:\n  ckpt_load_thread_count: 0\n",
       {"bad.yaml:2", "megatron_config.ckpt_load_thread_count", "between 1 and 256, got 0"}},
      {"too many load threads", "megatron_config:\n  ckpt_load_thread_count: 257\n",
       {"bad.yaml:2", "megatron_config.ckpt_load_thread_count", "between 1 and 256, got 257"}},
      {"negative staging", "megatron_config:\n  ckpt_save_staging_buckets: -1\n",
       {"megatron_config.ckpt_save_staging_buckets", "at least 0, got -1"}},
      {"staging above threads",
       "megatron_config:\n  ckpt_save_thread_count: 2\n  ckpt_save_staging_buckets: 3\n",
       {"bad.yaml:3", "at most megatron_config.ckpt_save_thread_count (2), got 3"}},
      {"bad staging memory", "megatron_config:\n  ckpt_staging_memory: pinned\n",
       {"bad.yaml:2", "megatron_config.ckpt_staging_memory", "persistent | per_save", "'pinned'"}},
      {"bad enum", "trainer:\n  kind: ppo\n", {"trainer.kind", "sync | fully_async | sft", "'ppo'"}},
      {"section not a map", "trainer: 5\n", {"bad.yaml:1", "trainer", "expected a mapping"}},
      {"list for scalar", "parallel:\n  tensor_parallel: [1, 2]\n",
       {"parallel.tensor_parallel", "got a list"}},
      {"duplicate key", "trainer:\n  seed: 1\n  seed: 2\n", {"bad.yaml:3", "trainer.seed", "appears twice"}},
      {"syntax error", "trainer:\n  seed: [1, 2\n", {"bad.yaml", "invalid YAML"}},
      {"from_path without path", "trainer:\n  resume_mode: from_path\n",
       {"trainer.resume_mode", "needs trainer.resume_path"}},
      {"empty ckpt_path", "trainer:\n  ckpt_path: \"\"\n", {"trainer.ckpt_path", "must not be empty"}},
      {"top level list", "- a\n- b\n", {"expected a mapping of sections"}},
      {"negative seed", "trainer:\n  seed: -3\n", {"trainer.seed", "non-negative integer"}},
      {"zero generators", "fully_async:\n  num_generators: 0\n", {"fully_async.num_generators"}},
      {"unknown s3 key", "storage:\n  s3:\n    bucket: x\n", {"bad.yaml:3", "storage.s3.bucket", "unknown key"}},
      {"bad learning rate", "model:\n  learning_rate: fast\n", {"model.learning_rate", "expected a number"}},
      {"zero timeout", "trainer:\n  call_timeout_s: 0\n",
       {"trainer.call_timeout_s", "between 1 and 1000000, got 0"}},
      {"negative write rate", "megatron_config:\n  ckpt_write_rate_limit_mib_s: -1\n",
       {"megatron_config.ckpt_write_rate_limit_mib_s"}},
      {"tiny part", "storage:\n  s3:\n    part_size_mib: 1\n", {"bad.yaml:3", "storage.s3.part_size_mib", "between 5 and 5120, got 1"}},
      {"part above threshold", "storage:\n  s3:\n    part_size_mib: 32\n    multipart_threshold_mib: 16\n",
       {"storage.s3.part_size_mib", "at most storage.s3.multipart_threshold_mib (16), got 32"}},
      {"zero attempts", "storage:\n  s3:\n    max_attempts: 0\n", {"storage.s3.max_attempts"}},
      {"load_optimizer typo", "trainer:\n  load_optimizer: yes\n",
       {"bad.yaml:2", "trainer.load_optimizer", "true or false, got 'yes'"}},
      {"negative export interval", "trainer:\n  export_interval: -1\n", {"trainer.export_interval", "at least 0"}},
      {"export off the save steps", "trainer:\n  ckpt_interval: 4\n  export_interval: 6\n",
       {"bad.yaml:3", "trainer.export_interval", "multiple of trainer.ckpt_interval (4)"}},
      {"export without path", "trainer:\n  ckpt_interval: 5\n  export_interval: 5\n",
       {"bad.yaml:3", "trainer.export_interval", "needs trainer.export_path"}},
      {"export to an object store", "trainer:\n  export_path: s3://b/hf\n",
       {"bad.yaml:2", "trainer.export_path", "must be a local folder"}},
      // Issue 59: storage's test of a URL, gcs:// with the others.
      {"export to gcs", "trainer:\n  export_path: gcs://b/hf\n",
       {"bad.yaml:2", "trainer.export_path", "must be a local folder, got 'gcs://b/hf'"}},
      {"local tier on gcs", "trainer:\n  local_ckpt_path: gcs://b/l\n",
       {"bad.yaml:2", "trainer.local_ckpt_path", "must be a node-local folder"}},
      {"export into the checkpoints", "trainer:\n  ckpt_path: /tmp/sh-ck\n  export_path: /tmp/sh-ck/hf\n",
       {"bad.yaml:3", "trainer.export_path", "must be a folder outside trainer.ckpt_path '/tmp/sh-ck'"}},
      {"export onto the checkpoints", "trainer:\n  ckpt_path: /tmp/sh-ck/\n  export_path: /tmp/x/../sh-ck\n",
       {"trainer.export_path", "must be a folder outside trainer.ckpt_path"}},
      {"export into the local tier",
       "trainer:\n  ckpt_path: /tmp/sh-d\n  local_ckpt_path: /tmp/sh-l\n  export_path: /tmp/sh-l/hf\n",
       {"trainer.export_path", "must be a folder outside trainer.local_ckpt_path '/tmp/sh-l'"}},
  };
  for (const auto& c : cases) {
    auto result = load_config_string(c.yaml, "bad.yaml");
    BOOST_TEST_CONTEXT(c.name) { expect_error(result, ErrorCode::config_error, c.expect); }
  }
}

// A folder beside a tier's, whose name starts as the tier's does, is outside it.
BOOST_AUTO_TEST_CASE(an_export_path_beside_a_tier_is_taken) {
  auto c = load_config_string("trainer:\n  ckpt_path: /tmp/sh-ck\n  local_ckpt_path: /tmp/sh-l\n  export_path: /tmp/sh-ck-hf\n",
                              "ok.yaml");
  BOOST_TEST(c.is_ok(), c.status().to_string());
  auto local = load_config_string("trainer:\n  ckpt_path: /tmp/sh-ck\n  local_ckpt_path: /tmp/sh-l\n  export_path: /tmp/sh-l2\n",
                                  "ok.yaml");
  BOOST_TEST(local.is_ok(), local.status().to_string());
}

// Values that parse but that the program cannot run with: each key is bounded by what its use
// can hold (a clock, a float, a world of Workers), and the error gives the limit. The reference
// model's own limits (its matrices, its layout, its evaluation contexts) are checked in models/
// and tested in tests/models/bandit_mlp_test.cpp.
BOOST_AUTO_TEST_CASE(values_beyond_what_the_program_can_run_are_refused) {
  const std::vector<BadCase> cases = {
      {"timeout past the clock",
       "trainer:\n  call_timeout_s: 9300000000\n",
       {"bad.yaml:2", "trainer.call_timeout_s", "between 1 and 1000000, got 9300000000"}},
      {"infinite learning rate",
       "model:\n  learning_rate: inf\n",
       {"bad.yaml:2", "model.learning_rate", "finite", "greater than 0 and at most 1, got 'inf'"}},
      {"YAML infinity",
       "model:\n  learning_rate: .inf\n",
       {"bad.yaml:2", "model.learning_rate", "'.inf'"}},
      {"NaN learning rate",
       "model:\n  learning_rate: nan\n",
       {"bad.yaml:2", "model.learning_rate", "finite", "got 'nan'"}},
      {"overflowing learning rate",
       "model:\n  learning_rate: 1e999\n",
       {"bad.yaml:2", "model.learning_rate", "at most 1, got '1e999'"}},
      {"learning rate above 1",
       "model:\n  learning_rate: 2\n",
       {"bad.yaml:2", "model.learning_rate", "greater than 0 and at most 1, got '2'"}},
      {"zero learning rate",
       "model:\n  learning_rate: 0\n",
       {"bad.yaml:2", "model.learning_rate", "greater than 0 and at most 1, got '0'"}},
      {"infinite write rate",
       "megatron_config:\n  ckpt_write_rate_limit_mib_s: inf\n",
       {"bad.yaml:2", "megatron_config.ckpt_write_rate_limit_mib_s",
        "0 or between 0.001 and 1048576"}},
      {"write rate near zero",
       "megatron_config:\n  ckpt_write_rate_limit_mib_s: 1e-300\n",
       {"bad.yaml:2", "megatron_config.ckpt_write_rate_limit_mib_s",
        "0 or between 0.001 and 1048576, got '1e-300'"}},
      {"endless staleness",
       "fully_async:\n  max_staleness_steps: 1000000000000000000\n",
       {"bad.yaml:2", "fully_async.max_staleness_steps", "between 0 and 1024"}},
      {"world too large",
       "parallel:\n  tensor_parallel: 1024\n  data_parallel: 1024\nmodel:\n  hidden: 1024\n  "
       "batch_size: 1024\n",
       {"bad.yaml:3", "parallel.data_parallel", "parallel.tensor_parallel x parallel.data_parallel",
        "at most 1024, got 1048576"}},
      {"steps beyond int64",
       "trainer:\n  total_steps: 99999999999999999999\n",
       {"bad.yaml:2", "trainer.total_steps",
        "between 1 and 9223372036854775807, got 99999999999999999999"}},
      {"seed beyond uint64",
       "trainer:\n  seed: 18446744073709551616\n",
       {"bad.yaml:2", "trainer.seed", "at most 18446744073709551615, got 18446744073709551616"}},
  };
  for (const auto& c : cases) {
    BOOST_TEST_CONTEXT(c.name) {
      expect_error(load_config_string(c.yaml, "bad.yaml"), ErrorCode::config_error, c.expect);
    }
  }
}

BOOST_AUTO_TEST_CASE(values_at_the_limits_are_accepted) {
  const std::vector<std::string> limits = {
      "trainer:\n  call_timeout_s: 1000000\n",
      "model:\n  learning_rate: 1\n",
      "model:\n  learning_rate: 1e-9\n",
      "megatron_config:\n  ckpt_write_rate_limit_mib_s: 0\n",
      "megatron_config:\n  ckpt_write_rate_limit_mib_s: 0.001\n",
      "megatron_config:\n  ckpt_write_rate_limit_mib_s: 1048576\n",
      "fully_async:\n  max_staleness_steps: 1024\n",
      "parallel:\n  tensor_parallel: 32\n  data_parallel: 32\n",
  };
  for (const auto& yaml : limits) {
    auto c = load_config_string(yaml, "limit.yaml");
    BOOST_TEST(c.is_ok(), yaml << " -> " << c.status());
  }
  // The multi-process test slows its saves down with 10 KiB/s.
  auto rate =
      load_config_string("", "x.yaml", {"megatron_config.ckpt_write_rate_limit_mib_s=0.01"});
  BOOST_REQUIRE_MESSAGE(rate.is_ok(), rate.status());
  BOOST_TEST(rate->megatron_config.ckpt_write_rate_limit_mib_s == 0.01);
}

BOOST_AUTO_TEST_CASE(example_configs_stay_valid) {
  int seen = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator(source_dir() + "/examples/configs")) {
    if (entry.path().extension() != ".yaml") continue;
    auto c = load_config_file(entry.path().string());
    BOOST_TEST(c.is_ok(), entry.path() << ": " << c.status());
    ++seen;
  }
  BOOST_TEST(seen >= 3);
}

BOOST_AUTO_TEST_CASE(overrides_apply_on_top) {
  auto c = load_config_string("trainer:\n  total_steps: 5\n", "x.yaml",
                              {"trainer.total_steps=7", "megatron_config.async_dist_ckpt_save=true",
                               "parallel.tensor_parallel=2"});
  BOOST_REQUIRE_MESSAGE(c.is_ok(), c.status().to_string());
  BOOST_TEST(c->trainer.total_steps == 7);
  BOOST_TEST(c->megatron_config.async_dist_ckpt_save);
  BOOST_TEST(c->parallel.tensor_parallel == 2);

  auto bad = load_config_string("", "x.yaml", {"trainer.total_steps"});
  BOOST_TEST(bad.status().message().find("key.path=value") != std::string::npos);
  auto unknown = load_config_string("", "x.yaml", {"trainer.nope=1"});
  BOOST_TEST(unknown.status().message().find("trainer.nope") != std::string::npos);
}

// An override is not a line of the config file: its errors name the override.
BOOST_AUTO_TEST_CASE(override_errors_name_the_override) {
  const std::string file = "trainer:\n  total_steps: 5\nmodel:\n  hidden: 64\n";
  const std::vector<std::pair<std::vector<std::string>, std::vector<std::string>>> cases = {
      {{"model.hidden=abc"},
       {"--set model.hidden=abc: model.hidden: expected an integer, got 'abc'"}},
      {{"model.batch_size=abc"},
       {"--set model.batch_size=abc: model.batch_size: expected an integer"}},
      {{"trainer.nope=1"}, {"--set trainer.nope=1: trainer.nope: unknown key"}},
      {{"trainr.seed=1"}, {"--set trainr.seed=1: trainr: unknown key"}},
      {{"trainer.call_timeout_s=9300000000"},
       {"--set trainer.call_timeout_s=9300000000: ", "between 1 and 1000000"}},
      {{"model.hidden=1", "model.hidden=abc"}, {"--set model.hidden=abc: "}},
      {{"trainer.total_steps"}, {"--set trainer.total_steps: ", "key.path=value"}},
      {{"trainer..seed=1"}, {"--set trainer..seed=1: ", "empty key"}},
      {{"trainer.=1"}, {"--set trainer.=1: ", "empty key"}},
      {{"trainer.total_steps.x=1"},
       {"--set trainer.total_steps.x=1: ", "trainer.total_steps is not a section"}},
  };
  for (const auto& [overrides, expect] : cases) {
    auto c = load_config_string(file, "sync_rl.yaml", overrides);
    BOOST_TEST_CONTEXT(overrides.back()) {
      expect_error(c, ErrorCode::config_error, expect);
      BOOST_TEST(c.status().message().find("sync_rl.yaml") == std::string::npos,
                 c.status().message());
    }
  }
  // The file's own errors still name the file.
  auto file_error =
      load_config_string("trainer:\n  total_steps: x\n", "sync_rl.yaml", {"model.hidden=32"});
  expect_error(file_error, ErrorCode::config_error, {"sync_rl.yaml:2: trainer.total_steps"});
}

// Each range and each rule between keys lives once (schema.hpp, rules.hpp) and is checked after
// the whole file is read: broken in the file or by an override, it fires once, naming the key it
// blames and where that key (or the first other key of the rule that was given) was given.
BOOST_AUTO_TEST_CASE(each_rule_fires_once_naming_its_key_and_where_it_was_given) {
  struct Case {
    std::string yaml;
    std::vector<std::string> overrides;
    std::string message;
  };
  const std::string staging =
      "megatron_config.ckpt_save_staging_buckets: must be at most "
      "megatron_config.ckpt_save_thread_count";
  const std::string world =
      "parallel.data_parallel: parallel.tensor_parallel x "
      "parallel.data_parallel (the world size) must be at most 1024, got 2048";
  const std::string part =
      "storage.s3.part_size_mib: must be at most "
      "storage.s3.multipart_threshold_mib";
  const std::string multiple =
      "trainer.export_interval: must be a multiple of "
      "trainer.ckpt_interval (4): only committed checkpoints are "
      "exported, got 6";
  const std::vector<Case> cases = {
      {"megatron_config:\n  ckpt_save_thread_count: 2\n  ckpt_save_staging_buckets: 3\n",
       {},
       "bad.yaml:3: " + staging + " (2), got 3"},
      {"",
       {"megatron_config.ckpt_save_staging_buckets=3"},
       "--set megatron_config.ckpt_save_staging_buckets=3: " + staging + " (2), got 3"},
      {"megatron_config:\n  ckpt_save_staging_buckets: 2\n",
       {"megatron_config.ckpt_save_thread_count=1"},
       "bad.yaml:2: " + staging + " (1), got 2"},
      {"parallel:\n  tensor_parallel: 1024\n  data_parallel: 2\n", {}, "bad.yaml:3: " + world},
      {"",
       {"parallel.tensor_parallel=64", "parallel.data_parallel=32"},
       "--set parallel.data_parallel=32: " + world},
      {"storage:\n  s3:\n    part_size_mib: 32\n    multipart_threshold_mib: 16\n",
       {},
       "bad.yaml:3: " + part + " (16), got 32"},
      {"",
       {"storage.s3.multipart_threshold_mib=8"},
       "--set storage.s3.multipart_threshold_mib=8: " + part + " (8), got 16"},
      {"trainer:\n  resume_mode: from_path\n",
       {},
       "bad.yaml:2: trainer.resume_mode: from_path needs trainer.resume_path"},
      {"",
       {"trainer.resume_mode=from_path"},
       "--set trainer.resume_mode=from_path: trainer.resume_mode: from_path needs "
       "trainer.resume_path"},
      {"trainer:\n  ckpt_interval: 4\n  export_interval: 6\n  export_path: /tmp/hf\n",
       {},
       "bad.yaml:3: " + multiple},
      {"",
       {"trainer.ckpt_interval=4", "trainer.export_interval=6", "trainer.export_path=/tmp/hf"},
       "--set trainer.export_interval=6: " + multiple},
      {"trainer:\n  ckpt_interval: 5\n  export_interval: 5\n",
       {},
       "bad.yaml:3: trainer.export_interval: trainer.export_interval needs trainer.export_path, "
       "the folder to export into"},
      {"",
       {"trainer.export_path=gs://b/hf"},
       "--set trainer.export_path=gs://b/hf: trainer.export_path: must be a local folder, got "
       "'gs://b/hf'"},
      {"trainer:\n  total_steps: 0\n",
       {},
       "bad.yaml:2: trainer.total_steps: must be at least 1, got 0"},
      {"",
       {"megatron_config.ckpt_save_thread_count=0"},
       "--set megatron_config.ckpt_save_thread_count=0: megatron_config.ckpt_save_thread_count: "
       "must be between 1 and 256, got 0"},
      {"",
       {"model.learning_rate=2"},
       "--set model.learning_rate=2: model.learning_rate: must be a finite number, greater than 0 "
       "and at most 1, got '2'"},
      {"trainer:\n  ckpt_path: ck\n",
       {"trainer.ckpt_path="},
       "--set trainer.ckpt_path=: trainer.ckpt_path: must not be empty"},
      {"weight_sync:\n  channel: a/b\n",
       {},
       "bad.yaml:2: weight_sync.channel: may hold only letters, digits, '_', '.' and '-', got 'a/b'"},
      {"",
       {"weight_sync.transport=collective"},
       "--set weight_sync.transport=collective: weight_sync.transport: collective carries only the "
       "fully-async trainer's generators' weights; trainer.kind is sync"},
      {"trainer:\n  kind: fully_async\nweight_sync:\n  transport: collective\n  channel: x\n",
       {},
       "bad.yaml:5: weight_sync.channel: receivers outside the run need weight_sync.transport shm or tcp, got "
       "collective"},
      {"weight_sync:\n  transport: tcp\n  channel: rollout\n",
       {},
       "bad.yaml:3: weight_sync.channel: with transport tcp is trainer rank 0's HOST:PORT (port 1 to 65535), got "
       "'rollout'"},
      {"",
       {"weight_sync.transport=tcp", "weight_sync.channel=host:0"},
       "--set weight_sync.channel=host:0: weight_sync.channel: with transport tcp is trainer rank 0's HOST:PORT "
       "(port 1 to 65535), got 'host:0'"},
      {"weight_sync:\n  receivers: 1\n",
       {},
       "bad.yaml:2: weight_sync.receivers: receivers outside the run need weight_sync.channel"},
  };
  for (const auto& c : cases) {
    BOOST_TEST_CONTEXT(c.message) {
      auto result = load_config_string(c.yaml, "bad.yaml", c.overrides);
      BOOST_REQUIRE(!result.is_ok());
      BOOST_TEST(result.status().code() == ErrorCode::config_error);
      BOOST_TEST(result.status().message() == c.message);
    }
  }
}

// The loaded Config keeps where each key was given, for rules that layers above check on it.
BOOST_AUTO_TEST_CASE(a_loaded_config_knows_where_each_key_was_given) {
  auto c = load_config_string("trainer:\n  total_steps: 5\n\nmodel:\n  hidden: 32\n", "x.yaml",
                              {"model.batch_size=32", "storage.s3.region=eu"});
  BOOST_REQUIRE_MESSAGE(c.is_ok(), c.status());
  BOOST_TEST(c->origins.where("trainer.total_steps").value_or("") == "x.yaml:2");
  BOOST_TEST(c->origins.where("model.hidden").value_or("") == "x.yaml:5");
  BOOST_TEST(c->origins.where("model.batch_size").value_or("") == "--set model.batch_size=32");
  BOOST_TEST(c->origins.where("storage").value_or("") == "--set storage.s3.region=eu");
  BOOST_TEST(!c->origins.where("trainer.seed").has_value());
  BOOST_TEST(c->origins.error({"model.hidden"}, "too wide").message() ==
             "x.yaml:5: model.hidden: too wide");
  BOOST_TEST(c->origins.error({"trainer.seed", "model.batch_size"}, "odd").message() ==
             "--set model.batch_size=32: trainer.seed: odd");
  BOOST_TEST(c->origins.error({"trainer.seed"}, "odd").message() == "x.yaml: trainer.seed: odd");
  BOOST_TEST(Config{}.origins.error({"trainer.seed"}, "odd").message() == "trainer.seed: odd");
}

// A `#` or a `: ` in a value is part of it (paths may hold both), not YAML syntax.
BOOST_AUTO_TEST_CASE(override_values_are_taken_literally) {
  struct Case {
    std::string key;
    std::string value;
    std::function<std::string(const Config&)> read;
  };
  const std::vector<Case> cases = {
      {"trainer.ckpt_path", "/data/run #3/ck", [](const Config& c) { return c.trainer.ckpt_path; }},
      {"trainer.resume_path", "", [](const Config& c) { return c.trainer.resume_path; }},
      {"megatron_config.local_work_dir", "/tmp/a: b",
       [](const Config& c) { return c.megatron_config.local_work_dir; }},
      {"storage.s3.endpoint", "[x]", [](const Config& c) { return c.storage.s3.endpoint; }},
  };
  for (const auto& x : cases) {
    auto c = load_config_string("trainer:\n  ckpt_path: ck\n", "x.yaml", {x.key + "=" + x.value});
    BOOST_TEST_CONTEXT(x.key + "=" + x.value) {
      BOOST_REQUIRE_MESSAGE(c.is_ok(), c.status());
      BOOST_TEST(x.read(*c) == x.value);
    }
  }
}

BOOST_AUTO_TEST_CASE(missing_file_is_named) {
  auto c = load_config_file("/nonexistent/stagehand.yaml");
  expect_error(c, ErrorCode::not_found, {"/nonexistent/stagehand.yaml", "No such file"});
}

// A path that names no readable config file must never fall back to the defaults.
BOOST_AUTO_TEST_CASE(config_path_that_is_no_readable_file_is_refused) {
  TempDir dir;
  expect_error(load_config_file(dir.path(), {"trainer.total_steps=3"}), ErrorCode::invalid_argument,
               {"'" + dir.path() + "'", "is a directory"});

  const std::string big = dir / "big.yaml";
  {
    std::ofstream out(big);
    for (int i = 0; i < 40000; ++i) out << "# a comment line that pads the file beyond its limit\n";
  }
  expect_error(load_config_file(big), ErrorCode::invalid_argument,
               {"'" + big + "'", "larger than 1048576 bytes"});

  // Opens but cannot be read (EIO at offset 0).
  if (std::filesystem::exists("/proc/self/mem")) {
    expect_error(load_config_file("/proc/self/mem"), ErrorCode::io_error,
                 {"'/proc/self/mem'", "cannot read"});
  }

  const std::string locked = dir / "locked.yaml";
  std::ofstream(locked) << "trainer:\n  total_steps: 3\n";
  ::chmod(locked.c_str(), 0);
  if (::geteuid() == 0) {
    BOOST_TEST_MESSAGE("running as root, which reads any file: skipping the permission case");
  } else {
    expect_error(load_config_file(locked), ErrorCode::permission_denied,
                 {"'" + locked + "'", "Permission denied"});
  }

  auto piped = load_config_file("/dev/null");
  BOOST_TEST(piped.is_ok(), piped.status());
}

BOOST_AUTO_TEST_CASE(api_level_validation_accepts_async_with_staging_and_checks_the_bound) {
  Config c;
  c.megatron_config.async_dist_ckpt_save = true;
  c.megatron_config.ckpt_save_thread_count = 4;
  c.megatron_config.ckpt_save_staging_buckets = 1;
  BOOST_TEST(validate_config(c).is_ok());
  c.megatron_config.ckpt_save_staging_buckets = 5;
  Status st = validate_config(c);
  BOOST_TEST(!st.is_ok());
  // The loader's rule, named by its key alone: a Config built in code has no line.
  BOOST_TEST(st.message() ==
             "megatron_config.ckpt_save_staging_buckets: must be at most "
             "megatron_config.ckpt_save_thread_count (4), got 5");
  BOOST_TEST(check_save_buckets(4, 5).message() == st.message());
  c.megatron_config.ckpt_save_staging_buckets = 1;
  for (std::int64_t threads : {0, 257}) {
    c.megatron_config.ckpt_load_thread_count = threads;
    st = validate_config(c);
    BOOST_TEST(st.message().find("megatron_config.ckpt_load_thread_count") != std::string::npos, threads);
  }
}
