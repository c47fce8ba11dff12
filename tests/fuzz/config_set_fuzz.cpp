// Fuzzes the `--set` overrides of load_config_string: each line of the input is one
// "dotted.key=value" override, applied on top of an example configuration.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "stagehand/config/load.hpp"
#include "stagehand/config/rules.hpp"

using namespace stagehand;

namespace {

constexpr const char* kBase = R"(trainer:
  kind: sync
  total_steps: 4
  ckpt_path: /tmp/ckpt
  ckpt_interval: 2
megatron_config:
  async_dist_ckpt_save: true
  ckpt_save_thread_count: 2
parallel:
  tensor_parallel: 2
  data_parallel: 1
)";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::string> overrides;
  std::string line;
  for (std::size_t i = 0; i < size; ++i) {
    if (data[i] == '\n') {
      overrides.push_back(line);
      line.clear();
    } else {
      line.push_back(static_cast<char>(data[i]));
    }
  }
  if (!line.empty()) overrides.push_back(line);
  auto config = load_config_string(kBase, "base.yaml", overrides);
  if (config.is_ok() && !validate_config(*config).is_ok()) __builtin_trap();
  return 0;
}
