#define BOOST_TEST_MODULE shm_channel_test
#include <boost/test/unit_test.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <future>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "stagehand/checkpoint/sync/shm_channel.hpp"
#include "stagehand/checkpoint/sync/weight_sync.hpp"
#include "sync_layouts.hpp"

using namespace stagehand;
using namespace stagehand::sync_layouts;
using namespace std::chrono_literals;

namespace {

std::string channel(const std::string& what) { return "test-" + what + "-" + std::to_string(getpid()); }

WeightChannelOptions small_buckets(std::uint64_t bytes = 64) {
  WeightChannelOptions o;
  o.bucket_bytes = bytes;  // many buckets even for the small layouts: the ring wraps
  o.connect_timeout = 20s;
  return o;
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_receiver_gets_exactly_its_blocks_of_each_version_for_each_layout_pair) {
  // Publishers and receivers in threads of this process: the segments are shared memory all the
  // same (the process-level faults are tested below with processes).
  const std::vector<std::array<int, 4>> pairs = {{2, 2, 1, 2}, {2, 2, 4, 1}, {4, 1, 2, 3}, {3, 1, 2, 2}, {1, 1, 1, 3}};
  for (const auto& [tp, dp, itp, replicas] : pairs) {
    BOOST_TEST_CONTEXT("trainer " << tp << "x" << dp << " -> inference " << itp << "x" << replicas) {
      const std::string name = channel("layouts" + std::to_string(tp) + std::to_string(dp) + std::to_string(itp));
      auto senders = layout(tp, dp, true);
      auto receivers = layout(itp, replicas, false);
      std::promise<void> all_received;
      std::shared_future<void> done = all_received.get_future().share();
      std::vector<std::future<std::string>> pubs;
      for (int r = 0; r < tp * dp; ++r) {
        pubs.push_back(std::async(std::launch::async, [&, r] {
          return run_publisher(name, r, senders, receivers, {1, 2}, tp, small_buckets(), done);
        }));
      }
      std::vector<std::future<std::string>> recvs;
      for (int q = 0; q < itp * replicas; ++q) {
        recvs.push_back(std::async(std::launch::async, [&, q]() -> std::string {
          StateDict& state = receivers[static_cast<std::size_t>(q)];
          auto rx = ShmWeightReceiver::connect(name, "gen-" + std::to_string(q), state.descriptors(), small_buckets());
          if (!rx.is_ok()) return rx.status().to_string();
          for (std::int64_t step : {1, 2}) {
            auto got = (*rx)->receive(state, step, 20s);
            if (!got.is_ok()) return got.status().to_string();
            if (*got != step) return "got step " + std::to_string(*got);
            const std::string wrong = first_mismatch(state, step);
            if (!wrong.empty()) return "step " + std::to_string(step) + ": " + wrong;
          }
          return "";
        }));
      }
      for (auto& f : recvs) BOOST_TEST(f.get() == "");
      all_received.set_value();
      for (auto& f : pubs) BOOST_TEST(f.get() == "");
    }
  }
}

BOOST_AUTO_TEST_CASE(a_receiver_killed_mid_push_is_named_and_the_others_get_the_version) {
  const std::string name = channel("killed");
  constexpr std::int64_t rows = 1 << 15;  // ~1.6 MB over 4 KiB buckets: hundreds of buckets
  auto options = small_buckets(4096);
  options.receiver_timeout = 60s;  // only its death ends the wait for the killed one
  auto receiver_process = [&](const std::string& who) -> pid_t {
    const pid_t pid = fork();
    if (pid != 0) return pid;
    StateDict state = rank_state(1, 0, false, 0, rows);
    auto rx = ShmWeightReceiver::connect(name, who, state.descriptors(), options);
    if (!rx.is_ok()) _exit(2);
    auto got = (*rx)->receive(state, 1, 60s);
    if (!got.is_ok() || *got != 1) _exit(3);
    _exit(first_mismatch(state, 1).empty() ? 0 : 4);
  };
  const pid_t survivor = receiver_process("survivor");
  const pid_t victim = receiver_process("victim");
  auto publisher = ShmWeightPublisher::create(name, 0, 1, rank_state(1, 0, true, 1, rows).descriptors(), options);
  BOOST_REQUIRE_MESSAGE(publisher.is_ok(), publisher.status().to_string());
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while ((*publisher)->waiting_receivers() < 2 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  BOOST_REQUIRE_EQUAL((*publisher)->waiting_receivers(), 2);
  // The survivor stopped: the ring (2 buckets) holds the push back at its third bucket, so the
  // victim is inside the version when it is killed; then the survivor goes on.
  kill(survivor, SIGSTOP);
  const StateDict state = rank_state(1, 0, true, 1, rows);
  auto push = std::async(std::launch::async, [&] { return (*publisher)->push(1, state); });
  std::this_thread::sleep_for(300ms);
  BOOST_TEST((push.wait_for(0s) == std::future_status::timeout));  // held back: not done
  kill(victim, SIGKILL);
  int status = 0;
  waitpid(victim, &status, 0);
  kill(survivor, SIGCONT);
  auto report = push.get();
  BOOST_REQUIRE_MESSAGE(report.is_ok(), report.status().to_string());
  BOOST_REQUIRE_EQUAL(report->dropped.size(), 1u);
  BOOST_TEST(report->dropped[0].find("'victim' (pid " + std::to_string(victim) + ") died") != std::string::npos,
             report->dropped[0]);
  BOOST_TEST(report->delivered == std::vector<std::string>{"survivor"});
  waitpid(survivor, &status, 0);
  BOOST_TEST(WIFEXITED(status));
  BOOST_TEST(WEXITSTATUS(status) == 0);  // bit-exact step 1
}

BOOST_AUTO_TEST_CASE(a_slow_receiver_is_dropped_after_the_timeout_and_gets_the_next_version) {
  const std::string name = channel("slow");
  auto options = small_buckets(4096);
  options.receiver_timeout = 300ms;
  constexpr std::int64_t rows = 1 << 12;
  int pipe_fd[2];
  BOOST_REQUIRE(pipe(pipe_fd) == 0);
  const pid_t slow = fork();
  if (slow == 0) {
    close(pipe_fd[0]);
    StateDict state = rank_state(1, 0, false, 0, rows);
    auto rx = ShmWeightReceiver::connect(name, "slow", state.descriptors(), options);
    if (!rx.is_ok()) _exit(2);
    auto first = (*rx)->receive(state, 1, 30s);  // stopped inside it, then dropped
    std::string why = first.is_ok() ? "" : first.status().message();
    if (write(pipe_fd[1], why.data(), why.size()) < 0) _exit(5);
    close(pipe_fd[1]);
    if (first.is_ok()) _exit(3);
    auto second = (*rx)->receive(state, 2, 30s);
    if (!second.is_ok() || *second != 2) _exit(4);
    _exit(first_mismatch(state, 2).empty() ? 0 : 6);
  }
  close(pipe_fd[1]);
  auto publisher = ShmWeightPublisher::create(name, 0, 1, rank_state(1, 0, true, 1, rows).descriptors(), options);
  BOOST_REQUIRE(publisher.is_ok());
  StateDict state = rank_state(1, 0, false, 0, rows);
  auto fast = ShmWeightReceiver::connect(name, "fast", state.descriptors(), options);
  BOOST_REQUIRE(fast.is_ok());
  auto fast_got = std::async(std::launch::async, [&] { return (*fast)->receive(state, 1, 30s); });
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while ((*publisher)->waiting_receivers() < 2 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  BOOST_REQUIRE_EQUAL((*publisher)->waiting_receivers(), 2);
  kill(slow, SIGSTOP);
  const auto began = std::chrono::steady_clock::now();
  auto report = (*publisher)->push(1, rank_state(1, 0, true, 1, rows));
  const auto took = std::chrono::steady_clock::now() - began;
  BOOST_REQUIRE(report.is_ok());
  BOOST_REQUIRE_EQUAL(report->dropped.size(), 1u);
  BOOST_TEST(report->dropped[0].find("'slow' (pid " + std::to_string(slow) + ") took no bucket for 300 ms") !=
                 std::string::npos,
             report->dropped[0]);
  BOOST_TEST(report->delivered == std::vector<std::string>{"fast"});
  BOOST_TEST(took < 10s);  // a limit, not a measure: the push did not wait for the stopped one
  auto got = fast_got.get();
  BOOST_REQUIRE(got.is_ok());
  BOOST_TEST(first_mismatch(state, 1) == "");
  // Woken, the slow one learns why and takes the next version whole.
  kill(slow, SIGCONT);
  char why[512] = {};
  const ssize_t n = read(pipe_fd[0], why, sizeof why - 1);
  BOOST_TEST(n > 0);
  BOOST_TEST(std::string(why).find("dropped receiver 'slow'") != std::string::npos, why);
  const auto again = std::chrono::steady_clock::now() + 20s;
  while ((*publisher)->waiting_receivers() < 1 && std::chrono::steady_clock::now() < again) std::this_thread::sleep_for(1ms);
  auto second = (*publisher)->push(2, rank_state(1, 0, true, 2, rows));
  BOOST_REQUIRE(second.is_ok());
  BOOST_TEST(second->delivered == std::vector<std::string>{"slow"});
  int status = 0;
  waitpid(slow, &status, 0);
  BOOST_TEST(WIFEXITED(status));
  BOOST_TEST(WEXITSTATUS(status) == 0);
}

BOOST_AUTO_TEST_CASE(a_receiver_that_joins_late_gets_the_next_version_and_sees_the_newest_step) {
  const std::string name = channel("late");
  auto publisher = ShmWeightPublisher::create(name, 0, 1, rank_state(1, 0, true, 0).descriptors(), small_buckets());
  BOOST_REQUIRE(publisher.is_ok());
  auto early = (*publisher)->push(5, rank_state(1, 0, true, 5));
  BOOST_REQUIRE(early.is_ok());
  BOOST_TEST(early->delivered.empty());  // nobody was waiting: the push did not wait either
  StateDict state = rank_state(1, 0, false);
  auto rx = ShmWeightReceiver::connect(name, "late", state.descriptors(), small_buckets());
  BOOST_REQUIRE(rx.is_ok());
  BOOST_TEST((*rx)->newest_pushed_step() == 5);
  auto got = std::async(std::launch::async, [&] { return (*rx)->receive(state, 0, 20s); });
  while ((*publisher)->waiting_receivers() < 1) std::this_thread::sleep_for(1ms);
  auto report = (*publisher)->push(6, rank_state(1, 0, true, 6));
  BOOST_REQUIRE(report.is_ok());
  BOOST_TEST(report->delivered == std::vector<std::string>{"late"});
  auto step = got.get();
  BOOST_REQUIRE(step.is_ok());
  BOOST_TEST(*step == 6);
  BOOST_TEST(first_mismatch(state, 6) == "");
  BOOST_TEST((*rx)->newest_pushed_step() == 6);
}

// A push that waits for 2 receivers when 1 comes: it waits the receiver timeout, names the
// shortfall and serves the one that came, which takes the whole version though that came after
// its own receive timeout (it was taken in before); stop() ends a receive at once.
BOOST_AUTO_TEST_CASE(a_push_waits_for_receivers_and_one_taken_in_gets_the_whole_version_past_its_timeout) {
  const std::string name = channel("wait");
  auto options = small_buckets();
  options.receiver_timeout = 300ms;
  auto publisher = ShmWeightPublisher::create(name, 0, 1, rank_state(1, 0, true, 0).descriptors(), options);
  BOOST_REQUIRE(publisher.is_ok());
  StateDict state = rank_state(1, 0, false);
  auto rx = ShmWeightReceiver::connect(name, "only", state.descriptors(), options);
  BOOST_REQUIRE(rx.is_ok());
  auto got = std::async(std::launch::async, [&] { return (*rx)->receive(state, 0, 100ms); });
  while ((*publisher)->waiting_receivers() < 1) std::this_thread::sleep_for(1ms);
  const auto started = std::chrono::steady_clock::now();
  auto report = (*publisher)->push(4, rank_state(1, 0, true, 4), 2);
  BOOST_REQUIRE(report.is_ok());
  BOOST_TEST((std::chrono::steady_clock::now() - started >= 300ms));
  BOOST_TEST(report->delivered == std::vector<std::string>{"only"});
  BOOST_REQUIRE(report->dropped.size() == 1u);
  BOOST_TEST(report->dropped[0].find("1 of the 2 receivers awaited did not wait") != std::string::npos,
             report->dropped[0]);
  auto step = got.get();
  BOOST_REQUIRE_MESSAGE(step.is_ok(), step.status().message());
  BOOST_TEST(*step == 4);
  BOOST_TEST(first_mismatch(state, 4) == "");
  // Nobody to wait for: a push with wait_for 0 does not wait.
  auto quick = (*publisher)->push(5, rank_state(1, 0, true, 5));
  BOOST_REQUIRE(quick.is_ok());
  BOOST_TEST(quick->dropped.empty());
  // stop(): a receive on another thread ends within a few ms, and so does every later one.
  auto waiting = std::async(std::launch::async, [&] { return (*rx)->receive(state, 0, 20s); });
  while ((*publisher)->waiting_receivers() < 1) std::this_thread::sleep_for(1ms);
  const auto stopping = std::chrono::steady_clock::now();
  (*rx)->stop();
  auto stopped = waiting.get();
  BOOST_TEST((std::chrono::steady_clock::now() - stopping < 2s));
  BOOST_REQUIRE(!stopped.is_ok());
  BOOST_TEST(stopped.status().message().find("'only' was stopped") != std::string::npos, stopped.status().message());
  BOOST_TEST(!(*rx)->receive(state, 0, 1s).is_ok());
}

BOOST_AUTO_TEST_CASE(bad_input_and_waits_are_refused_or_bounded_by_name) {
  BOOST_TEST(ShmWeightPublisher::create("a/b", 0, 1, {}).status().message().find("channel name 'a/b'") != std::string::npos);
  BOOST_TEST(ShmWeightPublisher::create("x", 2, 2, {}).status().message().find("trainer rank 2 is outside a world of 2") !=
             std::string::npos);
  auto quick = small_buckets();
  quick.connect_timeout = 50ms;
  auto none = ShmWeightReceiver::connect(channel("nobody"), "r", rank_state(1, 0, false).descriptors(), quick);
  BOOST_REQUIRE(!none.is_ok());
  BOOST_TEST(none.status().message().find("trainer rank 0") != std::string::npos, none.status().message());
  BOOST_TEST(none.status().message().find("did not come up in time") != std::string::npos, none.status().message());
  // A peer rank that never comes: the publisher's wait is bounded and names it.
  auto lonely = ShmWeightPublisher::create(channel("lonely"), 0, 2, rank_state(2, 0, true).descriptors(), quick);
  BOOST_REQUIRE(!lonely.is_ok());
  BOOST_TEST(lonely.status().message().find("trainer rank 1") != std::string::npos, lonely.status().message());

  const std::string name = channel("bad");
  auto publisher = ShmWeightPublisher::create(name, 0, 1, rank_state(1, 0, true).descriptors(), small_buckets());
  BOOST_REQUIRE(publisher.is_ok());
  StateDict extra = rank_state(1, 0, false);
  extra.add_full("lm_head", *Tensor::empty(DType::f32, Shape{4}, Device::host()));
  auto unheld = ShmWeightReceiver::connect(name, "r", extra.descriptors(), small_buckets());
  BOOST_REQUIRE(!unheld.is_ok());
  BOOST_TEST(unheld.status().message().find("receiver 'r''s tensor 'lm_head' is held by no trainer rank") !=
                 std::string::npos,
             unheld.status().message());
  StateDict other;
  other.add_full("qkv", *Tensor::empty(DType::bf16, Shape{kRows, kCols}, Device::host()));
  auto wrong = ShmWeightReceiver::connect(name, "r", other.descriptors(), small_buckets());
  BOOST_TEST(wrong.status().message().find("'qkv' is BF16 [8, 6], the trainer ranks' F32") != std::string::npos,
             wrong.status().message());
  // A receive with nothing pushed ends at its timeout, naming the rank it waited for.
  StateDict state = rank_state(1, 0, false);
  auto rx = ShmWeightReceiver::connect(name, "r", state.descriptors(), small_buckets());
  BOOST_REQUIRE(rx.is_ok());
  auto nothing = (*rx)->receive(state, 0, 50ms);
  BOOST_REQUIRE(!nothing.is_ok());
  BOOST_TEST(nothing.status().message().find("waited in vain for a version of trainer rank 0") != std::string::npos,
             nothing.status().message());
  // A state of another structure than connected with is refused, on both sides.
  BOOST_TEST(!(*rx)->receive(extra, 0, 50ms).is_ok());
  BOOST_TEST((*publisher)->push(1, extra).status().message().find("other tensors or shapes") != std::string::npos);
  // After the publisher is gone, a receive says so at once.
  publisher->reset();
  auto closed = (*rx)->receive(state, 0, 5s);
  BOOST_TEST(closed.status().message().find("trainer rank 0 closed the channel") != std::string::npos,
             closed.status().message());
}
