// BackgroundSteps: the trainer's exports and uploads wait for their jobs only as long as the
// jobs move, and a job that hangs is left behind without a wait.
#define BOOST_TEST_MODULE background_steps
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "stagehand/trainers/background_steps.hpp"

using namespace stagehand;
using namespace std::chrono_literals;

namespace {

struct NoReport {};
using Steps = BackgroundSteps<NoReport>;

/// A latch a hung job waits on, shared with the job so that it outlives the BackgroundSteps.
struct Latch {
  std::mutex mutex;
  std::condition_variable cv;
  bool open = false;
  bool job_ended = false;
  void release() {
    {
      std::lock_guard lock(mutex);
      open = true;
    }
    cv.notify_all();
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(a_job_that_keeps_moving_is_waited_for_past_the_still_limit) {
  // 30 pieces 20 ms apart: 600 ms in all, four times the still limit, never 150 ms without a piece.
  Steps steps("the test job", [](std::int64_t, const std::string&, const std::string&, JobControl& control, NoReport&) {
    for (int i = 0; i < 30; ++i) {
      if (control.piece()) return Status{ErrorCode::aborted, "stopped"};
      std::this_thread::sleep_for(20ms);
    }
    return Status::ok();
  });
  steps.enqueue(7, "in", "out");
  steps.enqueue(8, "in", "out");
  const auto stalled = steps.wait_idle(150ms);
  BOOST_TEST(!stalled.has_value());
  const auto done = steps.take_done();
  BOOST_REQUIRE(done.size() == 2u);
  BOOST_TEST(done[0].status.is_ok());
  BOOST_TEST(done[1].step == 8);
}

BOOST_AUTO_TEST_CASE(a_hung_job_is_named_by_the_wait_and_left_behind_by_the_stop) {
  auto latch = std::make_shared<Latch>();
  const auto start = std::chrono::steady_clock::now();
  {
    Steps steps("the test job",
                [latch](std::int64_t, const std::string&, const std::string&, JobControl& control, NoReport&) {
                  for (int i = 0; i < 3; ++i) (void)control.piece();
                  // A call that does not return (a hung mount), whatever the stop request says.
                  std::unique_lock lock(latch->mutex);
                  latch->cv.wait(lock, [&] { return latch->open; });
                  latch->job_ended = true;
                  return Status::ok();
                });
    steps.enqueue(10, "in", "out");
    steps.enqueue(20, "in", "out");
    const auto stalled = steps.wait_idle(200ms);
    BOOST_REQUIRE(stalled.has_value());
    BOOST_TEST(*stalled == 10);
    // Found stalled and not moved since: the stop does not wait its limit for it.
    const auto stopped = steps.stop(30s);
    BOOST_TEST(stopped.left_running == 10);
    BOOST_TEST((stopped.dropped == std::vector<std::int64_t>{20}));
    BOOST_TEST(steps.stopping());
    BOOST_TEST(steps.take_done().empty());
    // Leaving the scope destroys `steps` without waiting for the job.
  }
  BOOST_TEST((std::chrono::steady_clock::now() - start < 5s));
  // The job, left behind, still runs on what it owns and ends once its call returns.
  latch->release();
  for (int i = 0; i < 500; ++i) {
    {
      std::lock_guard lock(latch->mutex);
      if (latch->job_ended) break;
    }
    std::this_thread::sleep_for(10ms);
  }
  std::lock_guard lock(latch->mutex);
  BOOST_TEST(latch->job_ended);
}

BOOST_AUTO_TEST_CASE(a_stop_ends_a_moving_job_at_its_next_piece_and_drops_the_queued_ones) {
  std::atomic<int> started{0};
  Steps steps("the test job", [&started](std::int64_t, const std::string&, const std::string&, JobControl& control,
                                         NoReport&) {
    ++started;
    for (;;) {
      if (control.piece()) return Status{ErrorCode::aborted, "stopped"};
      std::this_thread::sleep_for(5ms);
    }
  });
  steps.enqueue(1, "in", "out");
  steps.enqueue(2, "in", "out");
  while (started.load() == 0) std::this_thread::sleep_for(1ms);
  const auto stopped = steps.stop(10s);
  BOOST_TEST(stopped.left_running == -1);
  BOOST_TEST((stopped.dropped == std::vector<std::int64_t>{2}));
  const auto done = steps.take_done();
  BOOST_REQUIRE(done.size() == 1u);
  BOOST_TEST(done[0].step == 1);
  BOOST_TEST((done[0].status.code() == ErrorCode::aborted));
  BOOST_TEST(started.load() == 1);
}

BOOST_AUTO_TEST_CASE(a_signal_flag_stops_the_jobs) {
  std::atomic<bool> signal{false};
  Steps steps(
      "the test job",
      [](std::int64_t, const std::string&, const std::string&, JobControl& control, NoReport&) {
        for (;;) {
          if (control.piece()) return Status{ErrorCode::aborted, "stopped"};
          std::this_thread::sleep_for(5ms);
        }
      },
      &signal);
  steps.enqueue(3, "in", "out");
  std::this_thread::sleep_for(30ms);
  BOOST_TEST(!steps.stopping());
  signal = true;
  BOOST_TEST(!steps.wait_idle(5s).has_value());
  BOOST_TEST(steps.stopping());
  const auto done = steps.take_done();
  BOOST_REQUIRE(done.size() == 1u);
  BOOST_TEST((done[0].status.code() == ErrorCode::aborted));
}
