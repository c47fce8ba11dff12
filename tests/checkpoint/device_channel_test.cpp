#define BOOST_TEST_MODULE device_channel_test
#include <boost/test/unit_test.hpp>

#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "stagehand/checkpoint/sync/weight_channel.hpp"
#include "stagehand/core/copy_engine.hpp"
#include "stagehand/core/device.hpp"
#include "sync_layouts.hpp"
#include "tests/test_util.hpp"

// Weight sync from and into device memory, on the simulated GPU (STAGEHAND_SIMULATED_GPU=1): the
// trainer ranks' tensors are device tensors, copied to host memory through the copy engine on
// their way out (into the ring over shared memory, into one bucket per receiver over TCP); device
// receivers are filled through it. Not yet run on a GPU.

using namespace stagehand;
using namespace stagehand::sync_layouts;
using namespace std::chrono_literals;

namespace {

struct OnTheSimulatedGpu {
  OnTheSimulatedGpu() {
    ::setenv("STAGEHAND_SIMULATED_GPU", "1", 1);
    ::unsetenv("STAGEHAND_FORCE_HOST");
  }
};

/// `from`'s tensors copied to `device` (called from the publishers' and receivers' threads too:
/// it throws rather than use Boost.Test's checks, which are not thread-safe).
StateDict moved(const StateDict& from, Device device) {
  StateDict out;
  for (const auto& t : from.tensors) {
    auto made = Tensor::empty(t.desc.dtype, t.tensor.shape(), device);
    if (!made.is_ok()) throw std::runtime_error(made.status().to_string());
    Status st = device.is_cuda() ? made->copy_from_host(t.tensor.data()) : t.tensor.copy_to_host(made->data());
    if (!st.is_ok()) throw std::runtime_error(st.to_string());
    out.tensors.push_back({t.desc, *made});
  }
  return out;
}

void device_to_device_and_host(const std::string& channel) {
  BOOST_REQUIRE_EQUAL(copy_engine().name(), "simulated");
  const std::uint64_t misuses = copy_engine().misuse_count();
  const std::size_t logged = copy_engine().copy_log().size();
  WeightChannelOptions options;
  options.bucket_bytes = 128;  // many buckets and stagings per tensor
  options.connect_timeout = 20s;
  // Trainer tensor 2 -> inference tensor 4: receivers 0 and 1 in device memory, 2 and 3 in host memory.
  auto senders = layout(2, 1, true);
  auto receivers = layout(4, 1, false);
  std::vector<StateDict> placed;
  for (std::size_t q = 0; q < receivers.size(); ++q) {
    placed.push_back(q < 2 ? moved(receivers[q], Device::cuda(0)) : receivers[q]);
  }
  BOOST_REQUIRE(placed[0].tensors[0].tensor.device().is_cuda());
  std::promise<void> all_received;
  std::shared_future<void> done = all_received.get_future().share();
  std::vector<std::future<std::string>> pubs;
  for (int r = 0; r < 2; ++r) {
    pubs.push_back(std::async(std::launch::async, [&, r] {
      return run_publisher(channel, r, senders, receivers, {3, 4}, 2, options, done,
                           [](StateDict host) { return moved(host, Device::cuda(0)); });
    }));
  }
  std::vector<std::future<std::string>> rxs;
  for (std::size_t q = 0; q < placed.size(); ++q) {
    rxs.push_back(std::async(std::launch::async, [&, q]() -> std::string {
      auto rx = connect_weight_receiver(channel, "rx-" + std::to_string(q), placed[q].descriptors(), options);
      if (!rx.is_ok()) return rx.status().to_string();
      for (std::int64_t step : {3, 4}) {
        auto got = (*rx)->receive(placed[q], step, 20s);
        if (!got.is_ok()) return got.status().to_string();
        if (*got != step) return "got step " + std::to_string(*got);
        const StateDict host = q < 2 ? moved(placed[q], Device::host()) : placed[q];
        if (std::string m = first_mismatch(host, step); !m.empty()) return "step " + std::to_string(step) + ": " + m;
      }
      return "";
    }));
  }
  for (std::size_t q = 0; q < rxs.size(); ++q) BOOST_TEST(rxs[q].get() == "", "receiver " << q);
  all_received.set_value();
  for (auto& p : pubs) BOOST_TEST(p.get() == "");
  // Both ways went through the engine, beyond the test's own copies (placing the trainer states
  // and the device receivers, reading the device receivers back), and it saw no misuse.
  auto bytes_of = [](const std::vector<StateDict>& states, std::size_t n) {
    std::uint64_t total = 0;
    for (std::size_t i = 0; i < n; ++i) {
      for (const auto& t : states[i].tensors) total += t.desc.nbytes();
    }
    return total;
  };
  const std::uint64_t model = bytes_of(layout(1, 1, false), 1), device_rx = bytes_of(receivers, 2);
  const std::uint64_t test_in = device_rx + 2 * bytes_of(senders, 2), test_out = 2 * device_rx;
  std::uint64_t out = 0, in = 0;
  const auto log = copy_engine().copy_log();
  for (std::size_t i = logged; i < log.size(); ++i) {
    (log[i].kind == CopyKind::device_to_host ? out : in) += log[i].bytes;
  }
  BOOST_TEST(out >= test_out + 2 * model);     // every element of both versions left a device
  BOOST_TEST(in >= test_in + 2 * device_rx);   // and every device receiver was filled through the engine
  BOOST_TEST(copy_engine().misuse_count() == misuses);
}

}  // namespace

BOOST_TEST_GLOBAL_FIXTURE(OnTheSimulatedGpu);

BOOST_AUTO_TEST_CASE(over_shared_memory_from_and_into_device_memory) {
  device_to_device_and_host("test-device-" + std::to_string(getpid()));
}

BOOST_AUTO_TEST_CASE(over_tcp_from_and_into_device_memory) {
  device_to_device_and_host("tcp://127.0.0.1:" + std::to_string(test::free_port()));
}
