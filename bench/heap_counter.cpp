// Replaces the global operator new and delete of stagehand-bench to count the bytes they hold.
#include "bench/heap_counter.hpp"

#include <malloc.h>

#include <atomic>
#include <cstdlib>
#include <new>

namespace stagehand::bench {

namespace {

std::atomic<std::int64_t> live{0};
std::atomic<std::int64_t> peak{0};

void* counted_alloc(std::size_t bytes) {
  void* p = std::malloc(bytes == 0 ? 1 : bytes);
  if (p == nullptr) throw std::bad_alloc();
  const std::int64_t now = live += static_cast<std::int64_t>(malloc_usable_size(p));
  for (std::int64_t seen = peak.load(); now > seen && !peak.compare_exchange_weak(seen, now);) {
  }
  return p;
}

void counted_free(void* p) noexcept {
  if (p == nullptr) return;
  live -= static_cast<std::int64_t>(malloc_usable_size(p));
  std::free(p);
}

}  // namespace

std::int64_t heap_bytes_now() {
  return live.load();
}
std::int64_t heap_bytes_peak() {
  return peak.load();
}
void reset_heap_peak() {
  peak = live.load();
}

}  // namespace stagehand::bench

void* operator new(std::size_t bytes) {
  return stagehand::bench::counted_alloc(bytes);
}
void* operator new[](std::size_t bytes) {
  return stagehand::bench::counted_alloc(bytes);
}
void operator delete(void* p) noexcept {
  stagehand::bench::counted_free(p);
}
void operator delete[](void* p) noexcept {
  stagehand::bench::counted_free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  stagehand::bench::counted_free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  stagehand::bench::counted_free(p);
}
