#define BOOST_TEST_MODULE dispatch
#include <boost/test/unit_test.hpp>

#include <caf/all.hpp>

#include <filesystem>
#include <future>
#include <thread>

#include "stagehand/actors/checkpoint_coordinator.hpp"
#include "stagehand/actors/dispatch_client.hpp"
#include "stagehand/actors/messages.hpp"
#include "stagehand/actors/worker.hpp"
#include "stagehand/actors/worker_dispatch.hpp"
#include "tests/checkpoint_test_util.hpp"
#include "stagehand/checkpoint/load/loader.hpp"
#include "stagehand/checkpoint/load/checkpoint_reader.hpp"
#include "stagehand/checkpoint/load/load_plan.hpp"
#include "stagehand/checkpoint/save/planner.hpp"
#include "stagehand/checkpoint/load/resolve.hpp"
#include "stagehand/checkpoint/load/verify.hpp"
#include "stagehand/storage/default_file_system.hpp"
#include "stagehand/models/bandit_mlp.hpp"
#include "tests/caf_test_util.hpp"
#include "tests/test_util.hpp"

using namespace stagehand;
using stagehand::test::TempDir;
namespace fs = std::filesystem;

namespace {


ModelConfig small_model() {
  ModelConfig m;
  m.hidden = 64;
  m.batch_size = 32;
  return m;
}

/// Workers of a tensor 2 x data 2 world, their dispatch and coordinator.
struct World {
  caf::actor_system system{test::system_config()};
  ParallelLayout layout{2, 2};
  std::vector<worker_actor> workers;
  coordinator_actor coordinator;
  dispatch_actor dispatch;
  bool async;

  /// @param timeout the dispatch's limit, set as trainer.call_timeout_s.
  /// @param coordinator_storage what the coordinator writes through (the step's folder, the
  /// trainer state, metadata.json, the tracker).
  World(const std::string& root, std::shared_ptr<FileSystem> storage, bool async_saves,
        std::chrono::milliseconds timeout = std::chrono::seconds(60),
        std::shared_ptr<FileSystem> coordinator_storage = local_file_system())
      : async(async_saves) {
    // Every limit is the one setting, as stagehand-train sets them.
    coordinator = spawn_checkpoint_coordinator(system, {root, layout.world_size(), std::move(coordinator_storage), timeout});
    auto groups = make_host_groups(layout);
    for (int rank = 0; rank < layout.world_size(); ++rank) {
      auto model = BanditMlp::create(small_model(), 7, layout, rank, groups[static_cast<std::size_t>(rank)]);
      BOOST_REQUIRE(model.is_ok());
      StrategyOptions options;
      options.rank = rank;
      options.thread_count = 2;
      options.async_save = async_saves;
      options.file_system = storage;
      workers.push_back(*spawn_worker(system, std::move(*model), options, coordinator, timeout));
    }
    dispatch = spawn_worker_dispatch(system, workers, coordinator, {timeout, "trainer.call_timeout_s"});
  }

  ~World() {
    for (auto& w : workers) caf::anon_send_exit(w, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(dispatch, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(coordinator, caf::exit_reason::user_shutdown);
  }

  DispatchClient client() { return DispatchClient(system, dispatch, std::chrono::seconds(60)); }

  Status train(std::int64_t step) { return client().train({step, Objective::rl, {}}).status(); }
  Status save(std::int64_t step) {
    return client().save(step, async, "{\"step\": " + std::to_string(step) + "}").status();
  }
  Status finalize() { return client().finalize().status(); }
};

}  // namespace

BOOST_AUTO_TEST_CASE(a_worker_that_dies_during_a_save_fails_it_and_nothing_commits) {
  TempDir dir;
  auto storage = std::make_shared<test::FaultStorage>();
  World world(dir.path(), storage, true);
  BOOST_REQUIRE(world.train(1).is_ok());
  BOOST_REQUIRE(world.save(1).is_ok());
  BOOST_REQUIRE(world.finalize().is_ok());
  BOOST_TEST(**test::read_tracker(dir.path()) == 1);

  BOOST_REQUIRE(world.train(2).is_ok());
  storage->append_delay = std::chrono::milliseconds(300);
  BOOST_REQUIRE(world.save(2).is_ok());  // async: returns while the writes run
  caf::anon_send_exit(world.workers[1], caf::exit_reason::kill);
  Status st = world.finalize();
  BOOST_TEST(!st.is_ok());
  BOOST_TEST(st.message().find("rank 1") != std::string::npos, st.message());
  // Let the killed rank's strategy finish its write: its report must not commit anything.
  std::this_thread::sleep_for(std::chrono::seconds(2));
  BOOST_TEST(!fs::exists(dir / "global_step_2"));
  BOOST_TEST(**test::read_tracker(dir.path()) == 1);
  BOOST_TEST(verify_checkpoint(dir / "global_step_1")->ok());

  // Later calls fail at once, naming the dead rank.
  Status train = world.train(3);
  BOOST_TEST(train.message().find("rank 1 is dead") != std::string::npos, train.message());

  // The previous checkpoint still loads, into a fresh world.
  auto groups = make_host_groups({2, 2});
  std::vector<std::thread> loaders;
  std::vector<Status> loaded(4);
  std::vector<std::unique_ptr<BanditMlp>> models;
  for (int rank = 0; rank < 4; ++rank) {
    models.push_back(std::move(*BanditMlp::create(small_model(), 7, {2, 2}, rank, groups[static_cast<std::size_t>(rank)])));
  }
  for (int rank = 0; rank < 4; ++rank) {
    auto& model = *models[static_cast<std::size_t>(rank)];
    Status s = load_checkpoint(dir / "global_step_1", *model.state());
    loaded[static_cast<std::size_t>(rank)] = s.is_ok() ? model.on_loaded({}, {}) : s;
    BOOST_TEST(loaded[static_cast<std::size_t>(rank)].is_ok(), loaded[static_cast<std::size_t>(rank)].to_string());
    BOOST_TEST(model.optimizer_step() == 1);
  }
}

BOOST_AUTO_TEST_CASE(a_rank_that_stalls_past_the_limit_is_named_with_the_setting) {
  TempDir dir;
  auto storage = std::make_shared<test::FaultStorage>();
  // Rank 2's writes stall for longer than the 1 s limit; the other ranks' do not.
  storage->on_open = [](const std::string& path) {
    if (path.find("/__2_") != std::string::npos) std::this_thread::sleep_for(std::chrono::seconds(2));
  };
  World world(dir.path(), storage, false, std::chrono::seconds(1));
  BOOST_REQUIRE(world.train(1).is_ok());
  Status st = world.save(1);
  BOOST_TEST(st.code() == ErrorCode::timeout, st.to_string());
  BOOST_TEST(st.message().find("rank 2 did not finish the save of step 1 within 1 s (trainer.call_timeout_s)") !=
                 std::string::npos,
             st.message());
  BOOST_TEST(!fs::exists(dir / "global_step_1"));

  // The client's own limit, when it passes first, says how it is set.
  BOOST_REQUIRE(world.train(2).is_ok());
  DispatchClient impatient(world.system, world.dispatch, std::chrono::milliseconds(500),
                           "6 x trainer.call_timeout_s");
  Status client = impatient.save(2, false, "{\"step\": 2}").status();
  BOOST_TEST(client.code() == ErrorCode::timeout, client.to_string());
  BOOST_TEST(client.message().find("the dispatch did not answer within 0.5 s (6 x trainer.call_timeout_s)") !=
                 std::string::npos,
             client.message());
  std::this_thread::sleep_for(std::chrono::seconds(3));  // the stalled writes end
}

BOOST_AUTO_TEST_CASE(the_trainer_state_is_written_at_the_commit_and_a_failed_write_keeps_the_tracker) {
  TempDir dir;
  auto storage = std::make_shared<test::FaultStorage>();
  auto coordinator_storage = std::make_shared<test::FaultStorage>();
  World world(dir.path(), storage, true, std::chrono::seconds(60), coordinator_storage);
  // Every file of step `step` that holds the trainer state, wherever the step is being written.
  auto trainer_state_files = [&](std::int64_t step) {
    std::vector<std::string> found;
    for (const auto& entry : fs::recursive_directory_iterator(dir.path())) {
      const std::string path = entry.path().string();
      if (path.find("global_step_" + std::to_string(step)) != std::string::npos &&
          path.find(kTrainerStateFile) != std::string::npos) {
        found.push_back(path);
      }
    }
    return found;
  };
  BOOST_REQUIRE(world.train(1).is_ok());
  storage->append_delay = std::chrono::milliseconds(300);
  BOOST_REQUIRE(world.save(1).is_ok());  // async: returns while the writes run
  // The stall wrote no file of the coordinator's: the trainer state waits for the commit.
  BOOST_TEST(trainer_state_files(1).empty());
  BOOST_REQUIRE(world.finalize().is_ok());
  BOOST_TEST(**test::read_tracker(dir.path()) == 1);
  BOOST_TEST((trainer_state_files(1) == std::vector<std::string>{dir / "global_step_1/trainer_state.json"}));
  BOOST_TEST(verify_checkpoint(dir / "global_step_1")->ok());

  // A trainer state that cannot be written fails the commit, not the save: the stall never
  // waits on it. The tracker stays, and nothing of the step is left.
  storage->append_delay = std::chrono::milliseconds(0);
  coordinator_storage->fail_file = kTrainerStateFile;
  coordinator_storage->fail_errno = ENOSPC;
  BOOST_REQUIRE(world.train(2).is_ok());
  BOOST_REQUIRE(world.save(2).is_ok());
  Status st = world.finalize();
  BOOST_TEST(!st.is_ok());
  BOOST_TEST(st.message().find("No space left on device") != std::string::npos, st.message());
  BOOST_TEST(st.message().find(kTrainerStateFile) != std::string::npos, st.message());
  BOOST_TEST(**test::read_tracker(dir.path()) == 1);
  BOOST_TEST(trainer_state_files(2).empty());
  BOOST_TEST(!fs::exists(dir / "global_step_2"));
  BOOST_TEST(verify_checkpoint(dir / "global_step_1")->ok());

  // The next save commits.
  coordinator_storage->fail_file.clear();
  BOOST_REQUIRE(world.train(3).is_ok());
  BOOST_REQUIRE(world.save(3).is_ok());
  BOOST_REQUIRE(world.finalize().is_ok());
  BOOST_TEST(**test::read_tracker(dir.path()) == 3);
  BOOST_TEST(verify_checkpoint(dir / "global_step_3")->ok());
}

BOOST_AUTO_TEST_CASE(a_worker_that_dies_during_training_fails_the_call_with_its_rank) {
  TempDir dir;
  World world(dir.path(), local_file_system(), false);
  BOOST_REQUIRE(world.train(1).is_ok());
  caf::anon_send_exit(world.workers[2], caf::exit_reason::kill);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  Status st = world.train(2);
  BOOST_TEST(!st.is_ok());
  BOOST_TEST(st.message().find("rank 2") != std::string::npos, st.message());
  Status save = world.save(2);
  BOOST_TEST(save.message().find("rank 2") != std::string::npos, save.message());
  BOOST_TEST(!fs::exists(dir / "global_step_2"));
}

namespace {

/// Rank `rank` of 2's plan of `step`: rows 4 * rank .. 4 * rank + 3 of an 8 x 16 "w".
LocalPlan half_plan(int rank, std::int64_t step) {
  static std::vector<float> rows(64, 1.0f);
  StateDict state;
  state.add("w", *Tensor::from_blob(rows.data(), DType::f32, Shape{4, 16}, Device::host()), Shape{8, 16},
            Shape{static_cast<std::int64_t>(4 * rank), 0});
  LocalPlan plan;
  plan.rank = rank;
  plan.step = step;
  plan.tensors = state.descriptors();
  plan.signature = structure_signature(plan.tensors);
  return plan;
}

/// Sends rank `rank`'s plan of step 5 to `coordinator` `after` from now, in the background; its
/// answer (ok: an assignment).
std::future<Status> plan_later(caf::actor_system& system, coordinator_actor coordinator, int rank,
                               std::chrono::milliseconds after = {}) {
  return std::async(std::launch::async, [&system, coordinator, rank, after] {
    std::this_thread::sleep_for(after);
    caf::scoped_actor self{system};
    Status st = Status{ErrorCode::internal, "no answer"};
    self->request(coordinator, std::chrono::seconds(30), plan_atom::value, half_plan(rank, 5), std::string())
        .receive([&](WriteAssignment&) { st = Status::ok(); }, [&](caf::error& e) { st = from_caf_error(e); });
    return st;
  });
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_plan_limit_of_a_failed_save_does_not_end_the_save_of_its_step_made_again) {
  // Step 5's first save fails at 0.1 s (rank 1's dispatch aborts it); rank 0 saves it again at
  // 1.1 s and rank 1 plans at 2.6 s, inside the new save's 2 s limit (3.1 s). The first save's
  // limit, at 2 s, once failed the new one ("rank 1 did not begin saving").
  TempDir dir;
  caf::actor_system system{test::system_config()};
  CoordinatorOptions options{dir.path(), 2, local_file_system(), std::chrono::seconds(2)};
  auto coordinator = spawn_checkpoint_coordinator(system, options);
  auto plan = [&](int rank, std::chrono::milliseconds at) { return plan_later(system, coordinator, rank, at); };
  auto first = plan(0, std::chrono::milliseconds(0));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  caf::anon_send(coordinator, abort_atom::value, std::int64_t{5}, std::int32_t{1}, std::string("rank 1 failed"));
  Status failed = first.get();
  BOOST_TEST(failed.message().find("rank 1 failed") != std::string::npos, failed.to_string());
  auto again = plan(0, std::chrono::milliseconds(1000));
  auto late = plan(1, std::chrono::milliseconds(2500));
  Status zero = again.get();
  Status one = late.get();
  BOOST_TEST(zero.is_ok(), zero.to_string());
  BOOST_TEST(one.is_ok(), one.to_string());
  caf::anon_send_exit(coordinator, caf::exit_reason::user_shutdown);
}

BOOST_AUTO_TEST_CASE(a_rank_whose_write_ends_the_drain_of_a_failed_save_hears_its_failure_not_the_new_save) {
  // Ranks in two processes. Rank 0's write of step 5 fails and rank 0 saves it again at once,
  // while rank 1 still writes: that plan waits for the drain. Rank 1's report ends the drain and
  // the new save begins forming; rank 1's await of the failed save then waited for the new save,
  // which waits for rank 1's next plan: both hung until the plan limit.
  TempDir dir;
  caf::actor_system system{test::system_config()};
  auto coordinator = spawn_checkpoint_coordinator(system, {dir.path(), 2, local_file_system(), std::chrono::seconds(20)});
  auto plan = [&](int rank) { return plan_later(system, coordinator, rank); };
  auto zero = plan(0), one = plan(1);
  BOOST_REQUIRE(zero.get().is_ok());
  BOOST_REQUIRE(one.get().is_ok());
  RankSaveReport failed;
  failed.rank = 0;
  failed.step = 5;
  failed.status = Status{ErrorCode::no_space, "no space left on rank 0's disk"};
  caf::anon_send(coordinator, rank_saved_atom::value, failed);
  auto again = plan(0);  // held: rank 1 still writes step 5
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  RankSaveReport written;
  written.rank = 1;
  written.step = 5;
  caf::anon_send(coordinator, rank_saved_atom::value, written);
  const auto start = std::chrono::steady_clock::now();
  Status outcome = Status::ok();
  {
    caf::scoped_actor self{system};
    self->request(coordinator, std::chrono::seconds(10), await_atom::value, std::int64_t{5})
        .receive([&](CommitInfo&) { outcome = Status{ErrorCode::internal, "committed"}; },
                 [&](caf::error& e) { outcome = from_caf_error(e); });
  }
  BOOST_TEST(outcome.message().find("no space left on rank 0's disk") != std::string::npos, outcome.to_string());
  BOOST_TEST((std::chrono::steady_clock::now() - start < std::chrono::seconds(2)));
  // Rank 1 saves step 5 again too: the held plan forms with it.
  auto one_again = plan(1);
  Status zero_again = again.get();
  BOOST_TEST(zero_again.is_ok(), zero_again.to_string());
  BOOST_TEST(one_again.get().is_ok());
  caf::anon_send_exit(coordinator, caf::exit_reason::user_shutdown);
}
