// Fuzzes parse_tracker, the parser read_tracker applies to latest_ckpt_global_step.txt. A step it
// accepts is not negative and reads back from the text the commit writes for it.
#include <cstddef>
#include <cstdint>
#include <string>

#include "stagehand/checkpoint/store/checkpoint_store.hpp"

using namespace stagehand;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto step = parse_tracker(std::string(reinterpret_cast<const char*>(data), size), "tracker");
  if (!step.is_ok()) return 0;
  if (*step < 0) __builtin_trap();
  auto again = parse_tracker(std::to_string(*step) + "\n", "tracker");
  if (!again.is_ok() || *again != *step) __builtin_trap();
  return 0;
}
