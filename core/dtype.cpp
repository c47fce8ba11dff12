#include "stagehand/core/dtype.hpp"

#include <cmath>
#include <cstring>
#include <string>

namespace stagehand {

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f64:
    case DType::i64: return 8;
    case DType::f32:
    case DType::i32: return 4;
    case DType::bf16:
    case DType::f16:
    case DType::i16: return 2;
    case DType::i8:
    case DType::u8:
    case DType::boolean: return 1;
  }
  return 0;
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f64: return "F64";
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
    case DType::i64: return "I64";
    case DType::i32: return "I32";
    case DType::i16: return "I16";
    case DType::i8: return "I8";
    case DType::u8: return "U8";
    case DType::boolean: return "BOOL";
  }
  return "?";
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (DType dtype : kAllDTypes) {
    if (dtype_name(dtype) == name) return dtype;
  }
  return std::nullopt;
}

namespace {

float bits_to_float(std::uint32_t x) {
  float f = 0;
  std::memcpy(&f, &x, 4);
  return f;
}

std::uint32_t float_to_bits(float f) {
  std::uint32_t x = 0;
  std::memcpy(&x, &f, 4);
  return x;
}

float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    const float value = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -value : value;
  }
  if (exp == 31) return bits_to_float(sign | 0x7f800000u | (mant << 13));
  return bits_to_float(sign | ((exp + 112) << 23) | (mant << 13));
}

std::uint16_t float_to_half(float f) {
  const std::uint32_t x = float_to_bits(f);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds past 65504: inf
  if (abs < 0x38800000u) {
    // Subnormal (or zero) half: round |f| / 2^-24 to the nearest integer, ties to even.
    const float scaled = std::ldexp(bits_to_float(abs), 24);
    return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(std::nearbyint(scaled)));
  }
  std::uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  return static_cast<std::uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
}

float bf16_to_float(std::uint16_t h) { return bits_to_float(static_cast<std::uint32_t>(h) << 16); }

std::uint16_t float_to_bf16(float f) {
  std::uint32_t x = float_to_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>(x >> 16);
}

bool is_float(DType d) { return d == DType::f64 || d == DType::f32 || d == DType::f16 || d == DType::bf16; }

double load_float(const std::uint8_t* p, DType d) {
  switch (d) {
    case DType::f64: {
      double v = 0;
      std::memcpy(&v, p, 8);
      return v;
    }
    case DType::f32: {
      float v = 0;
      std::memcpy(&v, p, 4);
      return v;
    }
    case DType::f16:
    case DType::bf16: {
      std::uint16_t h = 0;
      std::memcpy(&h, p, 2);
      return d == DType::f16 ? half_to_float(h) : bf16_to_float(h);
    }
    default: return 0;
  }
}

void store_float(double v, std::uint8_t* p, DType d) {
  switch (d) {
    case DType::f64: std::memcpy(p, &v, 8); return;
    case DType::f32: {
      const auto f = static_cast<float>(v);
      std::memcpy(p, &f, 4);
      return;
    }
    case DType::f16:
    case DType::bf16: {
      // Every source value is exact in float unless it is an f64: round f64 once, to the target.
      const auto f = static_cast<float>(v);
      const std::uint16_t h = d == DType::f16 ? float_to_half(f) : float_to_bf16(f);
      std::memcpy(p, &h, 2);
      return;
    }
    default: return;
  }
}

}  // namespace

Status convert_elements(const void* src, DType from, void* dst, DType to, std::size_t count) {
  if (from == to) {
    if (count > 0) std::memcpy(dst, src, count * dtype_size(from));
    return Status::ok();
  }
  if (!is_float(from) || !is_float(to)) {
    return Status{ErrorCode::invalid_argument, "cannot convert " + std::string(dtype_name(from)) + " to " +
                                                   std::string(dtype_name(to))};
  }
  const auto* s = static_cast<const std::uint8_t*>(src);
  auto* d = static_cast<std::uint8_t*>(dst);
  const std::size_t in = dtype_size(from);
  const std::size_t out = dtype_size(to);
  for (std::size_t i = 0; i < count; ++i) store_float(load_float(s + i * in, from), d + i * out, to);
  return Status::ok();
}

}  // namespace stagehand
