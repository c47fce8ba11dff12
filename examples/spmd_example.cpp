// The Checkpointer in one process per rank, as torchrun or scripts/launch-local.sh start a job:
// every rank saves its own shard of a column-split weight, collectively. The README's
// "Embedding" section shows the part between the markers; the test suite runs it in 4
// processes and checks that the README and this file agree.
//
//   scripts/launch-local.sh 4 build/bin/stagehand-spmd-example /tmp/spmd-checkpoints
#include <cstdio>
#include <vector>

#include "stagehand/actors/checkpointer.hpp"

using namespace stagehand;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CHECKPOINT_ROOT (one process per rank: RANK, WORLD_SIZE set)\n", argv[0]);
    return 2;
  }
  const std::string root = argv[1];
  auto env = CheckpointerOptions::from_environment(root);
  if (!env.is_ok()) {
    std::fprintf(stderr, "%s\n", env.status().to_string().c_str());
    return 2;
  }
  const int rank = env->rank, world = env->world_size;
  std::vector<float> w(64 * 16, static_cast<float>(rank));  // this rank's 16 columns of a 64 x 16*world weight
  // [spmd]
  Checkpointer ckpt(*env);  // env = CheckpointerOptions::from_environment(root): RANK, WORLD_SIZE, ...
  StateDict state;  // this rank's shard: columns 16*rank .. 16*rank+15 of "model.w"
  state.add("model.w", *Tensor::from_blob(w.data(), DType::f32, Shape{64, 16}, Device::host()), Shape{64, 16 * world},
            Shape{0, 16 * rank});
  state.objects["scheduler"] = "{\"step\":1}";        // small objects: JSON text
  Status saved = ckpt.save(1, state);                // collective: committed on every rank on return
  auto pending = ckpt.async_save(2, state);          // returns once this rank's bytes are copied
  w[0] = -1.0f;                                      // safe: step 2 holds the old value
  Status committed = pending.is_ok() ? pending->wait() : pending.status();
  Status loaded = ckpt.load(state, root);            // the step the tracker names, in any layout
  // [spmd]
  const bool values_back = w[0] == static_cast<float>(rank) && state.objects["scheduler"] == "{\"step\":1}";
  std::printf("rank %d of %d: save %s, async save %s, load %s, values %s\n", rank, world, saved.to_string().c_str(),
              committed.to_string().c_str(), loaded.to_string().c_str(), values_back ? "equal" : "DIFFER");
  return saved.is_ok() && committed.is_ok() && loaded.is_ok() && values_back ? 0 : 1;
}
