// Fuzzes load_config_string with the input as the YAML text. What it accepts passes
// validate_config.
#include <cstddef>
#include <cstdint>
#include <string>

#include "stagehand/config/load.hpp"
#include "stagehand/config/rules.hpp"

using namespace stagehand;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto config =
      load_config_string(std::string(reinterpret_cast<const char*>(data), size), "fuzz.yaml");
  if (config.is_ok() && !validate_config(*config).is_ok()) __builtin_trap();
  return 0;
}
