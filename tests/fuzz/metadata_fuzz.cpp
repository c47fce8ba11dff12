// Fuzzes metadata_from_json (parsing and validate_metadata). What it accepts must serialize with
// metadata_to_json into text that parses back to the same metadata.
#include <cstddef>
#include <cstdint>
#include <string>

#include "stagehand/checkpoint/format/format.hpp"

using namespace stagehand;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto metadata = metadata_from_json(text, "metadata.json");
  if (!metadata.is_ok()) return 0;
  const std::string json = metadata_to_json(*metadata);
  auto again = metadata_from_json(json, "metadata.json");
  if (!again.is_ok() || metadata_to_json(*again) != json) __builtin_trap();
  return 0;
}
