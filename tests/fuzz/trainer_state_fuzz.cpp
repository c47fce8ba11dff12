// Fuzzes trainer_state_from_json. What it accepts must serialize with trainer_state_to_json into
// text that parses back to the same state.
#include <cstddef>
#include <cstdint>
#include <string>

#include "stagehand/checkpoint/format/trainer_state.hpp"

using namespace stagehand;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto state = trainer_state_from_json(text, "trainer_state.json");
  if (!state.is_ok()) return 0;
  const std::string json = trainer_state_to_json(*state);
  auto again = trainer_state_from_json(json, "trainer_state.json");
  if (!again.is_ok() || trainer_state_to_json(*again) != json) __builtin_trap();
  return 0;
}
