#define BOOST_TEST_MODULE core
#include <boost/test/unit_test.hpp>

#include <cerrno>

#include "stagehand/core/device.hpp"
#include "stagehand/core/host_buffer.hpp"
#include "stagehand/core/sharded_tensor.hpp"
#include "stagehand/core/status.hpp"
#include "stagehand/core/tensor.hpp"

using namespace stagehand;

BOOST_AUTO_TEST_CASE(dtype_names_round_trip_and_sizes) {
  for (DType d : kAllDTypes) {
    auto parsed = dtype_from_name(dtype_name(d));
    BOOST_REQUIRE(parsed.has_value());
    BOOST_TEST((*parsed == d));
    BOOST_TEST(dtype_size(d) >= 1u);
  }
  BOOST_TEST(dtype_size(DType::bf16) == 2u);
  BOOST_TEST(dtype_size(DType::i64) == 8u);
  BOOST_TEST(!dtype_from_name("F8").has_value());
}

BOOST_AUTO_TEST_CASE(shape_is_a_value_type) {
  Shape a{2, 3, 4};
  Shape b{2, 3, 4};
  BOOST_TEST((a == b));
  BOOST_TEST(a.numel() == 24);
  BOOST_TEST(a.to_string() == "[2, 3, 4]");
  BOOST_TEST(Shape{}.numel() == 1);
  BOOST_TEST((Shape::zeros(2) == Shape{0, 0}));
  BOOST_TEST((Shape{1, 2} < Shape{1, 3}));
  BOOST_TEST(!(Shape{2} == Shape{2, 1}));
}

BOOST_AUTO_TEST_CASE(status_maps_errno_and_keeps_context) {
  Status s = Status::from_errno(ENOSPC, "write to 'x'");
  BOOST_TEST((s.code() == ErrorCode::no_space));
  BOOST_TEST(s.sys_errno() == ENOSPC);
  BOOST_TEST(s.message().find("errno 28") != std::string::npos);
  BOOST_TEST((Status::from_errno(EROFS, "x").code() == ErrorCode::permission_denied));
  BOOST_TEST(Status::from_errno(EIO, "x").retryable());
  Status c = s.with_context("rank 1");
  BOOST_TEST(c.message().rfind("rank 1: ", 0) == 0);
  BOOST_TEST(Status::ok().with_context("x").is_ok());
}

Result<int> parse_positive(int x) {
  if (x <= 0) return Status{ErrorCode::invalid_argument, "not positive"};
  return x;
}

Result<int> doubled(int x) {
  SH_ASSIGN_OR_RETURN(int v, parse_positive(x));
  return 2 * v;
}

BOOST_AUTO_TEST_CASE(result_macros_propagate_errors) {
  BOOST_TEST(*doubled(4) == 8);
  auto bad = doubled(-1);
  BOOST_TEST(!bad.is_ok());
  BOOST_TEST(bad.status().message() == "not positive");
}

BOOST_AUTO_TEST_CASE(host_tensor_copies) {
  auto t = Tensor::empty(DType::f32, Shape{3, 2}, Device::host());
  BOOST_REQUIRE(t.is_ok());
  BOOST_TEST(t->nbytes() == 24u);
  float src[6] = {1, 2, 3, 4, 5, 6};
  BOOST_TEST(t->copy_from_host(src).is_ok());
  float dst[6] = {};
  BOOST_TEST(t->copy_to_host(dst).is_ok());
  BOOST_TEST(dst[5] == 6.0f);
  BOOST_TEST(!Tensor::empty(DType::f32, Shape{-1}, Device::host()).is_ok());
}

BOOST_AUTO_TEST_CASE(device_detection_falls_back_to_host) {
  const DeviceInfo& info = device_info();
  if (info.gpu_count == 0) {
    BOOST_TEST(!info.reason.empty());
    BOOST_TEST((default_device(3) == Device::host()));
  } else {
    BOOST_TEST(default_device(0).is_cuda());
  }
}

BOOST_AUTO_TEST_CASE(device_tensor_round_trip_when_a_gpu_is_visible) {
  Device device = default_device(0);
  auto t = Tensor::empty(DType::i32, Shape{1024}, device);
  BOOST_REQUIRE(t.is_ok());
  std::vector<std::int32_t> src(1024);
  for (int i = 0; i < 1024; ++i) src[static_cast<std::size_t>(i)] = i * 7;
  BOOST_TEST(t->copy_from_host(src.data()).is_ok());
  std::vector<std::int32_t> dst(1024);
  BOOST_TEST(t->copy_to_host(dst.data()).is_ok());
  BOOST_TEST((src == dst));
  BOOST_TEST_MESSAGE("device used: " << device.to_string());
}

BOOST_AUTO_TEST_CASE(host_buffers_are_counted) {
  MemoryCounter counter;
  {
    HostBuffer a(10000, false, &counter);
    HostBuffer b(5000, false, &counter);
    BOOST_TEST(counter.current() == 15000u);
    HostBuffer moved = std::move(a);
    BOOST_TEST(counter.current() == 15000u);
    BOOST_TEST(reinterpret_cast<std::uintptr_t>(moved.data()) % 4096 == 0u);
  }
  BOOST_TEST(counter.current() == 0u);
  BOOST_TEST(counter.peak() == 15000u);
  counter.reset_peak();
  BOOST_TEST(counter.peak() == 0u);
}

BOOST_AUTO_TEST_CASE(sharded_descriptors_are_checked) {
  ShardedTensorDesc d{"w", DType::f32, Shape{8, 4}, Shape{4, 0}, Shape{4, 4}, 0};
  BOOST_TEST(d.validate().is_ok());
  BOOST_TEST(d.chunk_key() == "w@4,0");
  BOOST_TEST(d.nbytes() == 64u);
  d.global_offset = Shape{5, 0};
  BOOST_TEST(!d.validate().is_ok());
  d.global_offset = Shape{4};
  BOOST_TEST(!d.validate().is_ok());
  d.global_offset = Shape{0, 0};
  d.name = "a@b";
  BOOST_TEST(!d.validate().is_ok());

  StateDict state;
  state.add_full("x", *Tensor::empty(DType::u8, Shape{3}, Device::host()));
  state.add_full("x", *Tensor::empty(DType::u8, Shape{3}, Device::host()));
  Status st = state.validate();
  BOOST_TEST(st.message().find("appears twice") != std::string::npos);
}
