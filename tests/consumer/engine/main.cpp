// Save, verify and load with the engine alone (no actors): one rank, sync.
//
//   engine_consumer CHECKPOINT_ROOT
#include <cstdio>
#include <vector>

#include <stagehand/checkpoint/save/in_process_save.hpp>
#include <stagehand/checkpoint/load/loader.hpp>
#include <stagehand/checkpoint/save/save_engine.hpp>
#include <stagehand/checkpoint/load/verify.hpp>

using namespace stagehand;

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const std::string root = argv[1];
  std::vector<float> w(1024, 1.5f);
  StateDict state;
  state.add_full("w", *Tensor::from_blob(w.data(), DType::f32, Shape{32, 32}, Device::host()));
  auto engine = SaveEngine::create(0, {});
  if (!engine.is_ok()) return 1;
  auto saved = save_checkpoint_in_process(root, 1, {engine->get()}, {&state});
  auto verified = verify_checkpoint(root + "/global_step_1");
  w.assign(w.size(), 0.0f);
  Status loaded = load_checkpoint(root + "/global_step_1", state);
  const bool ok = saved.is_ok() && verified.is_ok() && verified->ok() && loaded.is_ok() && w[5] == 1.5f;
  std::printf("engine consumer: save %s, verify %s, load %s\n", saved.status().to_string().c_str(),
              verified.is_ok() && verified->ok() ? "ok" : "failed", loaded.to_string().c_str());
  return ok ? 0 : 1;
}
