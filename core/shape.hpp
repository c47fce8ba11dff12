#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <span>
#include <string>

namespace stagehand {

/// A tensor shape or an N-dimensional offset: a value type with a fixed capacity, no allocation.
class Shape {
 public:
  static constexpr std::size_t kMaxRank = 8;

  // -- constructors --

  Shape() = default;
  /// @pre dims.size() <= kMaxRank
  Shape(std::initializer_list<std::int64_t> dims);
  /// @pre dims.size() <= kMaxRank
  explicit Shape(std::span<const std::int64_t> dims);

  /// A shape of `rank` zeros (the origin offset).
  static Shape zeros(std::size_t rank);

  // -- properties --

  std::size_t rank() const { return rank_; }
  std::int64_t operator[](std::size_t i) const { return dims_[i]; }
  std::int64_t& operator[](std::size_t i) { return dims_[i]; }
  std::span<const std::int64_t> dims() const { return {dims_.data(), rank_}; }

  /// Product of the dimensions (1 for rank 0).
  std::int64_t numel() const;

  /// "[2, 3]".
  std::string to_string() const;

  friend bool operator==(const Shape& a, const Shape& b) {
    if (a.rank_ != b.rank_) return false;
    for (std::size_t i = 0; i < a.rank_; ++i) {
      if (a.dims_[i] != b.dims_[i]) return false;
    }
    return true;
  }
  friend bool operator<(const Shape& a, const Shape& b);

  /// For CAF's serialization (shapes travel in save plans and reports).
  template <class Inspector>
  friend typename Inspector::result_type inspect(Inspector& f, Shape& x) {
    return f(x.dims_, x.rank_);
  }

 private:
  std::array<std::int64_t, kMaxRank> dims_{};
  std::size_t rank_ = 0;
};

inline std::ostream& operator<<(std::ostream& os, const Shape& s) { return os << s.to_string(); }

}  // namespace stagehand
