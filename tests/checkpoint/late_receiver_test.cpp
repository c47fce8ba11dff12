#define BOOST_TEST_MODULE late_receiver_test
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "stagehand/checkpoint/sync/weight_channel.hpp"
#include "stagehand/core/staging_fence.hpp"
#include "sync_layouts.hpp"
#include "tests/test_util.hpp"

// A receiver that joins after a push gets that version, the newest, while the trainer's weights
// are still that version (serve_late_receivers, what a Worker runs after each push until its
// optimizer step waits at the fence), over both transports and from two trainer ranks.

using namespace stagehand;
using namespace stagehand::sync_layouts;
using namespace std::chrono_literals;

namespace {

WeightChannelOptions options() {
  WeightChannelOptions o;
  o.bucket_bytes = 256;
  o.receiver_timeout = 5s;
  o.connect_timeout = 20s;
  return o;
}

void wait_until(const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (!done() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  BOOST_REQUIRE(done());
}

struct Rank {
  std::unique_ptr<WeightPublisher> publisher;
  StateDict state;
  StagingFence fence;
  std::atomic<bool> stop{false};
  std::mutex mutex;
  std::vector<PushReport> reports;
  std::future<Status> serving;

  ~Rank() { stop = true; }  // a failed check ends serving before the future's destructor waits for it

  /// Pushes trainer rank `r`'s state of `step` with the fence closed (the weights stay that
  /// step's), then serves late receivers, as a Worker does.
  Result<PushReport> publish(int r, int world, std::int64_t step) {
    state = rank_state(world, r, true, step);
    fence.close();
    auto report = publisher->push(step, state);
    serve(step);
    return report;
  }

  void serve(std::int64_t step) {
    stop = false;
    serving = std::async(std::launch::async, [this, step] {
      return serve_late_receivers(*publisher, step, state, fence, stop, [this](const PushReport& r) {
        std::lock_guard<std::mutex> lock(mutex);
        reports.push_back(r);
      });
    });
  }
};

void late_receivers_get_the_newest_version(const std::string& channel) {
  constexpr int kWorld = 2;
  std::vector<std::unique_ptr<Rank>> ranks;
  for (int r = 0; r < kWorld; ++r) ranks.push_back(std::make_unique<Rank>());
  {
    std::vector<std::future<Result<std::unique_ptr<WeightPublisher>>>> made;
    for (int r = 0; r < kWorld; ++r) {
      made.push_back(std::async(std::launch::async, [&, r] {
        return open_weight_publisher(channel, r, kWorld, rank_state(kWorld, r, true, 0).descriptors(), options());
      }));
    }
    for (int r = 0; r < kWorld; ++r) {
      auto p = made[static_cast<std::size_t>(r)].get();
      BOOST_REQUIRE_MESSAGE(p.is_ok(), p.status().message());
      ranks[static_cast<std::size_t>(r)]->publisher = std::move(*p);
    }
  }
  // Step 3 is pushed while no receiver is there; the fence stays closed (the weights are step 3's).
  for (int r = 0; r < kWorld; ++r) {
    auto report = ranks[static_cast<std::size_t>(r)]->publish(r, kWorld, 3);
    BOOST_REQUIRE(report.is_ok());
    BOOST_TEST(report->delivered.empty());
  }
  // A receiver waiting for the next step is not late: no serving push of step 3 takes it in.
  StateDict next_state = rank_state(1, 0, false);
  auto next = connect_weight_receiver(channel, "next", next_state.descriptors(), options());
  BOOST_REQUIRE(next.is_ok());
  auto next_got = std::async(std::launch::async, [&] { return (*next)->receive(next_state, 4, 20s); });
  for (auto& k : ranks) {
    wait_until([&] { return k->publisher->waiting_receivers() == 1; });
    BOOST_TEST(k->publisher->late_receivers(3) == 0);
    BOOST_TEST(k->publisher->late_receivers(4) == 1);
  }
  // A receiver joining now gets step 3 from both ranks at once, not at the next push; the serving
  // push takes in only it (not the one waiting for step 4).
  StateDict late_state = rank_state(1, 0, false);
  auto late = connect_weight_receiver(channel, "late", late_state.descriptors(), options());
  BOOST_REQUIRE_MESSAGE(late.is_ok(), late.status().message());
  auto got = (*late)->receive(late_state, 0, 10s);
  BOOST_REQUIRE_MESSAGE(got.is_ok(), got.status().message());
  BOOST_TEST(*got == 3);
  BOOST_TEST(first_mismatch(late_state, 3) == "");
  for (auto& k : ranks) {
    wait_until([&] {
      std::lock_guard<std::mutex> lock(k->mutex);
      return k->reports.size() == 1u;
    });
    std::lock_guard<std::mutex> lock(k->mutex);
    BOOST_TEST(k->reports[0].step == 3);
    BOOST_TEST(k->reports[0].delivered == std::vector<std::string>{"late"});
    BOOST_TEST(k->reports[0].dropped.empty());
  }
  // Asking again for anything, it is not served step 3 a second time: it has it.
  auto twice = (*late)->receive(late_state, 0, 300ms);
  BOOST_TEST(!twice.is_ok());
  BOOST_TEST(twice.status().code() == ErrorCode::timeout, twice.status().message());
  BOOST_TEST((next_got.wait_for(0ms) == std::future_status::timeout));
  for (auto& k : ranks) {
    std::lock_guard<std::mutex> lock(k->mutex);
    BOOST_TEST(k->reports.size() == 1u);
  }
  // The optimizer step waits at the fence: serving ends at once and the fence opens.
  for (auto& k : ranks) {
    auto waiting = std::async(std::launch::async, [&] { return k->fence.wait(); });
    BOOST_TEST((k->serving.wait_for(2s) == std::future_status::ready));
    k->stop = true;  // should serving not have ended, so that the checks below end
    BOOST_TEST(k->serving.get().is_ok());
    k->fence.open();  // what the Worker's push thread does once serving ended
    BOOST_TEST((waiting.wait_for(2s) == std::future_status::ready));
  }
  // Step 4: the waiting receiver gets it; serving step 4 ends when it is stopped (the next export).
  for (int r = 0; r < kWorld; ++r) {
    auto report = ranks[static_cast<std::size_t>(r)]->publish(r, kWorld, 4);
    BOOST_REQUIRE(report.is_ok());
    BOOST_TEST(report->delivered == std::vector<std::string>{"next"});
  }
  auto step = next_got.get();
  BOOST_REQUIRE_MESSAGE(step.is_ok(), step.status().message());
  BOOST_TEST(*step == 4);
  BOOST_TEST(first_mismatch(next_state, 4) == "");
  // The first receiver, back for anything newer than what it has, now gets step 4 at once too.
  auto again = (*late)->receive(late_state, 4, 10s);
  BOOST_REQUIRE_MESSAGE(again.is_ok(), again.status().message());
  BOOST_TEST(*again == 4);
  BOOST_TEST(first_mismatch(late_state, 4) == "");
  for (auto& k : ranks) {
    k->stop = true;
    BOOST_TEST((k->serving.wait_for(2s) == std::future_status::ready));
    BOOST_TEST(k->serving.get().is_ok());
    k->fence.open();
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(over_shared_memory) {
  late_receivers_get_the_newest_version("test-late-" + std::to_string(getpid()));
}

BOOST_AUTO_TEST_CASE(over_tcp) {
  late_receivers_get_the_newest_version("tcp://127.0.0.1:" + std::to_string(test::free_port()));
}

BOOST_AUTO_TEST_CASE(a_fence_tells_a_reader_someone_waits) {
  StagingFence fence;
  BOOST_TEST(!fence.wait_for_waiter(10ms));  // nobody waits
  fence.close();
  BOOST_TEST(!fence.wait_for_waiter(10ms));
  auto waiting = std::async(std::launch::async, [&] { return fence.wait(); });
  BOOST_TEST(fence.wait_for_waiter(5s));
  BOOST_TEST((waiting.wait_for(50ms) == std::future_status::timeout));  // still closed
  fence.open();
  BOOST_TEST(waiting.get() >= 0.0);
  BOOST_TEST(!fence.wait_for_waiter(10ms));  // the waiter left
}
