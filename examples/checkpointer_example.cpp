// The Checkpointer facade: save, async save and load of your own tensors in a few lines.
// The README's "Embedding" section shows the part between the markers; the test suite runs it
// and checks that the README and this file agree.
//
//   build/bin/stagehand-checkpointer-example /tmp/my-checkpoints
#include <cstdio>
#include <vector>

#include "stagehand/actors/checkpointer.hpp"

int main(int argc, char** argv) {
  const std::string root = argc > 1 ? argv[1] : "checkpoints/checkpointer-example";
  std::vector<float> weights(1024, 0.5f);  // your model's memory
  // [facade]
  stagehand::StateDict state;
  state.add_full("model.weight", *stagehand::Tensor::from_blob(weights.data(), stagehand::DType::f32,
                                                               stagehand::Shape{32, 32}, stagehand::Device::host()));
  stagehand::Checkpointer ckpt({.root = root, .thread_count = 4});
  stagehand::Status saved = ckpt.save(1, state);  // sync: committed on return
  auto pending = ckpt.async_save(2, state);       // returns once the bytes are copied
  weights[0] = 7.0f;                              // safe: step 2 holds the old value
  stagehand::Status committed = pending.is_ok() ? pending->wait() : pending.status();
  stagehand::Status loaded = ckpt.load(state, root);  // the root: the step its tracker names
  // [facade]
  std::printf("save %s, async save %s, load %s, weights[0] after load %.1f\n", saved.to_string().c_str(),
              committed.to_string().c_str(), loaded.to_string().c_str(), weights[0]);
  return saved.is_ok() && committed.is_ok() && loaded.is_ok() && weights[0] == 0.5f ? 0 : 1;
}
