#define BOOST_TEST_MODULE tcp_channel_test
#include <boost/test/unit_test.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <future>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "stagehand/checkpoint/sync/tcp_channel.hpp"
#include "stagehand/checkpoint/sync/tcp_wire.hpp"
#include "stagehand/checkpoint/sync/weight_channel.hpp"
#include "stagehand/checkpoint/sync/weight_sync.hpp"
#include "sync_layouts.hpp"
#include "tests/test_util.hpp"

using namespace stagehand;
using namespace stagehand::sync_layouts;
using namespace std::chrono_literals;

namespace {

std::string address() { return "127.0.0.1:" + std::to_string(test::free_port()); }

WeightChannelOptions small_buckets(std::uint64_t bytes = 64) {
  WeightChannelOptions o;
  o.bucket_bytes = bytes;  // the receivers' scratch bucket: column-split parts go through it in many pieces
  o.connect_timeout = 20s;
  return o;
}

void wait_until_waiting(TcpWeightPublisher& publisher, int n) {
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (publisher.waiting_receivers() < n && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  BOOST_REQUIRE_EQUAL(publisher.waiting_receivers(), n);
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_receiver_gets_exactly_its_blocks_of_each_version_for_each_layout_pair) {
  const std::vector<std::array<int, 4>> pairs = {{2, 2, 1, 2}, {2, 2, 4, 1}, {4, 1, 2, 3}, {3, 1, 2, 2}, {1, 1, 1, 3}};
  for (const auto& [tp, dp, itp, replicas] : pairs) {
    BOOST_TEST_CONTEXT("trainer " << tp << "x" << dp << " -> inference " << itp << "x" << replicas) {
      const std::string channel = "tcp://" + address();
      auto senders = layout(tp, dp, true);
      auto receivers = layout(itp, replicas, false);
      std::promise<void> all_received;
      std::shared_future<void> done = all_received.get_future().share();
      std::vector<std::future<std::string>> pubs;
      for (int r = 0; r < tp * dp; ++r) {
        pubs.push_back(std::async(std::launch::async, [&, r] {
          return run_publisher(channel, r, senders, receivers, {1, 2}, tp, small_buckets(), done);
        }));
      }
      std::vector<std::future<std::string>> recvs;
      for (int q = 0; q < itp * replicas; ++q) {
        recvs.push_back(std::async(std::launch::async, [&, q]() -> std::string {
          StateDict& state = receivers[static_cast<std::size_t>(q)];
          auto rx = connect_weight_receiver(channel, "gen-" + std::to_string(q), state.descriptors(), small_buckets());
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

BOOST_AUTO_TEST_CASE(each_rank_sends_only_the_bytes_its_receivers_need) {
  // Trainer tensor 2: a receiver of rank 1's rows of "qkv" only connects to rank 1 and is sent
  // exactly those rows (a row split lands whole in the receiver: read straight into its tensor).
  const std::string channel = "tcp://" + address();
  auto senders = layout(2, 1, true, 3);
  auto p0 = std::async(std::launch::async, [&] {
    return TcpWeightPublisher::create(channel.substr(6), 0, 2, senders[0].descriptors(), small_buckets());
  });
  auto p1 = TcpWeightPublisher::create(channel.substr(6), 1, 2, senders[1].descriptors(), small_buckets());
  BOOST_REQUIRE_MESSAGE(p1.is_ok(), p1.status().to_string());
  auto pub0 = p0.get();
  BOOST_REQUIRE_MESSAGE(pub0.is_ok(), pub0.status().to_string());
  StateDict half;
  half.add("qkv", *Tensor::empty(DType::f32, Shape{kRows / 2, kCols}, Device::host()), Shape{kRows, kCols},
           Shape{kRows / 2, 0});
  auto rx = TcpWeightReceiver::connect(channel.substr(6), "half", half.descriptors(), small_buckets());
  BOOST_REQUIRE_MESSAGE(rx.is_ok(), rx.status().to_string());
  auto got = std::async(std::launch::async, [&] { return (*rx)->receive(half, 3, 20s); });
  wait_until_waiting(**p1, 1);
  BOOST_TEST((*pub0)->waiting_receivers() == 0);  // rank 0 holds none of it: never asked
  auto report = (*p1)->push(3, senders[1]);
  BOOST_REQUIRE(report.is_ok());
  BOOST_TEST(report->delivered == std::vector<std::string>{"half"});
  auto step = got.get();
  BOOST_REQUIRE_MESSAGE(step.is_ok(), step.status().to_string());
  BOOST_TEST(*step == 3);
  BOOST_TEST(first_mismatch(half, 3) == "");
}

BOOST_AUTO_TEST_CASE(a_receiver_killed_mid_push_is_named_and_the_others_get_the_version) {
  const std::string at = address();
  constexpr std::int64_t rows = 1 << 20;  // 48 MB: more than the sockets' buffers hold
  auto options = small_buckets(1 << 16);
  options.receiver_timeout = 60s;  // only its death ends the wait for the killed one
  auto receiver_process = [&](const std::string& who) -> pid_t {
    const pid_t pid = fork();
    if (pid != 0) return pid;
    StateDict state = rank_state(1, 0, false, 0, rows);
    auto rx = TcpWeightReceiver::connect(at, who, state.descriptors(), options);
    if (!rx.is_ok()) _exit(2);
    auto got = (*rx)->receive(state, 1, 60s);
    if (!got.is_ok() || *got != 1) _exit(3);
    _exit(first_mismatch(state, 1).empty() ? 0 : 4);
  };
  auto publisher = TcpWeightPublisher::create(at, 0, 1, rank_state(1, 0, true, 1, rows).descriptors(), options);
  BOOST_REQUIRE_MESSAGE(publisher.is_ok(), publisher.status().to_string());
  const pid_t survivor = receiver_process("survivor");
  const pid_t victim = receiver_process("victim");
  wait_until_waiting(**publisher, 2);
  // Both stopped: the push fills their sockets and waits; the victim dies inside the version.
  kill(survivor, SIGSTOP);
  kill(victim, SIGSTOP);
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
  BOOST_TEST(report->dropped[0].find("'victim' (pid " + std::to_string(victim) + " on 127.0.0.1)") != std::string::npos,
             report->dropped[0]);
  BOOST_TEST(report->dropped[0].find("mid-version") != std::string::npos, report->dropped[0]);
  BOOST_TEST(report->delivered == std::vector<std::string>{"survivor"});
  waitpid(survivor, &status, 0);
  BOOST_TEST(WIFEXITED(status));
  BOOST_TEST(WEXITSTATUS(status) == 0);  // bit-exact step 1
}

BOOST_AUTO_TEST_CASE(a_slow_receiver_is_dropped_after_the_timeout_and_gets_the_next_version) {
  const std::string at = address();
  auto options = small_buckets(4096);
  options.receiver_timeout = 300ms;
  constexpr std::int64_t rows = 1 << 19;  // 24 MB
  int pipe_fd[2];
  BOOST_REQUIRE(pipe(pipe_fd) == 0);
  auto publisher = TcpWeightPublisher::create(at, 0, 1, rank_state(1, 0, true, 1, rows).descriptors(), options);
  BOOST_REQUIRE(publisher.is_ok());
  const pid_t slow = fork();
  if (slow == 0) {
    close(pipe_fd[0]);
    StateDict state = rank_state(1, 0, false, 0, rows);
    auto rx = TcpWeightReceiver::connect(at, "slow", state.descriptors(), options);
    if (!rx.is_ok()) _exit(2);
    auto first = (*rx)->receive(state, 1, 30s);  // stopped inside it, then dropped
    std::string why = first.is_ok() ? "" : first.status().message();
    if (write(pipe_fd[1], why.data(), why.size()) < 0) _exit(5);
    close(pipe_fd[1]);
    if (first.is_ok()) _exit(3);
    auto second = (*rx)->receive(state, 2, 30s);  // connects again
    if (!second.is_ok() || *second != 2) _exit(4);
    _exit(first_mismatch(state, 2).empty() ? 0 : 6);
  }
  close(pipe_fd[1]);
  StateDict state = rank_state(1, 0, false, 0, rows);
  auto fast = TcpWeightReceiver::connect(at, "fast", state.descriptors(), options);
  BOOST_REQUIRE(fast.is_ok());
  auto fast_got = std::async(std::launch::async, [&] { return (*fast)->receive(state, 1, 30s); });
  wait_until_waiting(**publisher, 2);
  kill(slow, SIGSTOP);
  const auto began = std::chrono::steady_clock::now();
  auto report = (*publisher)->push(1, rank_state(1, 0, true, 1, rows));
  const auto took = std::chrono::steady_clock::now() - began;
  BOOST_REQUIRE(report.is_ok());
  BOOST_REQUIRE_EQUAL(report->dropped.size(), 1u);
  BOOST_TEST(report->dropped[0].find("'slow' (pid " + std::to_string(slow) + " on 127.0.0.1) took no bucket for 300 ms") !=
                 std::string::npos,
             report->dropped[0]);
  BOOST_TEST(report->delivered == std::vector<std::string>{"fast"});
  BOOST_TEST(took < 10s);  // a limit, not a measure: the push did not wait for the stopped one
  auto got = fast_got.get();
  BOOST_REQUIRE(got.is_ok());
  BOOST_TEST(first_mismatch(state, 1) == "");
  kill(slow, SIGCONT);
  char why[512] = {};
  const ssize_t n = read(pipe_fd[0], why, sizeof why - 1);
  BOOST_TEST(n > 0);
  BOOST_TEST(std::string(why).find("dropped receiver 'slow'") != std::string::npos, why);
  wait_until_waiting(**publisher, 1);
  auto second = (*publisher)->push(2, rank_state(1, 0, true, 2, rows));
  BOOST_REQUIRE(second.is_ok());
  BOOST_TEST(second->delivered == std::vector<std::string>{"slow"});
  int status = 0;
  waitpid(slow, &status, 0);
  BOOST_TEST(WIFEXITED(status));
  BOOST_TEST(WEXITSTATUS(status) == 0);
}

BOOST_AUTO_TEST_CASE(waits_for_receivers_takes_in_past_the_timeout_sees_the_newest_step_and_stops) {
  const std::string at = address();
  auto options = small_buckets();
  options.receiver_timeout = 300ms;
  auto publisher = TcpWeightPublisher::create(at, 0, 1, rank_state(1, 0, true, 0).descriptors(), options);
  BOOST_REQUIRE(publisher.is_ok());
  auto early = (*publisher)->push(3, rank_state(1, 0, true, 3));
  BOOST_REQUIRE(early.is_ok());
  BOOST_TEST(early->delivered.empty());  // nobody was waiting: the push did not wait either
  StateDict state = rank_state(1, 0, false);
  auto rx = TcpWeightReceiver::connect(at, "only", state.descriptors(), options);
  BOOST_REQUIRE(rx.is_ok());
  BOOST_TEST((*rx)->newest_pushed_step() == 3);
  auto got = std::async(std::launch::async, [&] { return (*rx)->receive(state, 0, 100ms); });
  wait_until_waiting(**publisher, 1);
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
  BOOST_TEST((*rx)->newest_pushed_step() == 4);
  // A receive nobody serves ends at its timeout, naming the rank; the next one still works.
  auto nothing = (*rx)->receive(state, 0, 50ms);
  BOOST_REQUIRE(!nothing.is_ok());
  BOOST_TEST(nothing.status().message().find("waited in vain for a version of trainer rank 0 (" + at + ")") !=
                 std::string::npos,
             nothing.status().message());
  auto again = std::async(std::launch::async, [&] { return (*rx)->receive(state, 5, 20s); });
  wait_until_waiting(**publisher, 1);
  BOOST_REQUIRE((*publisher)->push(5, rank_state(1, 0, true, 5)).is_ok());
  BOOST_REQUIRE(again.get().is_ok());
  BOOST_TEST(first_mismatch(state, 5) == "");
  // stop(): a receive on another thread ends at once, and so does every later one.
  auto waiting = std::async(std::launch::async, [&] { return (*rx)->receive(state, 0, 20s); });
  wait_until_waiting(**publisher, 1);
  const auto stopping = std::chrono::steady_clock::now();
  (*rx)->stop();
  auto stopped = waiting.get();
  BOOST_TEST((std::chrono::steady_clock::now() - stopping < 2s));
  BOOST_REQUIRE(!stopped.is_ok());
  BOOST_TEST(stopped.status().message().find("'only' was stopped") != std::string::npos, stopped.status().message());
  BOOST_TEST(!(*rx)->receive(state, 0, 1s).is_ok());
}

// A receiver that got the version and waits for the next at once is not counted twice: a push
// waiting for 2 receivers still waits for the second (the fully-async generators' first version).
BOOST_AUTO_TEST_CASE(a_push_waiting_for_two_counts_a_receiver_that_came_back_once) {
  const std::string at = address();
  auto options = small_buckets();
  options.receiver_timeout = 2s;
  auto publisher = TcpWeightPublisher::create(at, 0, 1, rank_state(1, 0, true, 0).descriptors(), options);
  BOOST_REQUIRE(publisher.is_ok());
  StateDict a_state = rank_state(1, 0, false), b_state = rank_state(1, 0, false);
  auto a = TcpWeightReceiver::connect(at, "a", a_state.descriptors(), options);
  auto b = TcpWeightReceiver::connect(at, "b", b_state.descriptors(), options);
  BOOST_REQUIRE(a.is_ok());
  BOOST_REQUIRE(b.is_ok());
  auto a_got = std::async(std::launch::async, [&] {
    auto first = (*a)->receive(a_state, 0, 20s);
    if (first.is_ok()) (void)(*a)->receive(a_state, *first + 1, 300ms);  // waits again at once
    return first;
  });
  wait_until_waiting(**publisher, 1);
  auto b_got = std::async(std::launch::async, [&] {
    std::this_thread::sleep_for(300ms);  // comes while the push waits
    return (*b)->receive(b_state, 0, 20s);
  });
  auto report = (*publisher)->push(1, rank_state(1, 0, true, 1), 2);
  BOOST_REQUIRE(report.is_ok());
  BOOST_TEST(report->dropped.empty());
  std::vector<std::string> delivered = report->delivered;
  std::sort(delivered.begin(), delivered.end());
  BOOST_TEST((delivered == std::vector<std::string>{"a", "b"}));
  BOOST_TEST(a_got.get().is_ok());
  BOOST_TEST(b_got.get().is_ok());
  BOOST_TEST(first_mismatch(b_state, 1) == "");
}

BOOST_AUTO_TEST_CASE(bad_input_and_waits_are_refused_or_bounded_by_name) {
  BOOST_TEST(TcpWeightPublisher::create("nohost", 0, 1, {}).status().message().find("'nohost' is not HOST:PORT") !=
             std::string::npos);
  BOOST_TEST(TcpWeightPublisher::create("h:99999", 0, 1, {}).status().message().find("no port in [1, 65535]") !=
             std::string::npos);
  BOOST_TEST(TcpWeightPublisher::create("127.0.0.1:1", 2, 2, {}).status().message().find(
                 "trainer rank 2 is outside a world of 2") != std::string::npos);
  auto quick = small_buckets();
  quick.connect_timeout = 100ms;
  const std::string nobody = address();
  auto none = TcpWeightReceiver::connect(nobody, "r", rank_state(1, 0, false).descriptors(), quick);
  BOOST_REQUIRE(!none.is_ok());
  BOOST_TEST(none.status().message().find("trainer rank 0 at " + nobody + " cannot be reached") != std::string::npos,
             none.status().message());
  // A peer rank that never registers: rank 0's wait is bounded and names it; so is a rank's wait for rank 0.
  auto lonely = TcpWeightPublisher::create(address(), 0, 3, rank_state(3, 0, true).descriptors(), quick);
  BOOST_REQUIRE(!lonely.is_ok());
  BOOST_TEST(lonely.status().message().find("trainer rank(s) 1, 2 did not register") != std::string::npos,
             lonely.status().message());
  auto orphan = TcpWeightPublisher::create(nobody, 1, 2, rank_state(2, 1, true).descriptors(), quick);
  BOOST_REQUIRE(!orphan.is_ok());
  BOOST_TEST(orphan.status().message().find("trainer rank 0 at " + nobody) != std::string::npos, orphan.status().message());
  // Rank 0's port taken: named.
  const std::string at = address();
  auto publisher = TcpWeightPublisher::create(at, 0, 1, rank_state(1, 0, true).descriptors(), small_buckets());
  BOOST_REQUIRE(publisher.is_ok());
  auto twice = TcpWeightPublisher::create(at, 0, 1, rank_state(1, 0, true).descriptors(), small_buckets());
  BOOST_TEST(twice.status().message().find("cannot listen on " + at) != std::string::npos, twice.status().message());

  StateDict extra = rank_state(1, 0, false);
  extra.add_full("lm_head", *Tensor::empty(DType::f32, Shape{4}, Device::host()));
  auto unheld = TcpWeightReceiver::connect(at, "r", extra.descriptors(), small_buckets());
  BOOST_REQUIRE(!unheld.is_ok());
  BOOST_TEST(unheld.status().message().find("receiver 'r''s tensor 'lm_head' is held by no trainer rank") !=
                 std::string::npos,
             unheld.status().message());
  StateDict other;
  other.add_full("qkv", *Tensor::empty(DType::bf16, Shape{kRows, kCols}, Device::host()));
  auto wrong = TcpWeightReceiver::connect(at, "r", other.descriptors(), small_buckets());
  BOOST_TEST(wrong.status().message().find("'qkv' is BF16 [8, 6], the trainer ranks' F32") != std::string::npos,
             wrong.status().message());
  StateDict state = rank_state(1, 0, false);
  auto rx = TcpWeightReceiver::connect(at, "r", state.descriptors(), small_buckets());
  BOOST_REQUIRE(rx.is_ok());
  // A state of another structure than connected with is refused, on both sides.
  BOOST_TEST(!(*rx)->receive(extra, 0, 50ms).is_ok());
  BOOST_TEST((*publisher)->push(1, extra).status().message().find("other tensors or shapes") != std::string::npos);
  // Not one of ours: a stranger's bytes on the port are closed, the publisher goes on.
  {
    const std::string garbage = "GET / HTTP/1.1\r\n\r\n";
    auto fd = tcp_detail::connect_to(*tcp_detail::parse_endpoint(at), std::chrono::steady_clock::now() + 5s, "rank 0");
    BOOST_REQUIRE(fd.is_ok());
    BOOST_REQUIRE(tcp_detail::write_all(*fd, garbage.data(), garbage.size(), std::chrono::steady_clock::now() + 5s, "x").is_ok());
    char c;
    BOOST_TEST(!tcp_detail::read_all(*fd, &c, 1, std::chrono::steady_clock::now() + 5s, -1, "rank 0").is_ok());
    ::close(*fd);
  }
  BOOST_TEST((*publisher)->push(1, rank_state(1, 0, true, 1)).is_ok());
  // After the publisher is gone, a receive says so.
  publisher->reset();
  auto closed = (*rx)->receive(state, 0, 5s);
  BOOST_REQUIRE(!closed.is_ok());
  BOOST_TEST(closed.status().message().find("trainer rank 0 (" + at + ")") != std::string::npos, closed.status().message());
}
