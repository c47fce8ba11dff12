#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string_view>

#include "stagehand/core/status.hpp"

namespace stagehand {

/// Element types a checkpoint can hold. Names follow the safetensors format. New values go at
/// the end, so that a dtype's number stays the same in serialized messages.
enum class DType : std::uint8_t {
  f64,
  f32,
  bf16,
  f16,
  i64,
  i32,
  i16,
  i8,
  u8,
  boolean,
  /// FP8 with 4 exponent and 3 mantissa bits, the OCP "fn" variant (torch.float8_e4m3fn): no
  /// infinities, one NaN pattern per sign (S.1111.111), largest finite value 448.
  f8_e4m3,
  /// FP8 with 5 exponent and 2 mantissa bits (torch.float8_e5m2): IEEE-like, with infinities.
  f8_e5m2,
  u16,
  u32,
  u64,
};

/// All dtypes, for tests that loop over every one.
inline constexpr DType kAllDTypes[] = {DType::f64, DType::f32,     DType::bf16,    DType::f16,
                                       DType::i64, DType::i32,     DType::i16,     DType::i8,
                                       DType::u8,  DType::boolean, DType::f8_e4m3, DType::f8_e5m2,
                                       DType::u16, DType::u32,     DType::u64};

/// Bytes per element.
std::size_t dtype_size(DType dtype);

/// The safetensors name ("F32", "BF16", "F8_E4M3", ...).
std::string_view dtype_name(DType dtype);

/// Parses a safetensors name; nullopt when unknown.
std::optional<DType> dtype_from_name(std::string_view name);

/// True for F64, F32, F16, BF16, F8_E4M3 and F8_E5M2.
bool is_floating_point(DType dtype);

/// Whether convert_elements converts `from` to `to` (see there).
bool can_convert(DType from, DType to);

/// Converts `count` elements of `from` at `src` into `to` at `dst` (`count` x dtype_size(to)
/// bytes of room). Neither pointer needs any alignment.
///
/// - The same dtype: the bytes are copied.
/// - Between floating types: the value is rounded once, to nearest, ties to even. Values that
///   overflow F16, BF16 or F8_E5M2 become infinities; F8_E4M3, which has none, makes them NaN
///   with their sign, as ml_dtypes and torch do: every |x| > 464 (464, halfway between 448 and
///   the NaN pattern, rounds to even, to 448), and infinities. NaN stays NaN with its sign (and
///   the top bits of its payload where the target has room for them).
/// - An integer to a wider integer of the same signedness (I8 -> I32, U16 -> U64): exact.
/// - Anything else (narrowing integers, integer <-> float, BOOL to another type) is
///   invalid_argument naming both dtypes, and nothing is written.
/// @pre src and dst do not overlap unless from == to and src == dst.
Status convert_elements(const void* src, DType from, void* dst, DType to, std::size_t count);

inline std::ostream& operator<<(std::ostream& os, DType dtype) {
  return os << dtype_name(dtype);
}

}  // namespace stagehand
