// stagehand-first-touch [MIB] [ROUNDS]: seconds to fault in a fresh host buffer of MIB MiB (default
// 1024), four ways, interleaved round by round: madvise(MADV_HUGEPAGE) then a touch of every 4 KiB
// page (what host_alloc and StagingPool::reserve do for large buffers), 4 KiB pages touched, 4 KiB
// pages with madvise(MADV_POPULATE_WRITE), and MADV_HUGEPAGE with MADV_POPULATE_WRITE. The cost
// the first async save of a process pays for its staging memory (bench/first_async_stall.py).
#include <sys/mman.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

namespace {

double first_touch_s(std::size_t bytes, bool huge, bool populate) {
  const auto start = std::chrono::steady_clock::now();
  auto* p = static_cast<volatile char*>(std::aligned_alloc(2u << 20, bytes));
  if (p == nullptr) return -1;
  if (huge) ::madvise(const_cast<char*>(p), bytes, MADV_HUGEPAGE);
  if (!populate || ::madvise(const_cast<char*>(p), bytes, MADV_POPULATE_WRITE) != 0) {
    for (std::size_t i = 0; i < bytes; i += 4096) p[i] = 1;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::free(const_cast<char*>(p));
  return seconds;
}

}  // namespace

int main(int argc, char** argv) {
  const std::size_t mib = argc > 1 ? std::stoul(argv[1]) : 1024;
  const int rounds = argc > 2 ? std::stoi(argv[2]) : 4;
  const std::size_t bytes = ((mib << 20) + (2u << 20) - 1) / (2u << 20) * (2u << 20);
  const char* names[] = {"hugepage+touch", "4k+touch", "4k+populate_write", "hugepage+populate_write"};
  for (int r = 0; r < rounds; ++r) {
    for (int m = 0; m < 4; ++m) {
      std::printf("{\"round\": %d, \"mode\": \"%s\", \"mib\": %zu, \"first_touch_s\": %.3f}\n", r, names[m], mib,
                  first_touch_s(bytes, m == 0 || m == 3, m >= 2));
    }
  }
  return 0;
}
