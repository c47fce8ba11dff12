#include "stagehand/core/dtype.hpp"

#include <bit>
#include <cmath>
#include <cstring>
#include <string>

namespace stagehand {

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f64:
    case DType::i64:
    case DType::u64:
      return 8;
    case DType::f32:
    case DType::i32:
    case DType::u32:
      return 4;
    case DType::bf16:
    case DType::f16:
    case DType::i16:
    case DType::u16:
      return 2;
    case DType::i8:
    case DType::u8:
    case DType::boolean:
    case DType::f8_e4m3:
    case DType::f8_e5m2:
      return 1;
  }
  return 0;
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f64:
      return "F64";
    case DType::f32:
      return "F32";
    case DType::bf16:
      return "BF16";
    case DType::f16:
      return "F16";
    case DType::i64:
      return "I64";
    case DType::i32:
      return "I32";
    case DType::i16:
      return "I16";
    case DType::i8:
      return "I8";
    case DType::u8:
      return "U8";
    case DType::boolean:
      return "BOOL";
    case DType::f8_e4m3:
      return "F8_E4M3";
    case DType::f8_e5m2:
      return "F8_E5M2";
    case DType::u16:
      return "U16";
    case DType::u32:
      return "U32";
    case DType::u64:
      return "U64";
  }
  return "?";
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (DType dtype : kAllDTypes) {
    if (dtype_name(dtype) == name) return dtype;
  }
  return std::nullopt;
}

bool is_floating_point(DType dtype) {
  switch (dtype) {
    case DType::f64:
    case DType::f32:
    case DType::bf16:
    case DType::f16:
    case DType::f8_e4m3:
    case DType::f8_e5m2:
      return true;
    default:
      return false;
  }
}

namespace {

// -- floating point formats narrower than float --

/// A binary floating point format of at most 16 bits: sign, exponent, mantissa.
struct MiniFloat {
  int exponent_bits;
  int mantissa_bits;
  /// False for the OCP "fn" formats: the all-ones exponent holds normal numbers, and only the
  /// all-ones exponent with the all-ones mantissa is NaN.
  bool has_infinity;

  int bias() const { return (1 << (exponent_bits - 1)) - 1; }
  std::uint32_t max_exponent_field() const { return (1u << exponent_bits) - 1; }
  std::uint32_t mantissa_mask() const { return (1u << mantissa_bits) - 1; }
  std::uint32_t sign_bit() const { return 1u << (exponent_bits + mantissa_bits); }
  /// The largest finite magnitude's bit pattern.
  std::uint32_t max_finite() const {
    return has_infinity ? ((max_exponent_field() - 1) << mantissa_bits) | mantissa_mask()
                        : (max_exponent_field() << mantissa_bits) | (mantissa_mask() - 1);
  }
};

constexpr MiniFloat kF16{5, 10, true};
constexpr MiniFloat kBF16{8, 7, true};
constexpr MiniFloat kF8E4M3{4, 3, false};
constexpr MiniFloat kF8E5M2{5, 2, true};

constexpr int kDoubleMantissaBits = 52;
constexpr std::uint64_t kDoubleQuietBit = 1ull << 51;

/// Exact: every value of a MiniFloat is a double.
double minifloat_to_double(std::uint32_t bits, const MiniFloat& f) {
  const std::uint64_t sign = (bits & f.sign_bit()) ? 1ull << 63 : 0;
  const std::uint32_t exponent = (bits >> f.mantissa_bits) & f.max_exponent_field();
  const std::uint32_t mantissa = bits & f.mantissa_mask();
  const bool is_nan = f.has_infinity
                          ? exponent == f.max_exponent_field() && mantissa != 0
                          : exponent == f.max_exponent_field() && mantissa == f.mantissa_mask();
  if (is_nan) {
    // Keep the payload in the top mantissa bits, as hardware conversions between IEEE formats do;
    // an "fn" format's one NaN pattern carries none.
    const std::uint64_t payload = f.has_infinity ? static_cast<std::uint64_t>(mantissa)
                                                       << (kDoubleMantissaBits - f.mantissa_bits)
                                                 : 0;
    return std::bit_cast<double>(sign | 0x7ffull << 52 | kDoubleQuietBit | payload);
  }
  if (f.has_infinity && exponent == f.max_exponent_field()) {
    return std::bit_cast<double>(sign | 0x7ffull << 52);
  }
  const double magnitude =
      exponent == 0 ? std::ldexp(static_cast<double>(mantissa), 1 - f.bias() - f.mantissa_bits)
                    : std::ldexp(static_cast<double>(mantissa | (1u << f.mantissa_bits)),
                                 static_cast<int>(exponent) - f.bias() - f.mantissa_bits);
  return sign ? -magnitude : magnitude;
}

/// Rounds `value` to the nearest MiniFloat, ties to even, in one step.
std::uint32_t double_to_minifloat(double value, const MiniFloat& f) {
  const std::uint64_t bits = std::bit_cast<std::uint64_t>(value);
  const std::uint32_t sign = (bits >> 63) ? f.sign_bit() : 0;
  const auto exponent_field = static_cast<int>((bits >> 52) & 0x7ff);
  const std::uint64_t fraction = bits & ((1ull << 52) - 1);
  const std::uint32_t nan =
      f.has_infinity ? (f.max_exponent_field() << f.mantissa_bits) | (1u << (f.mantissa_bits - 1))
                     : (f.max_exponent_field() << f.mantissa_bits) | f.mantissa_mask();
  if (exponent_field == 0x7ff) {
    if (fraction == 0)
      return sign | (f.has_infinity ? f.max_exponent_field() << f.mantissa_bits : nan);
    if (!f.has_infinity) return sign | nan;
    const auto payload =
        static_cast<std::uint32_t>(fraction >> (kDoubleMantissaBits - f.mantissa_bits));
    return sign | nan | payload;
  }
  // Double subnormals are far below half the smallest subnormal of every MiniFloat.
  if (exponent_field == 0) return sign;
  const int exponent = exponent_field - 1023;
  const std::uint64_t significand = fraction | 1ull << 52;
  // Bits of the significand dropped: more below the normal range, where the result is subnormal.
  const int min_normal_exponent = 1 - f.bias();
  int shift = kDoubleMantissaBits - f.mantissa_bits;
  if (exponent < min_normal_exponent) shift += min_normal_exponent - exponent;
  if (shift > 53) return sign;
  std::uint64_t rounded = significand >> shift;
  const std::uint64_t remainder = significand & ((1ull << shift) - 1);
  const std::uint64_t half = 1ull << (shift - 1);
  if (remainder > half || (remainder == half && (rounded & 1))) ++rounded;
  // A carry out of the mantissa moves into the exponent field, as it should (subnormal to
  // normal, or to the next binade).
  const std::uint64_t biased_exponent =
      exponent < min_normal_exponent ? 0 : static_cast<std::uint64_t>(exponent + f.bias());
  const std::uint64_t magnitude = (biased_exponent << f.mantissa_bits) +
                                  (rounded - (biased_exponent ? 1ull << f.mantissa_bits : 0));
  // Rounded past the largest finite value: an infinity, or NaN where there is none (an "fn"
  // format, as ml_dtypes and torch convert to float8_e4m3fn).
  if (magnitude > f.max_finite()) {
    return sign | (f.has_infinity ? f.max_exponent_field() << f.mantissa_bits : nan);
  }
  return sign | static_cast<std::uint32_t>(magnitude);
}

// -- element access --

template <class T>
T load(const std::uint8_t* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

template <class T>
void store(std::uint8_t* p, T value) {
  std::memcpy(p, &value, sizeof(T));
}

const MiniFloat* minifloat_of(DType dtype) {
  switch (dtype) {
    case DType::f16:
      return &kF16;
    case DType::bf16:
      return &kBF16;
    case DType::f8_e4m3:
      return &kF8E4M3;
    case DType::f8_e5m2:
      return &kF8E5M2;
    default:
      return nullptr;
  }
}

double load_float(const std::uint8_t* p, DType dtype) {
  switch (dtype) {
    case DType::f64:
      return load<double>(p);
    case DType::f32:
      return load<float>(p);
    case DType::f16:
    case DType::bf16:
      return minifloat_to_double(load<std::uint16_t>(p), *minifloat_of(dtype));
    default:
      return minifloat_to_double(*p, *minifloat_of(dtype));
  }
}

void store_float(std::uint8_t* p, DType dtype, double value) {
  switch (dtype) {
    case DType::f64:
      store(p, value);
      break;
    case DType::f32:
      store(p, static_cast<float>(value));
      break;
    case DType::f16:
    case DType::bf16:
      store(p, static_cast<std::uint16_t>(double_to_minifloat(value, *minifloat_of(dtype))));
      break;
    default:
      *p = static_cast<std::uint8_t>(double_to_minifloat(value, *minifloat_of(dtype)));
  }
}

/// F32 -> BF16 by the usual bit trick (the same rounding as double_to_minifloat, faster).
void f32_to_bf16(const std::uint8_t* src, std::uint8_t* dst, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) {
    const auto bits = load<std::uint32_t>(src + 4 * i);
    std::uint32_t out;
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
      out = (bits >> 16) | 0x40;
    } else {
      out = (bits + 0x7fffu + ((bits >> 16) & 1)) >> 16;
    }
    store(dst + 2 * i, static_cast<std::uint16_t>(out));
  }
}

/// BF16 -> F32 is exact: the top half of the float.
void bf16_to_f32(const std::uint8_t* src, std::uint8_t* dst, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) {
    store(dst + 4 * i, static_cast<std::uint32_t>(load<std::uint16_t>(src + 2 * i)) << 16);
  }
}

// -- integers --

bool is_signed_integer(DType dtype) {
  return dtype == DType::i8 || dtype == DType::i16 || dtype == DType::i32 || dtype == DType::i64;
}

bool is_unsigned_integer(DType dtype) {
  return dtype == DType::u8 || dtype == DType::u16 || dtype == DType::u32 || dtype == DType::u64;
}

template <class Wide>
Wide load_integer(const std::uint8_t* p, DType dtype) {
  switch (dtype) {
    case DType::i8:
      return static_cast<Wide>(load<std::int8_t>(p));
    case DType::i16:
      return static_cast<Wide>(load<std::int16_t>(p));
    case DType::i32:
      return static_cast<Wide>(load<std::int32_t>(p));
    case DType::u8:
      return static_cast<Wide>(load<std::uint8_t>(p));
    case DType::u16:
      return static_cast<Wide>(load<std::uint16_t>(p));
    case DType::u32:
      return static_cast<Wide>(load<std::uint32_t>(p));
    default:
      return load<Wide>(p);
  }
}

template <class Wide>
void store_integer(std::uint8_t* p, DType dtype, Wide value) {
  switch (dtype) {
    case DType::i16:
      store(p, static_cast<std::int16_t>(value));
      break;
    case DType::i32:
      store(p, static_cast<std::int32_t>(value));
      break;
    case DType::u16:
      store(p, static_cast<std::uint16_t>(value));
      break;
    case DType::u32:
      store(p, static_cast<std::uint32_t>(value));
      break;
    default:
      store(p, value);
  }
}

template <class Wide>
void widen_integers(const std::uint8_t* src, DType from, std::uint8_t* dst, DType to,
                    std::size_t count) {
  const std::size_t in = dtype_size(from);
  const std::size_t out = dtype_size(to);
  for (std::size_t i = 0; i < count; ++i)
    store_integer<Wide>(dst + out * i, to, load_integer<Wide>(src + in * i, from));
}

}  // namespace

bool can_convert(DType from, DType to) {
  if (from == to || (is_floating_point(from) && is_floating_point(to))) return true;
  return dtype_size(to) > dtype_size(from) && ((is_signed_integer(from) && is_signed_integer(to)) ||
                                                (is_unsigned_integer(from) && is_unsigned_integer(to)));
}

Status convert_elements(const void* src, DType from, void* dst, DType to, std::size_t count) {
  if (!can_convert(from, to)) {
    return {ErrorCode::invalid_argument,
            "cannot convert " + std::string(dtype_name(from)) + " to " + std::string(dtype_name(to)) +
                ": only between floating types, or to a wider integer of the same "
                "signedness"};
  }
  const auto* in = static_cast<const std::uint8_t*>(src);
  auto* out = static_cast<std::uint8_t*>(dst);
  if (from == to) {
    if (src != dst && count > 0) std::memcpy(dst, src, count * dtype_size(from));
  } else if (from == DType::f32 && to == DType::bf16) {
    f32_to_bf16(in, out, count);
  } else if (from == DType::bf16 && to == DType::f32) {
    bf16_to_f32(in, out, count);
  } else if (is_floating_point(from)) {
    const std::size_t in_size = dtype_size(from);
    const std::size_t out_size = dtype_size(to);
    for (std::size_t i = 0; i < count; ++i) store_float(out + out_size * i, to, load_float(in + in_size * i, from));
  } else if (is_signed_integer(from)) {
    widen_integers<std::int64_t>(in, from, out, to, count);
  } else {
    widen_integers<std::uint64_t>(in, from, out, to, count);
  }
  return Status::ok();
}

}  // namespace stagehand
