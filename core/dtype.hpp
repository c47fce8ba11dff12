#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string_view>

#include "stagehand/core/status.hpp"

namespace stagehand {

/// Element types a checkpoint can hold. Names follow the safetensors format.
enum class DType : std::uint8_t { f64, f32, bf16, f16, i64, i32, i16, i8, u8, boolean };

/// All dtypes, for tests that loop over every one.
inline constexpr DType kAllDTypes[] = {DType::f64, DType::f32, DType::bf16, DType::f16, DType::i64,
                                       DType::i32, DType::i16, DType::i8,   DType::u8,  DType::boolean};

/// Bytes per element.
std::size_t dtype_size(DType dtype);

/// The safetensors name ("F32", "BF16", ...).
std::string_view dtype_name(DType dtype);

/// Parses a safetensors name; nullopt when unknown.
std::optional<DType> dtype_from_name(std::string_view name);

/// Converts `count` elements from `from` to `to`. Floating-point types convert among each other
/// with round-to-nearest-even (NaN stays NaN); the same dtype is a copy; anything else is
/// invalid_argument naming both dtypes. `src` and `dst` must not overlap.
Status convert_elements(const void* src, DType from, void* dst, DType to, std::size_t count);

inline std::ostream& operator<<(std::ostream& os, DType dtype) { return os << dtype_name(dtype); }

}  // namespace stagehand
