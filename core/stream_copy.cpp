// Large copies with non-temporal stores (stream_copy.hpp).
#include "stagehand/core/stream_copy.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#define STAGEHAND_STREAM_COPY_X86 1
#endif

namespace stagehand {

#ifdef STAGEHAND_STREAM_COPY_X86
namespace {

// Both copy `bytes` that start at a `dst` aligned to their vector width, a multiple of four
// vectors, and end with a store fence, so that the streamed stores are visible, in order, to
// whoever the caller hands the bytes to next.

__attribute__((target("avx2"))) void stream_avx2(std::uint8_t* dst, const std::uint8_t* src, std::size_t bytes) {
  for (std::size_t i = 0; i < bytes; i += 128) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 32));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 64));
    const __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 96), d);
  }
  _mm_sfence();
}

void stream_sse2(std::uint8_t* dst, const std::uint8_t* src, std::size_t bytes) {
  for (std::size_t i = 0; i < bytes; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  _mm_sfence();
}

bool has_avx2() {
  // Asked at the first copy, not in a static initializer, which may run before the CPU's
  // features are read (__builtin_cpu_init reads them if not).
  static const bool avx2 = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return avx2;
}

}  // namespace
#endif

void stream_copy(void* dst, const void* src, std::size_t bytes, std::size_t min_bytes) {
  stream_copy_with(dst, src, bytes, true, min_bytes);
}

void stream_copy_with(void* dst, const void* src, std::size_t bytes, bool avx2, std::size_t min_bytes) {
#ifdef STAGEHAND_STREAM_COPY_X86
  // Below 256 bytes the head and the groups of four vectors would not fit.
  if (bytes >= std::max<std::size_t>(min_bytes, 256)) {
    auto* d = static_cast<std::uint8_t*>(dst);
    const auto* s = static_cast<const std::uint8_t*>(src);
    avx2 = avx2 && has_avx2();
    const std::size_t width = avx2 ? 32 : 16;
    // Up to the first aligned destination byte, then whole groups of four vectors, then the rest.
    const std::size_t head = (width - reinterpret_cast<std::uintptr_t>(d) % width) % width;
    std::memcpy(d, s, head);
    const std::size_t body = (bytes - head) / (4 * width) * (4 * width);
    if (avx2) {
      stream_avx2(d + head, s + head, body);
    } else {
      stream_sse2(d + head, s + head, body);
    }
    std::memcpy(d + head + body, s + head + body, bytes - head - body);
    return;
  }
#else
  (void)avx2;
  (void)min_bytes;
#endif
  std::memcpy(dst, src, bytes);
}

}  // namespace stagehand
