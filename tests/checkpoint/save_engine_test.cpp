#define BOOST_TEST_MODULE save_engine
#include <boost/test/unit_test.hpp>

#include <chrono>

#include <filesystem>

#include "bench/synthetic_state.hpp"
#include "stagehand/checkpoint/commit.hpp"
#include "stagehand/checkpoint/in_process_save.hpp"
#include "stagehand/checkpoint/save_engine.hpp"
#include "stagehand/core/host_buffer.hpp"
#include "tests/test_util.hpp"

using namespace stagehand;
using stagehand::test::TempDir;

namespace {

struct Ranks {
  std::vector<StateDict> states;
  std::vector<std::unique_ptr<SaveEngine>> engines;

  Ranks(const SyntheticStateSpec& spec, SaveEngineOptions options,
        std::shared_ptr<StorageBackend> storage = local_storage()) {
    for (int r = 0; r < spec.ranks; ++r) {
      states.push_back(*make_synthetic_state(spec, r, Device::host()));
      engines.push_back(*SaveEngine::create(r, options, storage));
    }
  }

  Result<std::vector<RankSaveReport>> save(const std::string& root, std::int64_t step) {
    std::vector<SaveEngine*> e;
    std::vector<const StateDict*> s;
    for (std::size_t i = 0; i < states.size(); ++i) {
      e.push_back(engines[i].get());
      s.push_back(&states[i]);
    }
    return save_checkpoint_in_process(root, step, e, s);
  }
};

const SyntheticStateSpec kSpec{3, 3u << 20, 23, 42};

}  // namespace

BOOST_AUTO_TEST_CASE(options_are_checked) {
  BOOST_TEST(!SaveEngine::create(0, {0, 0, false, {}}).is_ok());
  BOOST_TEST(!SaveEngine::create(0, {2, 3, false, {}}).is_ok());
  BOOST_TEST(!SaveEngine::create(0, {2, -1, false, {}}).is_ok());
  BOOST_TEST(SaveEngine::create(0, {2, 2, false, {}}).is_ok());
}

BOOST_AUTO_TEST_CASE(waves_give_global_bucket_indices_and_one_report) {
  for (int staging : {0, 1, 2, 3, 8}) {
    BOOST_TEST_CONTEXT("staging " << staging) {
      TempDir dir;
      Ranks ranks(kSpec, {8, staging, false, {}});
      auto reports = ranks.save(dir.path(), 1);
      BOOST_REQUIRE_MESSAGE(reports.is_ok(), reports.status().to_string());
      BOOST_TEST(reports->size() == 3u);
      for (std::size_t r = 0; r < reports->size(); ++r) {
        const auto& report = (*reports)[r];
        BOOST_TEST(report.rank == static_cast<int>(r));
        BOOST_TEST(report.status.is_ok());
        BOOST_REQUIRE(report.buckets.size() == 8u);
        for (int b = 0; b < 8; ++b) {
          BOOST_TEST(report.buckets[static_cast<std::size_t>(b)].bucket == b);
          BOOST_TEST(report.buckets[static_cast<std::size_t>(b)].file ==
                     CheckpointLayout::bucket_file_name(static_cast<int>(r), b));
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(staging_slots_bound_host_memory) {
  auto state = *make_synthetic_state({1, 8u << 20, 40, 3}, 0, Device::host());
  for (int staging : {0, 1, 2, 4}) {
    TempDir dir;
    auto engine = *SaveEngine::create(0, {8, staging, false, {}});
    const SavePlan& plan = **engine->plan_for(state);
    std::uint64_t largest = 0;
    for (const auto& b : plan.buckets) largest = std::max(largest, b.data_bytes);
    auto tmp = *prepare_checkpoint_dir(dir.path(), 1);
    auto report = engine->save(state, CheckpointLayout::policy_dir(tmp), 1);
    BOOST_TEST(report.status.is_ok());
    int slots = staging == 0 ? 8 : staging;
    BOOST_TEST(engine->staging_bytes() <= slots * largest);
    if (staging == 0) BOOST_TEST(engine->staging_bytes() == plan.data_bytes());
  }
}

BOOST_AUTO_TEST_CASE(staging_buffers_are_reused_across_saves) {
  TempDir dir;
  Ranks ranks({1, 2u << 20, 10, 5}, {4, 2, false, {}});
  BOOST_REQUIRE(ranks.save(dir.path(), 1).is_ok());
  std::size_t before = staging_memory().current();
  std::size_t held = ranks.engines[0]->staging_bytes();
  BOOST_REQUIRE(ranks.save(dir.path(), 2).is_ok());
  BOOST_REQUIRE(ranks.save(dir.path(), 3).is_ok());
  BOOST_TEST(staging_memory().current() == before);
  BOOST_TEST(ranks.engines[0]->staging_bytes() == held);
}

BOOST_AUTO_TEST_CASE(files_are_byte_identical_whatever_the_waves) {
  const int threads = 6;
  std::map<std::string, std::string> reference;
  for (int staging : {0, 1, 2, threads}) {
    BOOST_TEST_CONTEXT("staging " << staging) {
      TempDir dir;
      Ranks ranks(kSpec, {threads, staging, false, {}});
      BOOST_REQUIRE(ranks.save(dir.path(), 4).is_ok());
      auto files = test::files_of(dir.path());
      BOOST_TEST(files.count("global_step_4/policy/metadata.json") == 1u);
      BOOST_TEST(files.count("global_step_4/policy/__2_5.safetensors") == 1u);
      if (reference.empty()) {
        reference = files;
      } else {
        BOOST_REQUIRE(files.size() == reference.size());
        for (const auto& [name, bytes] : reference) {
          BOOST_TEST((files[name] == bytes), name << " differs");
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(an_error_in_wave_k_stops_later_waves) {
  TempDir dir;
  auto storage = std::make_shared<test::FaultStorage>();
  storage->fail_file = "__0_3.safetensors";
  storage->fail_errno = ENOSPC;
  auto state = *make_synthetic_state({1, 2u << 20, 24, 9}, 0, Device::host());
  auto engine = *SaveEngine::create(0, {8, 2, false, {}}, storage);
  auto tmp = *prepare_checkpoint_dir(dir.path(), 1);
  auto report = engine->save(state, CheckpointLayout::policy_dir(tmp), 1);
  BOOST_TEST(!report.status.is_ok());
  BOOST_TEST((report.status.code() == ErrorCode::no_space));
  BOOST_TEST(report.status.sys_errno() == ENOSPC);
  BOOST_TEST(report.status.message().find("bucket 3") != std::string::npos);
  BOOST_TEST(report.status.message().find("__0_3.safetensors") != std::string::npos);
  // Waves {0,1} and {2,3} ran; {4,5} and {6,7} never started.
  BOOST_REQUIRE(report.buckets.size() == 4u);
  BOOST_TEST(report.buckets[2].status.is_ok());
  BOOST_TEST(!report.buckets[3].status.is_ok());
  auto created = storage->created();
  BOOST_TEST(created.count("__0_2.safetensors") == 1u);
  for (int b = 4; b < 8; ++b) BOOST_TEST(created.count("__0_" + std::to_string(b) + ".safetensors") == 0u);
}

BOOST_AUTO_TEST_CASE(staging_zero_is_one_wave) {
  TempDir dir;
  auto storage = std::make_shared<test::FaultStorage>();
  storage->fail_file = "__0_0.safetensors";
  auto state = *make_synthetic_state({1, 1u << 20, 12, 9}, 0, Device::host());
  auto engine = *SaveEngine::create(0, {4, 0, false, {}}, storage);
  auto tmp = *prepare_checkpoint_dir(dir.path(), 1);
  auto report = engine->save(state, CheckpointLayout::policy_dir(tmp), 1);
  // One wave: every bucket was attempted although bucket 0 failed, and one error is reported.
  BOOST_TEST(!report.status.is_ok());
  BOOST_TEST(report.buckets.size() == 4u);
  BOOST_TEST(storage->created().size() == 4u);
  BOOST_TEST(report.status.message().find("bucket 0") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(a_failed_rank_commits_nothing) {
  TempDir dir;
  Ranks good(kSpec, {2, 0, false, {}});
  BOOST_REQUIRE(good.save(dir.path(), 1).is_ok());
  auto storage = std::make_shared<test::FaultStorage>();
  storage->fail_file = "__1_1.safetensors";
  Ranks bad(kSpec, {2, 0, false, {}}, storage);
  auto result = bad.save(dir.path(), 2);
  BOOST_TEST(!result.is_ok());
  BOOST_TEST(result.status().message().find("rank 1") != std::string::npos);
  BOOST_TEST(!std::filesystem::exists(dir / "global_step_2"));
  BOOST_TEST(!std::filesystem::exists(dir / "global_step_2.tmp"));
  BOOST_TEST(**read_tracker(dir.path()) == 1);
}

BOOST_AUTO_TEST_CASE(a_rate_limited_backend_paces_writes_and_keeps_their_bytes) {
  BOOST_TEST((rate_limited_storage(local_storage(), 0) == local_storage()));
  test::TempDir dir;
  auto limited = rate_limited_storage(local_storage(), 1024.0 * 1024.0);
  std::string bytes(512u << 10, '\0');
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7);
  auto start = std::chrono::steady_clock::now();
  auto file = limited->open_for_write(dir / "f");
  BOOST_REQUIRE(file.is_ok());
  BOOST_REQUIRE((*file)->append(bytes.data(), bytes.size() / 2).is_ok());
  BOOST_REQUIRE((*file)->write_at(bytes.size() / 2, bytes.data() + bytes.size() / 2, bytes.size() / 2).is_ok());
  BOOST_REQUIRE((*file)->close().is_ok());
  // 512 KiB at 1 MiB/s cannot take less than half a second (sleeping only adds to it).
  BOOST_TEST((std::chrono::steady_clock::now() - start >= std::chrono::milliseconds(450)));
  BOOST_TEST((test::read_file(dir / "f") == bytes));
}
