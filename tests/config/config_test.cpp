#define BOOST_TEST_MODULE config
#include <boost/test/unit_test.hpp>

#include <fstream>

#include "config/config.hpp"

using namespace stagehand;

BOOST_AUTO_TEST_CASE(defaults_when_empty) {
  auto c = load_config_string("");
  BOOST_REQUIRE(c.is_ok());
  BOOST_TEST(!c->megatron_config.async_dist_ckpt_save);
  BOOST_TEST(c->megatron_config.ckpt_save_staging_buckets == 0);
  BOOST_TEST(c->megatron_config.ckpt_save_thread_count == 2);
  BOOST_TEST(c->megatron_config.ckpt_writer_low_priority);
  BOOST_TEST((c->trainer.kind == TrainerKind::sync));
  BOOST_TEST(c->parallel.tensor_parallel == 1);
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
megatron_config:
  async_dist_ckpt_save: true
  ckpt_save_staging_buckets: 0
  ckpt_save_thread_count: 8
  ckpt_writer_low_priority: false
  local_work_dir: /tmp/work
parallel:
  tensor_parallel: 2
  data_parallel: 4
fully_async:
  max_staleness_steps: 2
  num_generators: 3
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
  BOOST_TEST(c->megatron_config.async_dist_ckpt_save);
  BOOST_TEST(c->megatron_config.ckpt_save_thread_count == 8);
  BOOST_TEST(c->megatron_config.local_work_dir == "/tmp/work");
  BOOST_TEST(!c->megatron_config.ckpt_writer_low_priority);
  BOOST_TEST(c->parallel.tensor_parallel == 2);
  BOOST_TEST(c->parallel.data_parallel == 4);
  BOOST_TEST(c->fully_async.max_staleness_steps == 2);
  BOOST_TEST(c->fully_async.num_generators == 3);
  BOOST_TEST(c->storage.s3.endpoint == "http://127.0.0.1:9000");
  BOOST_TEST(c->storage.s3.region == "eu-west-1");
  BOOST_TEST(!c->storage.s3.path_style);
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
      {"negative staging", "megatron_config:\n  ckpt_save_staging_buckets: -1\n",
       {"megatron_config.ckpt_save_staging_buckets", "at least 0, got -1"}},
      {"staging above threads",
       "megatron_config:\n  ckpt_save_thread_count: 2\n  ckpt_save_staging_buckets: 3\n",
       {"bad.yaml:3", "at most megatron_config.ckpt_save_thread_count (2), got 3"}},
      {"async with staging",
       "megatron_config:\n  async_dist_ckpt_save: true\n  ckpt_save_thread_count: 8\n"
       "  ckpt_save_staging_buckets: 2\n",
       {"bad.yaml:4", "must be 0 when async_dist_ckpt_save is true", "finish staging before training resumes"}},
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
      {"hidden not divisible", "parallel:\n  tensor_parallel: 3\nmodel:\n  hidden: 64\n",
       {"bad.yaml:4", "model.hidden", "divisible by parallel.tensor_parallel (3)"}},
      {"bad learning rate", "model:\n  learning_rate: fast\n", {"model.learning_rate", "expected a number"}},
      {"zero timeout", "trainer:\n  call_timeout_s: 0\n", {"trainer.call_timeout_s", "at least 1"}},
      {"negative write rate", "megatron_config:\n  ckpt_write_rate_limit_mib_s: -1\n",
       {"megatron_config.ckpt_write_rate_limit_mib_s"}},
      {"tiny part", "storage:\n  s3:\n    part_size_mib: 1\n", {"bad.yaml:3", "storage.s3.part_size_mib", "between 5 and 5120, got 1"}},
      {"part above threshold", "storage:\n  s3:\n    part_size_mib: 32\n    multipart_threshold_mib: 16\n",
       {"storage.s3.part_size_mib", "at most storage.s3.multipart_threshold_mib (16), got 32"}},
      {"zero attempts", "storage:\n  s3:\n    max_attempts: 0\n", {"storage.s3.max_attempts"}},
  };
  for (const auto& c : cases) {
    auto result = load_config_string(c.yaml, "bad.yaml");
    BOOST_TEST_CONTEXT(c.name) {
      BOOST_REQUIRE(!result.is_ok());
      BOOST_TEST((result.status().code() == ErrorCode::config_error));
      for (const auto& needle : c.expect) {
        BOOST_TEST(result.status().message().find(needle) != std::string::npos,
                   "'" << needle << "' not in: " << result.status().message());
      }
    }
  }
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

BOOST_AUTO_TEST_CASE(missing_file_is_named) {
  auto c = load_config_file("/nonexistent/stagehand.yaml");
  BOOST_REQUIRE(!c.is_ok());
  BOOST_TEST(c.status().message().find("/nonexistent/stagehand.yaml") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(api_level_validation_refuses_async_with_staging) {
  Config c;
  c.megatron_config.async_dist_ckpt_save = true;
  c.megatron_config.ckpt_save_thread_count = 4;
  c.megatron_config.ckpt_save_staging_buckets = 1;
  Status st = validate_config(c);
  BOOST_TEST(!st.is_ok());
  BOOST_TEST(st.message().find("async_dist_ckpt_save") != std::string::npos);
}
