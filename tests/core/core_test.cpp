#define BOOST_TEST_MODULE core
#include <boost/test/unit_test.hpp>

#include <cerrno>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "stagehand/core/device.hpp"
#include "stagehand/core/dtype.hpp"
#include "stagehand/core/foreground_gate.hpp"
#include "stagehand/core/host_buffer.hpp"
#include "stagehand/core/sharded_tensor.hpp"
#include "stagehand/core/staging_fence.hpp"
#include "stagehand/core/status.hpp"
#include "stagehand/core/stream_copy.hpp"
#include "stagehand/core/tensor.hpp"
#include "stagehand/core/xxh3.hpp"

// The reference: xxhash's portable scalar code, inlined into this file, whatever vector code the
// library's entry points use.
#define XXH_INLINE_ALL
#define XXH_VECTOR 0  // XXH_SCALAR
#include <xxhash.h>

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
  BOOST_TEST((dtype_from_name("F8_E4M3") == DType::f8_e4m3));
  BOOST_TEST((dtype_from_name("F8_E5M2") == DType::f8_e5m2));
  BOOST_TEST(dtype_size(DType::f8_e4m3) == 1u);
  BOOST_TEST(dtype_size(DType::u16) == 2u);
  BOOST_TEST(dtype_size(DType::u32) == 4u);
  BOOST_TEST(dtype_size(DType::u64) == 8u);
}

namespace {

/// Little-endian bytes of `bits`, each element `size` bytes wide.
std::vector<std::uint8_t> pack_bits(const std::vector<std::uint64_t>& bits, std::size_t size) {
  std::vector<std::uint8_t> out;
  for (std::uint64_t b : bits) {
    for (std::size_t i = 0; i < size; ++i) out.push_back(static_cast<std::uint8_t>(b >> (8 * i)));
  }
  return out;
}

struct ConversionCase {
  DType from;
  DType to;
  std::vector<std::uint64_t> in;
  std::vector<std::uint64_t> out;
};

}  // namespace

// Expected bit patterns computed independently with numpy 2.4 and ml_dtypes 0.6 (which round
// once, to nearest even), except where noted: ml_dtypes rounds F64 to BF16 through F32 (twice),
// where Stagehand rounds once.
BOOST_AUTO_TEST_CASE(convert_elements_rounds_to_nearest_even_between_floating_types) {
  // 1.0 -2.5 1+2^-8 1+3*2^-8 65504 65520 448 464 1000 2^-24 2^-25 2^-9 2^-16 57344 61440 FLT_MAX
  // inf -inf nan -nan
  const std::vector<std::uint64_t> f32_in = {
      0x3f800000, 0xc0200000, 0x3f808000, 0x3f818000, 0x477fe000, 0x477ff000, 0x43e00000,
      0x43e80000, 0x447a0000, 0x33800000, 0x33000000, 0x3b000000, 0x37800000, 0x47600000,
      0x47700000, 0x7f7fffff, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000};
  const std::vector<ConversionCase> cases = {
      {DType::f32, DType::bf16, f32_in,
       {0x3f80, 0xc020, 0x3f80, 0x3f82, 0x4780, 0x4780, 0x43e0, 0x43e8, 0x447a, 0x3380,
        0x3300, 0x3b00, 0x3780, 0x4760, 0x4770, 0x7f80, 0x7f80, 0xff80, 0x7fc0, 0xffc0}},
      {DType::f32, DType::f16, f32_in,
       {0x3c00, 0xc100, 0x3c04, 0x3c0c, 0x7bff, 0x7c00, 0x5f00, 0x5f40, 0x63d0, 0x0001,
        0x0000, 0x1800, 0x0100, 0x7b00, 0x7b80, 0x7c00, 0x7c00, 0xfc00, 0x7e00, 0xfe00}},
      // 464 (a tie) rounds to 448 (0x7e); above it, and inf, NaN (0x7f) with its sign.
      {DType::f32, DType::f8_e4m3, f32_in,
       {0x38, 0xc2, 0x38, 0x38, 0x7f, 0x7f, 0x7e, 0x7e, 0x7f, 0x00,
        0x00, 0x01, 0x00, 0x7f, 0x7f, 0x7f, 0x7f, 0xff, 0x7f, 0xff}},
      {DType::f32, DType::f8_e5m2, f32_in,
       {0x3c, 0xc1, 0x3c, 0x3c, 0x7c, 0x7c, 0x5f, 0x5f, 0x64, 0x00,
        0x00, 0x18, 0x01, 0x7b, 0x7c, 0x7c, 0x7c, 0xfc, 0x7e, 0xfe}},
      // Ties: 1.0625 1.1875 1.125 1.375.
      {DType::f32, DType::f8_e4m3, {0x3f880000, 0x3f980000, 0x3f900000, 0x3fb00000}, {0x38, 0x3a, 0x39, 0x3b}},
      {DType::f32, DType::f8_e5m2, {0x3f880000, 0x3f980000, 0x3f900000, 0x3fb00000}, {0x3c, 0x3d, 0x3c, 0x3e}},
      // 1.0 -2.5 max min-subnormal inf -nan nan-with-payload
      {DType::bf16, DType::f32, {0x3f80, 0xc020, 0x7f7f, 0x0001, 0x7f80, 0xffc0, 0x7fc1},
       {0x3f800000, 0xc0200000, 0x7f7f0000, 0x00010000, 0x7f800000, 0xffc00000, 0x7fc10000}},
      {DType::f16, DType::f32, {0x3c00, 0xc100, 0x7bff, 0x0001, 0x7c00, 0xfe00},
       {0x3f800000, 0xc0200000, 0x477fe000, 0x33800000, 0x7f800000, 0xffc00000}},
      {DType::f8_e4m3, DType::f32, {0x38, 0xc2, 0x7e, 0x01, 0x7f, 0xff},
       {0x3f800000, 0xc0200000, 0x43e00000, 0x3b000000, 0x7fc00000, 0xffc00000}},
      // ... -inf too.
      {DType::f8_e5m2, DType::f32, {0x3c, 0xc1, 0x7b, 0x01, 0x7c, 0xfc, 0x7e},
       {0x3f800000, 0xc0200000, 0x47600000, 0x37800000, 0x7f800000, 0xff800000, 0x7fc00000}},
      // 1.0 -2.5 1+2^-24 (a tie) inf nan.
      {DType::f64, DType::f32,
       {0x3ff0000000000000, 0xc004000000000000, 0x3ff0000010000000, 0x7ff0000000000000, 0x7ff8000000000000},
       {0x3f800000, 0xc0200000, 0x3f800000, 0x7f800000, 0x7fc00000}},
      // 1+2^-8 (a tie, to even), 1+2^-8+2^-30 (just above it: through F32 it would round twice,
      // to 0x3f80), 1e300 (overflow).
      {DType::f64, DType::bf16, {0x3ff0100000000000, 0x3ff0100000400000, 0x7e37e43c8800759c},
       {0x3f80, 0x3f81, 0x7f80}},
      // 1.0 65536 (overflow) 2^-24 nan.
      {DType::bf16, DType::f16, {0x3f80, 0x4780, 0x3380, 0x7fc0}, {0x3c00, 0x7c00, 0x0001, 0x7e00}},
      // 1.0 448 512 inf -inf.
      {DType::f16, DType::f8_e4m3, {0x3c00, 0x5f00, 0x6000, 0x7c00, 0xfc00}, {0x38, 0x7e, 0x7f, 0x7f, 0xff}},
      // 57344 1.0 inf.
      {DType::f8_e5m2, DType::f8_e4m3, {0x7b, 0x3c, 0x7c}, {0x7f, 0x38, 0x7f}},
      // 448 2^-9 1.0.
      {DType::f8_e4m3, DType::f8_e5m2, {0x7e, 0x01, 0x38}, {0x5f, 0x18, 0x3c}},
  };
  for (const auto& c : cases) {
    BOOST_TEST_CONTEXT(dtype_name(c.from) << " -> " << dtype_name(c.to)) {
      BOOST_REQUIRE(c.in.size() == c.out.size());
      const auto in = pack_bits(c.in, dtype_size(c.from));
      const auto expected = pack_bits(c.out, dtype_size(c.to));
      std::vector<std::uint8_t> out(expected.size(), 0xaa);
      BOOST_REQUIRE(convert_elements(in.data(), c.from, out.data(), c.to, c.in.size()).is_ok());
      BOOST_TEST(out == expected, boost::test_tools::per_element());
    }
  }
}

// F8_E4M3 (fn) has no infinity: a value that rounds past 448 is NaN with its sign, as in
// ml_dtypes 0.6 float8_e4m3fn and torch.float8_e4m3fn. 464, halfway between 448 (mantissa 110)
// and the NaN pattern (111), is a tie that rounds to even, to 448; anything above it is NaN.
BOOST_AUTO_TEST_CASE(f8_e4m3_overflow_past_the_rounding_boundary_is_nan_as_in_ml_dtypes) {
  // 447 448 464 464.0001 479.9 480 1e6 -464 -480 inf -inf nan; expected from ml_dtypes.
  const std::vector<std::uint64_t> expected = {0x7e, 0x7e, 0x7e, 0x7f, 0x7f, 0x7f,
                                               0x7f, 0xfe, 0xff, 0x7f, 0xff, 0x7f};
  const std::vector<ConversionCase> cases = {
      {DType::f32, DType::f8_e4m3,
       {0x43df8000, 0x43e00000, 0x43e80000, 0x43e80003, 0x43eff333, 0x43f00000, 0x49742400,
        0xc3e80000, 0xc3f00000, 0x7f800000, 0xff800000, 0x7fc00000},
       expected},
      {DType::f64, DType::f8_e4m3,
       {0x407bf00000000000, 0x407c000000000000, 0x407d000000000000, 0x407d000068db8bac,
        0x407dfe6666666666, 0x407e000000000000, 0x412e848000000000, 0xc07d000000000000,
        0xc07e000000000000, 0x7ff0000000000000, 0xfff0000000000000, 0x7ff8000000000000},
       expected},
  };
  for (const auto& c : cases) {
    BOOST_TEST_CONTEXT(dtype_name(c.from) << " -> " << dtype_name(c.to)) {
      const auto in = pack_bits(c.in, dtype_size(c.from));
      std::vector<std::uint8_t> out(c.out.size(), 0xaa);
      BOOST_REQUIRE(convert_elements(in.data(), c.from, out.data(), c.to, c.in.size()).is_ok());
      BOOST_TEST(out == pack_bits(c.out, 1), boost::test_tools::per_element());
    }
  }
}

BOOST_AUTO_TEST_CASE(convert_elements_widens_integers_and_refuses_the_rest) {
  const std::vector<std::int8_t> i8 = {-128, -1, 0, 127};
  std::vector<std::int64_t> i64(i8.size());
  BOOST_REQUIRE(convert_elements(i8.data(), DType::i8, i64.data(), DType::i64, i8.size()).is_ok());
  BOOST_TEST(i64 == (std::vector<std::int64_t>{-128, -1, 0, 127}), boost::test_tools::per_element());
  const std::vector<std::uint16_t> u16 = {0, 1, 65535};
  std::vector<std::uint32_t> u32(u16.size());
  BOOST_REQUIRE(convert_elements(u16.data(), DType::u16, u32.data(), DType::u32, u16.size()).is_ok());
  BOOST_TEST(u32 == (std::vector<std::uint32_t>{0, 1, 65535}), boost::test_tools::per_element());
  // Every dtype converts to itself byte for byte.
  for (DType d : kAllDTypes) {
    std::vector<std::uint8_t> in(3 * dtype_size(d));
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<std::uint8_t>(i * 37 + 1);
    std::vector<std::uint8_t> out(in.size());
    BOOST_REQUIRE(convert_elements(in.data(), d, out.data(), d, 3).is_ok());
    BOOST_TEST(out == in, boost::test_tools::per_element());
  }
  const std::pair<DType, DType> refused[] = {{DType::i64, DType::i32}, {DType::i8, DType::u16},
                                             {DType::u8, DType::i16},  {DType::i32, DType::f32},
                                             {DType::f32, DType::i32}, {DType::boolean, DType::u8}};
  for (auto [from, to] : refused) {
    std::uint64_t in = 0, out = 0;
    Status s = convert_elements(&in, from, &out, to, 1);
    BOOST_TEST((s.code() == ErrorCode::invalid_argument));
    BOOST_TEST(s.message().find(std::string(dtype_name(from))) != std::string::npos);
    BOOST_TEST(s.message().find(std::string(dtype_name(to))) != std::string::npos);
  }
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

BOOST_AUTO_TEST_CASE(shapes_past_the_inline_rank_copy_move_and_assign_as_values) {
  // Up to kInlineRank dimensions are held in place, more on the heap: every mix of the two.
  const Shape small{2, 3};
  const Shape four{1, 2, 3, 4};
  const Shape big{1, 2, 3, 4, 5, 6, 7, 8};
  BOOST_TEST(big.rank() == Shape::kMaxRank);
  BOOST_TEST(big.numel() == 40320);
  BOOST_TEST(big.to_string() == "[1, 2, 3, 4, 5, 6, 7, 8]");
  BOOST_TEST(four.to_string() == "[1, 2, 3, 4]");
  Shape copy = big;
  BOOST_TEST((copy == big));
  copy[7] = 9;  // its own dimensions, not big's
  BOOST_TEST(big[7] == 8);
  BOOST_TEST(copy[7] == 9);
  Shape moved = std::move(copy);
  BOOST_TEST(moved.to_string() == "[1, 2, 3, 4, 5, 6, 7, 9]");
  BOOST_TEST(copy.rank() == 0u);  // NOLINT(bugprone-use-after-move): a moved-from heap shape is empty
  copy = small;  // a moved-from shape takes a value again
  BOOST_TEST((copy == small));
  Shape s = small;
  s = big;  // inline <- heap
  BOOST_TEST((s == big));
  s = four;  // heap <- inline
  BOOST_TEST((s == four));
  s = Shape{5, 4, 3, 2, 1};  // moved in from a temporary on the heap
  BOOST_TEST(s.to_string() == "[5, 4, 3, 2, 1]");
  const Shape& same = s;
  s = same;  // self-assignment keeps the value
  BOOST_TEST(s.to_string() == "[5, 4, 3, 2, 1]");
  BOOST_TEST((Shape::zeros(6) == Shape{0, 0, 0, 0, 0, 0}));
  std::vector<Shape> shapes(100, big);
  shapes.resize(300, small);  // reallocation moves every shape
  BOOST_TEST((shapes[99] == big));
  BOOST_TEST((shapes[299] == small));
  BOOST_TEST(sizeof(Shape) <= 40u);
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

BOOST_AUTO_TEST_CASE(xxh3_digests_equal_the_scalar_reference_at_every_length_and_split) {
  // Lengths around XXH3's internal boundaries (16, 128, 240 bytes; 64-byte stripes; 1 KiB blocks)
  // and offsets that misalign the input.
  std::vector<std::uint8_t> bytes((1u << 20) + 4096);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::uint8_t>((i * 2654435761u) >> 13);
  for (std::size_t length : {0, 1, 3, 16, 17, 128, 129, 240, 241, 1023, 1024, 1025, 4096, 65537, 1 << 20}) {
    for (std::size_t offset : {0, 1, 7}) {
      const std::uint8_t* data = bytes.data() + offset;
      const std::uint64_t expected = XXH3_64bits(data, length);
      BOOST_TEST(xxh3(data, length) == expected, "length " << length << " offset " << offset);
      // Streamed in uneven pieces, the digest is the same.
      Xxh3Stream stream;
      for (std::size_t at = 0, piece = 1; at < length; at += piece, piece = piece * 3 + 5) {
        stream.update(data + at, std::min(piece, length - at));
      }
      BOOST_TEST(stream.digest() == expected, "streamed, length " << length << " offset " << offset);
    }
  }
}

BOOST_AUTO_TEST_CASE(stream_copy_equals_memcpy_at_every_alignment_and_length_and_touches_nothing_else) {
  // Lengths around the threshold and the vector groups, at every misalignment of either side,
  // into a destination whose bytes around the copy must stay as they were; both vector codes
  // (AVX2 where this CPU has it, and SSE2), from the default threshold and from lower ones.
  const std::size_t t = kStreamCopyMinBytes;
  const std::vector<std::size_t> lengths = {0,     1,      63,      255,     256,     257,        4096,
                                            t - 1, t,      t + 1,   t + 31,  t + 127, t + 129, 3 * t + 77};
  std::vector<std::uint8_t> src(3 * t + 77 + 64 + 64);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::uint8_t>(i * 131 + (i >> 9) * 7 + 1);
  std::vector<std::uint8_t> dst(src.size() + 128);
  const auto untouched = [](auto begin, auto end) {
    return std::all_of(begin, end, [](std::uint8_t b) { return b == 0xA5; });
  };
  for (auto [avx2, from] : {std::pair{true, t}, std::pair{false, t}, std::pair{true, kColdCopyMinBytes},
                            std::pair{false, std::size_t{0}}}) {
    for (std::size_t n : lengths) {
      for (std::size_t s_off : {std::size_t{0}, std::size_t{1}, std::size_t{15}, std::size_t{33}}) {
        for (std::size_t d_off = 0; d_off < 64; d_off += 7) {
          std::fill(dst.begin(), dst.end(), std::uint8_t{0xA5});
          stream_copy_with(dst.data() + 64 + d_off, src.data() + s_off, n, avx2, from);
          BOOST_TEST_CONTEXT("AVX2 " << avx2 << ", from " << from << ", length " << n << ", source offset " << s_off
                                     << ", destination offset " << d_off) {
            BOOST_TEST(std::equal(src.begin() + s_off, src.begin() + s_off + n, dst.begin() + 64 + d_off));
            BOOST_TEST(untouched(dst.begin(), dst.begin() + 64 + d_off));
            BOOST_TEST(untouched(dst.begin() + 64 + d_off + n, dst.end()));
          }
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(the_foreground_gate_holds_background_work_until_every_hold_is_released) {
  using namespace std::chrono_literals;
  ForegroundGate gate;
  BOOST_TEST(gate.wait() == 0.0);
  gate.set_limit(60s);
  ForegroundGate::Hold first = gate.hold();
  ForegroundGate::Hold second = gate.hold();
  BOOST_TEST(gate.holds() == 2);
  std::atomic<bool> through{false};
  std::thread waiter([&] {
    (void)gate.wait();
    through = true;
  });
  std::this_thread::sleep_for(50ms);
  BOOST_TEST(!through.load());
  first.release();
  first.release();  // A second release of one hold releases nothing more.
  std::this_thread::sleep_for(50ms);
  BOOST_TEST(!through.load());  // The second hold is still out.
  {
    ForegroundGate::Hold moved = std::move(second);
    BOOST_TEST(moved.held());
    BOOST_TEST(gate.holds() == 1);
  }
  waiter.join();
  BOOST_TEST(through.load());
  BOOST_TEST(gate.holds() == 0);
}

BOOST_AUTO_TEST_CASE(the_foreground_gate_holds_work_back_at_most_its_limit_from_when_it_was_taken) {
  using namespace std::chrono_literals;
  using Clock = std::chrono::steady_clock;
  ForegroundGate gate;
  gate.set_limit(300ms);
  auto since = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };
  auto taken = Clock::now();
  ForegroundGate::Hold held = gate.hold();
  (void)gate.wait();
  BOOST_TEST(since(taken) >= 0.3);
  // Past the limit, work goes on at once while the same hold is out (a wait per piece would
  // otherwise add up without bound).
  std::this_thread::sleep_for(100ms);
  BOOST_TEST(gate.wait() < 0.29);
  BOOST_TEST(gate.holds() == 1);
  // Free and taken again: held back again.
  held.release();
  taken = Clock::now();
  held = gate.hold();
  (void)gate.wait();
  BOOST_TEST(since(taken) >= 0.3);
}

// The fence counts its readers: a save staging in the background and a weight push may both
// read the state, and it opens only when each of them is done.
BOOST_AUTO_TEST_CASE(the_staging_fence_opens_when_its_last_reader_is_done) {
  StagingFence fence;
  BOOST_TEST(fence.is_open());
  BOOST_TEST(fence.wait() == 0);
  fence.close();
  fence.close();
  fence.open();
  BOOST_TEST(!fence.is_open());
  std::atomic<bool> passed{false};
  std::thread waiter([&] {
    (void)fence.wait();
    passed = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  BOOST_TEST(!passed.load());
  fence.open();
  waiter.join();
  BOOST_TEST(passed.load());
  BOOST_TEST(fence.is_open());
}
