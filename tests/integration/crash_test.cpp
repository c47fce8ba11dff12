#define BOOST_TEST_MODULE crash
#include <boost/test/unit_test.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "bench/synthetic_state.hpp"
#include "tests/checkpoint_test_util.hpp"
#include "stagehand/checkpoint/save/in_process_save.hpp"
#include "stagehand/checkpoint/load/loader.hpp"
#include "stagehand/checkpoint/load/checkpoint_reader.hpp"
#include "stagehand/checkpoint/load/load_plan.hpp"
#include "stagehand/checkpoint/load/resolve.hpp"
#include "stagehand/checkpoint/load/verify.hpp"
#include "stagehand/storage/default_file_system.hpp"
#include "tests/test_util.hpp"

using namespace stagehand;
using stagehand::test::TempDir;
namespace fs = std::filesystem;

BOOST_AUTO_TEST_CASE(sigkill_during_a_save_keeps_the_previous_checkpoint) {
  TempDir dir;
  const SyntheticStateSpec spec{2, 4u << 20, 24, 7};
  const SyntheticStateSpec next{2, 4u << 20, 24, 8};
  pid_t pid = ::fork();
  if (pid == 0) {
    // Child: commit step 1, then start a slow step 2 and get killed in the middle of it.
    auto storage = std::make_shared<test::FaultStorage>();
    std::vector<StateDict> states;
    std::vector<std::unique_ptr<SaveEngine>> engines;
    std::vector<SaveEngine*> e;
    std::vector<const StateDict*> s;
    for (int r = 0; r < 2; ++r) {
      states.push_back(*make_synthetic_state(spec, r, Device::host()));
      engines.push_back(*SaveEngine::create(r, {4, 1, false, {}}, storage));
    }
    for (int r = 0; r < 2; ++r) {
      e.push_back(engines[static_cast<std::size_t>(r)].get());
      s.push_back(&states[static_cast<std::size_t>(r)]);
    }
    if (!save_checkpoint_in_process(dir.path(), 1, e, s).is_ok()) ::_exit(3);
    for (int r = 0; r < 2; ++r) states[static_cast<std::size_t>(r)] = *make_synthetic_state(next, r, Device::host());
    storage->append_delay = std::chrono::milliseconds(200);
    (void)save_checkpoint_in_process(dir.path(), 2, e, s);
    ::_exit(4);  // Not reached when the parent kills us in time.
  }
  // Parent: wait until step 2's files are being written, then SIGKILL.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  std::string partial = dir / "global_step_2.tmp/policy/__1_0.safetensors";
  while (!fs::exists(partial) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  BOOST_REQUIRE_MESSAGE(fs::exists(partial), "the child never started writing step 2");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  BOOST_REQUIRE(WIFSIGNALED(status));

  BOOST_TEST(fs::exists(dir / "global_step_2.tmp"));
  BOOST_TEST(!fs::exists(dir / "global_step_2"));
  BOOST_TEST(**test::read_tracker(dir.path()) == 1);
  auto resolved = resolve_checkpoint(dir.path());
  BOOST_REQUIRE(resolved.is_ok());
  BOOST_TEST(*resolved == dir / "global_step_1");
  BOOST_TEST((test::committed_steps(dir.path()) == std::vector<std::int64_t>{1}));
  BOOST_TEST(verify_checkpoint(*resolved)->ok());
  for (int r = 0; r < 2; ++r) {
    auto expected = *make_synthetic_state(spec, r, Device::host());
    StateDict loaded = test::zeroed_like(expected);
    BOOST_REQUIRE(load_checkpoint(*resolved, loaded).is_ok());
    for (std::size_t i = 0; i < loaded.tensors.size(); ++i) {
      BOOST_TEST(test::same_bytes(loaded.tensors[i].tensor, expected.tensors[i].tensor));
    }
  }
  BOOST_TEST(*test::clean_stale_tmp_dirs(dir.path()) == 1);
  BOOST_TEST(!fs::exists(dir / "global_step_2.tmp"));
}
