#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <span>
#include <string>

namespace stagehand {

/// A tensor shape or an N-dimensional offset: a value type of up to kMaxRank dimensions. Up to
/// kInlineRank of them are held in place, with no allocation (40 bytes: every descriptor holds
/// three of them, and a save of 100,000 tensors copies its descriptors several times); more are
/// on the heap.
class Shape {
 public:
  static constexpr std::size_t kMaxRank = 8;
  static constexpr std::size_t kInlineRank = 4;

  // -- constructors --

  Shape() = default;
  /// @pre dims.size() <= kMaxRank
  Shape(std::initializer_list<std::int64_t> dims);
  /// @pre dims.size() <= kMaxRank
  explicit Shape(std::span<const std::int64_t> dims);
  Shape(const Shape& other) : Shape(other.dims()) {}
  Shape(Shape&& other) noexcept { take(other); }
  Shape& operator=(const Shape& other) {
    if (this != &other) *this = Shape(other);
    return *this;
  }
  Shape& operator=(Shape&& other) noexcept {
    if (this != &other) {
      release();
      take(other);
    }
    return *this;
  }
  ~Shape() { release(); }

  /// A shape of `rank` zeros (the origin offset).
  static Shape zeros(std::size_t rank);

  // -- properties --

  std::size_t rank() const { return rank_; }
  std::int64_t operator[](std::size_t i) const { return data()[i]; }
  std::int64_t& operator[](std::size_t i) { return data()[i]; }
  std::span<const std::int64_t> dims() const { return {data(), rank_}; }

  /// Product of the dimensions (1 for rank 0).
  std::int64_t numel() const;

  /// "[2, 3]".
  std::string to_string() const;

  friend bool operator==(const Shape& a, const Shape& b) {
    if (a.rank_ != b.rank_) return false;
    for (std::size_t i = 0; i < a.rank_; ++i) {
      if (a[i] != b[i]) return false;
    }
    return true;
  }
  friend bool operator<(const Shape& a, const Shape& b);

  /// For CAF's serialization (shapes travel in save plans and reports): kMaxRank dimensions and
  /// the rank, as when every shape held kMaxRank in place.
  template <class Inspector>
  friend typename Inspector::result_type inspect(Inspector& f, Shape& x) {
    std::array<std::int64_t, kMaxRank> dims{};
    std::size_t rank = x.rank_;
    for (std::size_t i = 0; i < rank; ++i) dims[i] = x[i];
    if constexpr (Inspector::reads_state) {
      return f(dims, rank);
    } else {
      auto result = f(dims, rank);
      x = Shape(std::span<const std::int64_t>(dims.data(), rank < kMaxRank ? rank : kMaxRank));
      return result;
    }
  }

 private:
  bool on_heap() const { return rank_ > kInlineRank; }
  const std::int64_t* data() const { return on_heap() ? heap_ : inline_.data(); }
  std::int64_t* data() { return on_heap() ? heap_ : inline_.data(); }
  void release() {
    if (on_heap()) delete[] heap_;
    rank_ = 0;
  }
  /// Takes `other`'s dimensions (its heap block, which leaves it empty). @pre this holds none
  void take(Shape& other) {
    rank_ = other.rank_;
    if (on_heap()) {
      heap_ = other.heap_;
      other.rank_ = 0;
    } else {
      inline_ = other.inline_;
    }
  }

  union {
    std::array<std::int64_t, kInlineRank> inline_{};
    std::int64_t* heap_;
  };
  std::uint32_t rank_ = 0;
};

inline std::ostream& operator<<(std::ostream& os, const Shape& s) { return os << s.to_string(); }

}  // namespace stagehand
