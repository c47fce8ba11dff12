#include "stagehand/core/shape.hpp"

#include <algorithm>
#include <cassert>

namespace stagehand {

Shape::Shape(std::initializer_list<std::int64_t> dims)
    : Shape(std::span<const std::int64_t>(dims.begin(), dims.size())) {}

Shape::Shape(std::span<const std::int64_t> dims) : rank_(static_cast<std::uint32_t>(dims.size())) {
  assert(dims.size() <= kMaxRank);
  if (on_heap()) heap_ = new std::int64_t[rank_];
  std::copy(dims.begin(), dims.end(), data());
}

Shape Shape::zeros(std::size_t rank) {
  const std::array<std::int64_t, kMaxRank> origin{};
  return Shape(std::span<const std::int64_t>(origin.data(), rank));
}

std::int64_t Shape::numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : dims()) n *= d;
  return n;
}

std::string Shape::to_string() const {
  std::string out = "[";
  for (std::size_t i = 0; i < rank_; ++i) {
    if (i > 0) out += ", ";
    out += std::to_string((*this)[i]);
  }
  return out + "]";
}

bool operator<(const Shape& a, const Shape& b) {
  return std::lexicographical_compare(a.dims().begin(), a.dims().end(), b.dims().begin(),
                                      b.dims().end());
}

}  // namespace stagehand
