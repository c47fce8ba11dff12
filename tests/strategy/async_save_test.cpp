#define BOOST_TEST_MODULE async_save
#include <boost/test/unit_test.hpp>

#include <caf/all.hpp>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <thread>

#include "stagehand/actors/checkpoint_coordinator.hpp"
#include "bench/synthetic_state.hpp"
#include "tests/checkpoint_test_util.hpp"
#include "stagehand/checkpoint/load/loader.hpp"
#include "stagehand/checkpoint/load/checkpoint_reader.hpp"
#include "stagehand/checkpoint/load/load_plan.hpp"
#include "stagehand/checkpoint/load/resolve.hpp"
#include "stagehand/checkpoint/load/verify.hpp"
#include "stagehand/storage/default_file_system.hpp"
#include "stagehand/checkpoint/save/stager.hpp"
#include "stagehand/core/foreground_gate.hpp"
#include "stagehand/core/host_buffer.hpp"
#include "stagehand/core/log.hpp"
#include "stagehand/core/priority.hpp"
#include "stagehand/core/thread_pool.hpp"
#include "stagehand/storage/destination.hpp"
#include "stagehand/strategy/async_calls_queue.hpp"
#include "stagehand/strategy/megatron_strategy.hpp"
#include "stagehand/strategy/messages.hpp"
#include "tests/caf_test_util.hpp"
#include "tests/strategy_cluster.hpp"
#include "tests/test_util.hpp"

using namespace stagehand;
using stagehand::test::TempDir;
namespace fs = std::filesystem;

namespace {

const SyntheticStateSpec kSpec{2, 2u << 20, 24, 11};


/// Ranks' states, their strategies, a coordinator, a dispatch and its client, all in this process.
/// `staging_buckets` > 0 with async: the later waves are staged behind the fence.
struct Cluster : test::StrategyCluster {
  Cluster(const std::string& destination, bool async, int threads = 4,
          std::shared_ptr<FileSystem> storage = nullptr, const std::string& work_dir = "/tmp/stagehand-work",
          bool low_priority = true, int staging_buckets = 0)
      : test::StrategyCluster(destination, {kSpec, async, threads, std::move(storage), work_dir, low_priority,
                                            ObjectStoreOptions::from_environment(), staging_buckets}) {}
};

/// Every async guarantee holds with staging waves too: each test below runs with all buckets
/// staged at once (0) and in waves of one bucket of four (1).
constexpr int kStagingModes[] = {0, 1};

void expect_loads_synthetic(const std::string& checkpoint_dir, const SyntheticStateSpec& spec) {
  for (int r = 0; r < spec.ranks; ++r) {
    auto expected = *make_synthetic_state(spec, r, Device::host());
    StateDict loaded = test::zeroed_like(expected);
    Status st = load_checkpoint(checkpoint_dir, loaded);
    BOOST_REQUIRE_MESSAGE(st.is_ok(), st.to_string());
    for (std::size_t i = 0; i < loaded.tensors.size(); ++i) {
      BOOST_TEST(test::same_bytes(loaded.tensors[i].tensor, expected.tensors[i].tensor));
    }
  }
}

std::shared_ptr<test::FaultStorage> slow_storage(int ms) {
  auto storage = std::make_shared<test::FaultStorage>();
  storage->append_delay = std::chrono::milliseconds(ms);
  return storage;
}

}  // namespace

BOOST_AUTO_TEST_CASE(async_and_sync_saves_are_byte_identical) {
  TempDir sync_dir;
  TempDir async_dir;
  {
    Cluster sync(sync_dir.path(), false);
    auto timing = sync.client->save(1, R"({"step": 1})");
    BOOST_REQUIRE_MESSAGE(timing.is_ok(), timing.status().to_string());
    BOOST_TEST(!timing->async);
  }
  {
    Cluster async(async_dir.path(), true);
    auto timing = async.client->save(1, R"({"step": 1})");
    BOOST_REQUIRE_MESSAGE(timing.is_ok(), timing.status().to_string());
    BOOST_TEST(timing->async);
    BOOST_REQUIRE(async.client->finalize().is_ok());
  }
  auto a = test::files_of(sync_dir.path());
  auto b = test::files_of(async_dir.path());
  BOOST_TEST(a.size() == b.size());
  BOOST_TEST(a.count("global_step_1/trainer_state.json") == 1u);
  for (const auto& [name, bytes] : a) BOOST_TEST((b[name] == bytes), name << " differs");
}

BOOST_AUTO_TEST_CASE(the_save_returns_before_the_data_is_on_disk) {
  TempDir dir;
  Cluster cluster(dir.path(), true, 4, slow_storage(100));
  auto timing = cluster.client->save(1);
  BOOST_REQUIRE(timing.is_ok());
  BOOST_TEST(timing->async);
  // The reply came back while the writes are still running: nothing is committed yet.
  BOOST_TEST(fs::exists(dir / "global_step_1.tmp"));
  BOOST_TEST(!fs::exists(dir / "global_step_1"));
  BOOST_TEST(!test::read_tracker(dir.path())->has_value());
  BOOST_REQUIRE(cluster.client->finalize().is_ok());
  BOOST_TEST(**test::read_tracker(dir.path()) == 1);
  expect_loads_synthetic(dir / "global_step_1", kSpec);
}

BOOST_AUTO_TEST_CASE(completion_is_pushed_and_commits_without_a_finalize) {
  TempDir dir;
  Cluster cluster(dir.path(), true, 4, slow_storage(20));
  BOOST_REQUIRE(cluster.client->save(1).is_ok());
  BOOST_TEST(!fs::exists(dir / "global_step_1"));
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!fs::exists(dir / "latest_ckpt_global_step.txt") && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  BOOST_TEST(fs::exists(dir / "global_step_1/policy/metadata.json"));
  BOOST_TEST(**test::read_tracker(dir.path()) == 1);
}

BOOST_AUTO_TEST_CASE(a_second_save_waits_for_the_first_to_commit) {
  for (int staging : kStagingModes) {
  BOOST_TEST_CONTEXT("staging " << staging) {
  TempDir dir;
  auto storage = slow_storage(30);
  std::atomic<int> step2_files{0};
  std::atomic<int> step2_files_before_commit{0};
  storage->on_open = [&](const std::string& path) {
    if (path.find("global_step_2.tmp") == std::string::npos) return;
    ++step2_files;
    if (!fs::exists(dir / "global_step_1/policy/metadata.json")) ++step2_files_before_commit;
  };
  Cluster cluster(dir.path(), true, 4, storage, "/tmp/stagehand-work", true, staging);
  BOOST_REQUIRE(cluster.client->save(1).is_ok());
  BOOST_REQUIRE(cluster.client->save(2).is_ok());
  BOOST_REQUIRE(cluster.client->finalize().is_ok());
  BOOST_TEST(step2_files.load() == 8);
  BOOST_TEST(step2_files_before_commit.load() == 0);
  expect_loads_synthetic(dir / "global_step_1", kSpec);
  expect_loads_synthetic(dir / "global_step_2", kSpec);
  BOOST_TEST(**test::read_tracker(dir.path()) == 2);
  }
  }
}

BOOST_AUTO_TEST_CASE(a_save_sent_straight_to_a_busy_strategy_drains_first) {
  TempDir dir;
  auto storage = slow_storage(30);
  std::atomic<int> open_writes_of_step1{0};
  std::atomic<std::uint64_t> step1_bytes_when_step2_began{0};
  auto step1_bytes = [&] {
    std::uint64_t sum = 0;
    for (const auto& e : fs::directory_iterator(dir / "s1")) sum += fs::file_size(e.path());
    return sum;
  };
  storage->on_open = [&](const std::string& path) {
    if (path.find("/s1/") != std::string::npos) ++open_writes_of_step1;
    if (path.find("/s2/") != std::string::npos && step1_bytes_when_step2_began == 0) {
      step1_bytes_when_step2_began = step1_bytes();
    }
  };
  caf::actor_system system{test::system_config()};
  auto state = std::make_shared<StateDict>(*make_synthetic_state({1, 1u << 20, 8, 3}, 0, Device::host()));
  StrategyOptions options;
  options.thread_count = 2;
  options.async_save = true;
  options.file_system = storage;
  auto strategy = *spawn_megatron_strategy(system, options, state, report_listener_actor{});
  std::vector<std::uint32_t> every(state->tensors.size());
  for (std::uint32_t i = 0; i < every.size(); ++i) every[i] = i;
  fs::create_directories(dir / "s1");
  fs::create_directories(dir / "s2");
  caf::scoped_actor self{system};
  bool async = false;
  self->request(strategy, std::chrono::seconds(60), save_atom::value, SaveOrder{1, true, dir / "s1", every})
      .receive([&](const SaveAck& ack) { async = ack.async; }, [&](caf::error& e) { BOOST_FAIL(caf::to_string(e)); });
  BOOST_TEST(async);
  std::int32_t pending = -1;
  self->request(strategy, std::chrono::seconds(60), stats_atom::value)
      .receive([&](const StrategyStats& stats) { pending = stats.pending_writes; }, [&](caf::error&) {});
  BOOST_TEST(pending == 1);
  self->request(strategy, std::chrono::seconds(60), save_atom::value, SaveOrder{2, true, dir / "s2", every})
      .receive([&](const SaveAck&) {}, [&](caf::error& e) { BOOST_FAIL(caf::to_string(e)); });
  // Step 1's background write ended before step 2 was staged: nothing was pending in between.
  self->request(strategy, std::chrono::seconds(60), stats_atom::value)
      .receive([&](const StrategyStats& stats) {
        BOOST_TEST(stats.pending_writes <= 1);
        BOOST_TEST(stats.saves == 2);
      }, [&](caf::error&) {});
  BOOST_TEST(open_writes_of_step1.load() == 2);
  self->request(strategy, std::chrono::seconds(60), finalize_atom::value).receive([](bool) {}, [](caf::error&) {});
  // When step 2's first file was created, step 1's files already had all their bytes.
  BOOST_TEST(step1_bytes_when_step2_began.load() == step1_bytes());
  BOOST_TEST(step1_bytes() > 0u);
  BOOST_TEST(test::files_of(dir / "s1") == test::files_of(dir / "s2"));
  self->send_exit(strategy, caf::exit_reason::user_shutdown);
}

BOOST_AUTO_TEST_CASE(load_while_a_save_is_pending_drains_first) {
  for (int staging : kStagingModes) {
  BOOST_TEST_CONTEXT("staging " << staging) {
  TempDir dir;
  Cluster cluster(dir.path(), true, 4, slow_storage(50), "/tmp/stagehand-work", true, staging);
  BOOST_REQUIRE(cluster.client->save(3).is_ok());
  // Training goes on and changes the live state after the async save returned (after the fence,
  // which waits only with staging waves).
  BOOST_REQUIRE(cluster.client->fence().is_ok());
  for (auto& state : cluster.states) {
    for (auto& t : state->tensors) std::fill_n(t.tensor.host_data<std::uint8_t>(), t.tensor.nbytes(), 0);
  }
  Status st = cluster.client->load(dir / "global_step_3");
  BOOST_REQUIRE_MESSAGE(st.is_ok(), st.to_string());
  for (int r = 0; r < kSpec.ranks; ++r) {
    auto expected = *make_synthetic_state(kSpec, r, Device::host());
    for (std::size_t i = 0; i < expected.tensors.size(); ++i) {
      BOOST_TEST(test::same_bytes(cluster.states[static_cast<std::size_t>(r)]->tensors[i].tensor,
                                  expected.tensors[i].tensor));
    }
  }
  }
  }
}

BOOST_AUTO_TEST_CASE(teardown_with_a_pending_save_leaves_a_committed_checkpoint) {
  for (int staging : kStagingModes) {
  BOOST_TEST_CONTEXT("staging " << staging) {
  TempDir dir;
  pid_t pid = ::fork();
  if (pid == 0) {
    int code = 0;
    {
      Cluster cluster(dir.path(), true, 4, slow_storage(50), "/tmp/stagehand-work", true, staging);
      auto timing = cluster.client->save(5);
      if (!timing.is_ok() || !timing->async || fs::exists(dir / "global_step_5")) code = 3;
      // Leaving the scope is the teardown: the cluster finalizes, the actors exit.
    }
    ::_exit(code);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  BOOST_REQUIRE(WIFEXITED(status));
  BOOST_REQUIRE(WEXITSTATUS(status) == 0);
  // This process never saw the save: it loads what the exited one left.
  BOOST_TEST(**test::read_tracker(dir.path()) == 5);
  BOOST_TEST(!fs::exists(dir / "global_step_5.tmp"));
  expect_loads_synthetic(*resolve_checkpoint(dir.path()), kSpec);
  }
  }
}

BOOST_AUTO_TEST_CASE(a_failing_background_write_surfaces_at_finalize) {
  for (int staging : kStagingModes) {
  BOOST_TEST_CONTEXT("staging " << staging) {
  TempDir dir;
  auto storage = std::make_shared<test::FaultStorage>();
  Cluster cluster(dir.path(), true, 4, storage, "/tmp/stagehand-work", true, staging);
  BOOST_REQUIRE(cluster.client->save(1).is_ok());
  BOOST_REQUIRE(cluster.client->finalize().is_ok());
  storage->fail_file = "__1_2.safetensors";
  storage->fail_errno = EIO;
  auto timing = cluster.client->save(2);
  BOOST_REQUIRE(timing.is_ok());  // The failure happens in the background.
  Status st = cluster.client->finalize();
  BOOST_TEST(!st.is_ok());
  BOOST_TEST(st.message().find("__1_2.safetensors") != std::string::npos, st.message());
  BOOST_TEST(st.message().find("errno 5") != std::string::npos, st.message());
  BOOST_TEST(!fs::exists(dir / "global_step_2"));
  // The failed step's folder goes once every rank stopped writing into it (their reports may
  // still be on their way when finalize answers).
  for (int i = 0; i < 500 && fs::exists(dir / "global_step_2.tmp"); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  BOOST_TEST(!fs::exists(dir / "global_step_2.tmp"));
  BOOST_TEST(**test::read_tracker(dir.path()) == 1);
  expect_loads_synthetic(dir / "global_step_1", kSpec);
  // Reported once: the next finalize is clean, and a later save works again.
  BOOST_TEST(cluster.client->finalize().is_ok());
  storage->fail_file.clear();
  BOOST_REQUIRE(cluster.client->save(3).is_ok());
  BOOST_REQUIRE(cluster.client->finalize().is_ok());
  BOOST_TEST(**test::read_tracker(dir.path()) == 3);
  }
  }
}

namespace {

/// Storage on which the first rank to ask about the step's folder in a save (before it stages)
/// is held back for 200 ms, and which counts the bucket files opened for writing meanwhile, and
/// while the process's foreground gate is held.
class LateRankStorage final : public FileSystemWrapper {
 public:
  LateRankStorage() : FileSystemWrapper(local_file_system()) {}

  /// Set before a save: its first rank is late.
  mutable std::atomic<bool> armed{false};
  mutable std::atomic<bool> late{false};
  std::atomic<int> opened{0};
  std::atomic<int> opened_while_late{0};
  std::atomic<int> opened_while_held{0};

  FileSystemCapabilities capabilities(const std::string& path) const override {
    if (path.find("/policy") != std::string::npos && armed.exchange(false)) {
      late = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      late = false;
    }
    return inner().capabilities(path);
  }
  Result<std::unique_ptr<WritableFile>> create_file(const std::string& path) override {
    if (path.find(".safetensors") != std::string::npos) {
      ++opened;
      if (late) ++opened_while_late;
      if (foreground_gate().holds() > 0) ++opened_while_held;
    }
    return inner().create_file(path);
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(no_background_write_starts_while_a_caller_waits_for_a_rank_s_staging) {
  // The dispatch holds the process's foreground gate from its fan-out until every rank has
  // staged, and each strategy while it stages: a rank that staged first does not take the cores
  // from a rank still staging, nor from one that has not begun (foreground_gate.hpp).
  const test::GateLimit limit(std::chrono::seconds(60));
  for (int staging : kStagingModes) {
  BOOST_TEST_CONTEXT("staging " << staging) {
  TempDir dir;
  auto storage = std::make_shared<LateRankStorage>();
  Cluster cluster(dir.path(), true, 4, storage, "/tmp/stagehand-work", true, staging);
  for (std::int64_t step = 1; step <= 3; ++step) {
    storage->armed = true;
    auto saved = cluster.client->save(step);
    BOOST_REQUIRE_MESSAGE(saved.is_ok(), saved.status().to_string());
    BOOST_TEST(saved->async);
    BOOST_TEST(saved->stall_s >= 0.2);  // The late rank was waited for.
    BOOST_REQUIRE(cluster.client->finalize().is_ok());
  }
  BOOST_TEST(storage->opened.load() > 0);
  BOOST_TEST(storage->opened_while_late.load() == 0);
  BOOST_TEST(storage->opened_while_held.load() == 0);
  BOOST_TEST(foreground_gate().holds() == 0);
  expect_loads_synthetic(dir / "global_step_3", kSpec);
  }
  }
}

// Issue 15: an async save with staging waves returns after the first wave; the rest is staged
// from the live state in the background, and the fence says when the state may change again.

namespace {

/// Async saves of kSpec in waves of one bucket of four.
test::ClusterOptions waves_of_one() {
  test::ClusterOptions options;
  options.spec = kSpec;
  options.async = true;
  options.threads = 4;
  options.staging_buckets = 1;
  return options;
}

/// Overwrites every byte of every tensor of `state`, as an optimizer step would.
void mutate(StateDict& state) {
  for (auto& t : state.tensors) std::memset(t.tensor.data(), 0xA5, t.tensor.nbytes());
}

/// Whether every rank of the checkpoint equals the synthetic state before any mutation.
bool holds_the_saved_state(const std::string& checkpoint_dir, const SyntheticStateSpec& spec) {
  for (int r = 0; r < spec.ranks; ++r) {
    auto expected = *make_synthetic_state(spec, r, Device::host());
    StateDict loaded = test::zeroed_like(expected);
    if (!load_checkpoint(checkpoint_dir, loaded).is_ok()) return false;
    for (std::size_t i = 0; i < loaded.tensors.size(); ++i) {
      if (!test::same_bytes(loaded.tensors[i].tensor, expected.tensors[i].tensor)) return false;
    }
  }
  return true;
}

/// Saves step 1 async, in waves of one bucket of four, on storage slow enough that the later
/// waves are staged well after the save returned; mutates the state right after the fence
/// (or without one); returns whether the checkpoint holds the pre-mutation bytes.
bool mutated_after_save_keeps_saved_bytes(const std::string& dir, bool fence, double* fence_wait = nullptr) {
  test::ClusterOptions options = waves_of_one();
  options.storage = slow_storage(20);
  test::StrategyCluster cluster(dir, options);
  auto timing = cluster.client->save(1);
  BOOST_REQUIRE_MESSAGE(timing.is_ok(), timing.status().to_string());
  BOOST_TEST(timing->async);
  if (fence) {
    auto waited = cluster.client->fence();
    BOOST_REQUIRE_MESSAGE(waited.is_ok(), waited.status().to_string());
    if (fence_wait != nullptr) *fence_wait = *waited;
  }
  for (auto& state : cluster.states) mutate(*state);
  Status committed = cluster.client->finalize();
  BOOST_REQUIRE_MESSAGE(committed.is_ok(), committed.to_string());
  return holds_the_saved_state(dir + "/global_step_1", kSpec);
}

}  // namespace

BOOST_AUTO_TEST_CASE(state_mutated_after_the_fence_leaves_the_saved_bytes_on_disk) {
  TempDir dir;
  double waited = 0;
  BOOST_TEST(mutated_after_save_keeps_saved_bytes(dir.path(), true, &waited));
  // The later waves were still being staged when the save returned: the fence had to wait.
  BOOST_TEST(waited > 0);
}

BOOST_AUTO_TEST_CASE(state_mutated_without_the_fence_reaches_the_disk) {
  // The control of the test above: without the fence the mutation is staged, so that test can fail.
  TempDir dir;
  BOOST_TEST(!mutated_after_save_keeps_saved_bytes(dir.path(), false));
}

BOOST_AUTO_TEST_CASE(async_staging_waves_hold_at_most_their_buckets_in_host_memory) {
  for (bool per_save : {false, true}) {
    BOOST_TEST_CONTEXT("per_save " << per_save) {
      TempDir dir;
      test::ClusterOptions options = waves_of_one();
      options.per_save = per_save;
      // This process's staging buffers: the cluster's ranks' only.
      const std::size_t before = staging_memory().current();
      test::StrategyCluster cluster(dir.path(), options);
      // Persistent: one slot (of the largest bucket) per rank, allocated at spawn. Per save:
      // nothing until a save, and nothing after it.
      const std::size_t at_spawn = staging_memory().current() - before;
      BOOST_TEST((per_save ? at_spawn == 0u : at_spawn > 0u));
      std::size_t shards = 0;
      for (const auto& state : cluster.states) {
        for (const auto& t : state->tensors) shards += t.tensor.nbytes();
      }
      staging_memory().reset_peak();
      BOOST_REQUIRE(cluster.client->save(1).is_ok());
      BOOST_REQUIRE(cluster.client->finalize().is_ok());
      expect_loads_synthetic(dir / "global_step_1", kSpec);
      BOOST_TEST(staging_memory().current() - before == (per_save ? 0u : at_spawn));
      // One bucket of four per rank, not the whole shard (buckets differ a little in size).
      const std::size_t peak = staging_memory().peak() - before;
      BOOST_TEST(peak < shards * 35 / 100, peak << " bytes staged at most, of " << shards);
    }
  }
}

BOOST_AUTO_TEST_CASE(a_failing_background_wave_surfaces_and_opens_the_fence) {
  TempDir dir;
  auto storage = std::make_shared<test::FaultStorage>();
  storage->fail_file = "__0_3";  // the last wave of rank 0
  test::ClusterOptions options = waves_of_one();
  options.storage = storage;
  test::StrategyCluster cluster(dir.path(), options);
  auto timing = cluster.client->save(1);
  BOOST_REQUIRE_MESSAGE(timing.is_ok(), timing.status().to_string());
  BOOST_TEST(cluster.client->fence().is_ok());
  Status st = cluster.client->finalize();
  BOOST_REQUIRE(!st.is_ok());
  BOOST_TEST(st.message().find("__0_3") != std::string::npos, st.message());
  BOOST_TEST(!fs::exists(dir / "global_step_1"));
  BOOST_TEST(!fs::exists(dir / "latest_ckpt_global_step.txt"));
}

BOOST_AUTO_TEST_CASE(cloud_paths_are_classified) {
  BOOST_TEST((classify_destination("s3://b/p") == DestinationKind::s3));
  BOOST_TEST((classify_destination("gs://b/p") == DestinationKind::gcs));
  BOOST_TEST((classify_destination("gcs://b/p") == DestinationKind::gcs));
  BOOST_TEST((classify_destination("/data/s3://x") == DestinationKind::local));
  BOOST_TEST(!default_file_system()->capabilities("s3://b/p").atomic_rename);
  BOOST_TEST(default_file_system()->capabilities("s3://b/p").uploads);
  BOOST_TEST(default_file_system()->capabilities("/data/s3://x").atomic_rename);
}

BOOST_AUTO_TEST_CASE(writer_threads_run_at_lowered_priority_unless_turned_off) {
  for (bool low : {true, false}) {
    TempDir dir;
    auto storage = std::make_shared<test::FaultStorage>();
    std::atomic<int> lowered{0};
    std::atomic<int> normal{0};
    storage->on_open = [&](const std::string&) {
      if (current_thread_nice() == kWriterNice && current_thread_io_priority() == (2 << 13 | kWriterIoPriorityLevel)) {
        ++lowered;
      } else {
        ++normal;
      }
    };
    Cluster cluster(dir.path(), true, 2, storage, "/tmp/stagehand-work", low);
    BOOST_REQUIRE(cluster.client->save(1).is_ok());
    BOOST_REQUIRE(cluster.client->finalize().is_ok());
    BOOST_TEST(lowered.load() == (low ? 4 : 0));
    BOOST_TEST(normal.load() == (low ? 0 : 4));
  }
}

BOOST_AUTO_TEST_CASE(queue_and_buffers_persist_across_saves) {
  TempDir dir;
  std::size_t before = staging_memory().current();
  Cluster cluster(dir.path(), true, 4);
  // Allocated at spawn, so that the first save's stall does not include the allocation.
  std::size_t at_spawn = staging_memory().current() - before;
  BOOST_TEST(at_spawn > 0u);
  caf::scoped_actor self{cluster.system};
  std::vector<std::uint64_t> staging;
  for (std::int64_t step = 1; step <= 4; ++step) {
    BOOST_REQUIRE(cluster.client->save(step).is_ok());
    BOOST_REQUIRE(cluster.client->finalize().is_ok());
    staging.push_back(staging_memory().current());
  }
  for (auto s : staging) BOOST_TEST(s == staging.front());
  // The first save's global plan moves replicas between ranks: a rank given more takes it from
  // the eighth reserved over its own at spawn (allocating only what is more still), one given
  // less keeps what it holds up to an eighth more than it needs and gives the rest back.
  BOOST_TEST(staging.front() - before >= at_spawn * 8 / 9 * 8 / 9);
  BOOST_TEST(staging.front() - before <= at_spawn + at_spawn / StagingPool::kSlackDivisor);
  BOOST_TEST((test::committed_steps(dir.path()) == std::vector<std::int64_t>{1, 2, 3, 4}));
}

BOOST_AUTO_TEST_CASE(async_calls_queue_hands_each_result_out_once) {
  std::atomic<int> finished{0};
  AsyncCallsQueue queue([&](std::int64_t) { ++finished; });
  for (int i = 0; i < 3; ++i) {
    queue.schedule([i] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      RankSaveReport r;
      r.step = i;
      return r;
    });
  }
  auto results = queue.drain();
  BOOST_TEST(results.size() == 3u);
  BOOST_TEST(results[2].step == 2);
  BOOST_TEST(queue.take_finished().empty());
  BOOST_TEST(queue.pending() == 0);
  BOOST_TEST(finished.load() >= 2);
}
