#define BOOST_TEST_MODULE copy_engine
#include <boost/test/unit_test.hpp>

#include <cstring>
#include <vector>

#include "stagehand/core/copy_engine.hpp"

// The simulated device: copies take the time their bytes and latency say, run in order on their
// stream and alongside other streams' copies, complete their events, and every misuse a GPU would
// let pass silently (a read before the event, a free under a copy, a copy on a destroyed stream,
// an event used after its wait, memory that is not the device's) is an error, logged and counted.

using namespace stagehand;

namespace {

SimulatedDeviceOptions slow() {
  SimulatedDeviceOptions options;
  options.bytes_per_s = 1e9;  // 1 GB/s: 8 MiB take 8.4 ms
  options.latency_s = 1e-3;
  return options;
}

constexpr std::size_t kBytes = 8u << 20;

std::vector<std::uint8_t> pattern(std::size_t bytes, int seed) {
  std::vector<std::uint8_t> v(bytes);
  for (std::size_t i = 0; i < bytes; ++i) v[i] = static_cast<std::uint8_t>((i * 131 + static_cast<std::size_t>(seed)) >> 3);
  return v;
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_copy_takes_its_time_and_completes_its_event) {
  auto engine = make_simulated_engine(slow());
  auto* device = static_cast<std::uint8_t*>(engine->alloc_device(kBytes));
  BOOST_REQUIRE(device != nullptr);
  const auto src = pattern(kBytes, 1);
  std::vector<std::uint8_t> back(kBytes);
  auto stream = engine->create_stream();
  BOOST_REQUIRE(stream.is_ok());
  BOOST_REQUIRE(engine->copy_async(*stream, CopyKind::host_to_device, device, src.data(), kBytes).is_ok());
  BOOST_REQUIRE(engine->copy_async(*stream, CopyKind::device_to_host, back.data(), device, kBytes).is_ok());
  auto event = engine->record(*stream);
  BOOST_REQUIRE(event.is_ok());
  BOOST_TEST(!*engine->done(*event));  // 2 x 9.4 ms of copies were just enqueued
  BOOST_REQUIRE(engine->wait(*event).is_ok());
  BOOST_TEST((back == src));
  auto after = engine->record(*stream);  // nothing enqueued since: complete at once
  BOOST_TEST(*engine->done(*after));
  BOOST_REQUIRE(engine->wait(*after).is_ok());
  const auto log = engine->copy_log();
  BOOST_REQUIRE(log.size() == 2u);
  // In order on the stream, each as long as its bytes and latency make it.
  BOOST_TEST(log[1].start_s >= log[0].end_s);
  for (const auto& r : log) BOOST_TEST(r.end_s - r.start_s >= 1e-3 + static_cast<double>(kBytes) / 1e9 - 1e-4);
  BOOST_TEST(engine->destroy_stream(*stream).is_ok());
  BOOST_TEST(engine->free_device(device).is_ok());
  BOOST_TEST(engine->misuse_count() == 0u);
}

BOOST_AUTO_TEST_CASE(copies_on_two_streams_overlap) {
  auto engine = make_simulated_engine(slow());
  auto* a = engine->alloc_device(kBytes);
  auto* b = engine->alloc_device(kBytes);
  std::vector<std::uint8_t> ha(kBytes), hb(kBytes);
  auto s1 = *engine->create_stream();
  auto s2 = *engine->create_stream();
  BOOST_REQUIRE(engine->copy_async(s1, CopyKind::device_to_host, ha.data(), a, kBytes).is_ok());
  BOOST_REQUIRE(engine->copy_async(s2, CopyKind::device_to_host, hb.data(), b, kBytes).is_ok());
  BOOST_REQUIRE(engine->wait(*engine->record(s1)).is_ok());
  BOOST_REQUIRE(engine->wait(*engine->record(s2)).is_ok());
  const auto log = engine->copy_log();
  BOOST_REQUIRE(log.size() == 2u);
  BOOST_TEST(log[0].stream != log[1].stream);
  BOOST_TEST((log[0].start_s < log[1].end_s && log[1].start_s < log[0].end_s));
  BOOST_TEST(engine->free_device(a).is_ok());
  BOOST_TEST(engine->free_device(b).is_ok());
}

BOOST_AUTO_TEST_CASE(every_misuse_is_an_error_logged_and_counted) {
  auto engine = make_simulated_engine(slow());
  auto* device = engine->alloc_device(kBytes);
  std::vector<std::uint8_t> host(kBytes);
  auto stream = *engine->create_stream();

  // Reading the destination before its event.
  BOOST_REQUIRE(engine->copy_async(stream, CopyKind::device_to_host, host.data(), device, kBytes).is_ok());
  Status read = engine->check_readable(host.data() + 4096, 16);
  BOOST_TEST(read.message().find("read before its event") != std::string::npos, read.to_string());
  // Freeing memory a copy still reads: refused, and the memory stays.
  Status freed = engine->free_device(device);
  BOOST_TEST(freed.message().find("still uses") != std::string::npos, freed.to_string());
  BOOST_REQUIRE(engine->wait(*engine->record(stream)).is_ok());
  BOOST_TEST(engine->check_readable(host.data(), kBytes).is_ok());  // after the event: fine
  BOOST_TEST(engine->misuse_count() == 2u);

  // Memory that is not the device's, on either side.
  std::vector<std::uint8_t> other(64);
  Status not_device = engine->copy_async(stream, CopyKind::device_to_host, host.data(), other.data(), 64);
  BOOST_TEST(not_device.message().find("not device memory") != std::string::npos, not_device.to_string());
  Status host_side = engine->copy_async(stream, CopyKind::host_to_device, device, device, 64);
  BOOST_TEST(host_side.message().find("host side is device memory") != std::string::npos, host_side.to_string());
  Status bad_free = engine->free_device(other.data());
  BOOST_TEST(bad_free.message().find("not device memory") != std::string::npos, bad_free.to_string());

  // A destroyed stream.
  BOOST_REQUIRE(engine->destroy_stream(stream).is_ok());
  Status late = engine->copy_async(stream, CopyKind::device_to_host, host.data(), device, 64);
  BOOST_TEST(late.message().find("which was destroyed") != std::string::npos, late.to_string());
  BOOST_TEST(!engine->record(stream).is_ok());
  BOOST_TEST(!engine->wait(CopyEvent{12345}).is_ok());
  // An event used after its wait (the CUDA engine has destroyed it by then).
  auto second = *engine->create_stream();
  auto event = *engine->record(second);
  BOOST_REQUIRE(engine->wait(event).is_ok());
  Status again = engine->wait(event);
  BOOST_TEST(again.message().find("was waited for") != std::string::npos, again.to_string());
  BOOST_TEST(!engine->done(event).is_ok());
  BOOST_TEST(engine->destroy_stream(second).is_ok());
  BOOST_TEST(engine->misuse_count() == 10u);
  BOOST_TEST(engine->free_device(device).is_ok());
}

BOOST_AUTO_TEST_CASE(the_blocking_copy_goes_through_the_engine) {
  auto engine = make_simulated_engine(slow());
  auto* device = engine->alloc_device(4096);
  const auto src = pattern(4096, 7);
  std::vector<std::uint8_t> back(4096);
  BOOST_REQUIRE(engine->copy(CopyKind::host_to_device, device, src.data(), 4096).is_ok());
  BOOST_REQUIRE(engine->copy(CopyKind::device_to_host, back.data(), device, 4096).is_ok());
  BOOST_TEST((back == src));
  BOOST_TEST(engine->copy_log().size() == 2u);
  BOOST_TEST(engine->free_device(device).is_ok());
}

BOOST_AUTO_TEST_CASE(the_host_engine_copies_at_once) {
  auto engine = make_host_engine();
  auto* device = engine->alloc_device(64);
  const auto src = pattern(64, 3);
  auto stream = *engine->create_stream();
  BOOST_REQUIRE(engine->copy_async(stream, CopyKind::host_to_device, device, src.data(), 64).is_ok());
  BOOST_TEST(*engine->done(*engine->record(stream)));
  BOOST_TEST(std::memcmp(device, src.data(), 64) == 0);
  BOOST_TEST(engine->free_device(device).is_ok());
}
