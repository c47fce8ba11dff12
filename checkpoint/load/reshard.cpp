#include "stagehand/checkpoint/load/reshard.hpp"

#include <algorithm>

#include "stagehand/core/stream_copy.hpp"

namespace stagehand {

Shape row_major_strides(const Shape& shape) {
  const std::size_t rank = shape.rank();
  Shape stride = Shape::zeros(rank);
  if (rank == 0) return stride;
  stride[rank - 1] = 1;
  for (std::size_t i = rank - 1; i > 0; --i)
    stride[i - 1] = stride[i] * shape[i];
  return stride;
}

ChunkMeta chunk_of(const ShardedTensorDesc& block) {
  ChunkMeta chunk;
  chunk.offsets = block.global_offset;
  chunk.shape = block.local_shape;
  return chunk;
}

std::int64_t overlap_numel(const ChunkMeta& chunk, const ShardedTensorDesc& block) {
  std::int64_t n = 1;
  for (std::size_t i = 0; i < block.local_shape.rank(); ++i) {
    const std::int64_t lo = std::max(chunk.offsets[i], block.global_offset[i]);
    const std::int64_t hi =
        std::min(chunk.offsets[i] + chunk.shape[i], block.global_offset[i] + block.local_shape[i]);
    if (lo >= hi) return 0;
    n *= hi - lo;
  }
  return n;
}

std::optional<std::int64_t> contiguous_offset(const ChunkMeta& chunk,
                                              const ShardedTensorDesc& block) {
  const std::size_t rank = block.local_shape.rank();
  std::size_t narrower = 0;  // one past the last dimension where the chunk is narrower
  for (std::size_t i = 0; i < rank; ++i) {
    if (chunk.offsets[i] < block.global_offset[i] ||
        chunk.offsets[i] + chunk.shape[i] > block.global_offset[i] + block.local_shape[i]) {
      return std::nullopt;
    }
    if (chunk.shape[i] != block.local_shape[i]) narrower = i + 1;
  }
  for (std::size_t i = 0; i + 1 < narrower; ++i) {
    if (chunk.shape[i] != 1) return std::nullopt;
  }
  const Shape stride = row_major_strides(block.local_shape);
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < rank; ++i)
    offset += (chunk.offsets[i] - block.global_offset[i]) * stride[i];
  return offset;
}

bool copy_overlap_part(const ChunkMeta& chunk, const ShardedTensorDesc& block, std::size_t elem,
                       std::int64_t first, std::int64_t last, const std::uint8_t* src,
                       std::uint8_t* dst, Device device, const CopyStream* stream, bool cold) {
  auto copy = [&](std::int64_t from, std::int64_t to, std::int64_t dst_elem) {
    const std::uint8_t* from_ptr = src + static_cast<std::size_t>(from - first) * elem;
    std::uint8_t* to_ptr = dst + static_cast<std::size_t>(dst_elem) * elem;
    const auto bytes = static_cast<std::size_t>(to - from) * elem;
    if (stream != nullptr && device.is_cuda()) {
      return copy_engine().copy_async(*stream, CopyKind::host_to_device, to_ptr, from_ptr, bytes).is_ok();
    }
    if (cold && !device.is_cuda()) {
      stream_copy(to_ptr, from_ptr, bytes, kColdCopyMinBytes);
      return true;
    }
    return copy_from_host(device, from_ptr, to_ptr, bytes);
  };
  if (auto offset = contiguous_offset(chunk, block)) {
    const std::int64_t end = std::min(last, chunk.shape.numel());
    return first >= end || copy(first, end, *offset + first);
  }
  const std::size_t rank = block.local_shape.rank();
  Shape lo = Shape::zeros(rank);
  Shape hi = Shape::zeros(rank);
  for (std::size_t i = 0; i < rank; ++i) {
    lo[i] = std::max(chunk.offsets[i], block.global_offset[i]);
    hi[i] =
        std::min(chunk.offsets[i] + chunk.shape[i], block.global_offset[i] + block.local_shape[i]);
    if (lo[i] >= hi[i]) return true;
  }
  const Shape src_stride = row_major_strides(chunk.shape);
  const Shape dst_stride = row_major_strides(block.local_shape);
  const std::int64_t row = hi[rank - 1] - lo[rank - 1];
  Shape idx = lo;
  for (;;) {
    std::int64_t s = 0;
    std::int64_t d = 0;
    for (std::size_t i = 0; i < rank; ++i) {
      s += (idx[i] - chunk.offsets[i]) * src_stride[i];
      d += (idx[i] - block.global_offset[i]) * dst_stride[i];
    }
    // Rows come in ascending order in the chunk.
    if (s >= last) return true;
    const std::int64_t from = std::max(s, first);
    const std::int64_t to = std::min(s + row, last);
    if (from < to && !copy(from, to, d + (from - s))) return false;
    // Advance the outer index (every dimension but the last), odometer style.
    std::size_t i = rank - 1;
    for (;;) {
      if (i == 0) return true;
      --i;
      if (++idx[i] < hi[i]) break;
      idx[i] = lo[i];
    }
  }
}

}  // namespace stagehand
