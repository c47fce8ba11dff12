// An outside trainer of one process per rank, as it would use Stagehand: tensor 2 x data
// WORLD_SIZE/2, a column-split weight replicated over the data-parallel ranks, fp32 moments
// sharded over every rank, a shared scheduler object and a per-rank RNG state. Saves sync, then
// async, then loads into zeros and checks every value. Run by scripts/consumer-check.sh in 4
// processes (scripts/launch-local.sh 4 consumer_spmd ROOT).
#include <cstdio>
#include <string>
#include <vector>

#include <stagehand/actors/checkpointer.hpp>

using namespace stagehand;

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  auto options = CheckpointerOptions::from_environment(argv[1]);
  if (!options.is_ok() || options->world_size % 2 != 0) {
    std::fprintf(stderr, "needs RANK and an even WORLD_SIZE: %s\n", options.status().to_string().c_str());
    return 2;
  }
  const int rank = options->rank, tp = rank % 2, dp = rank / 2, dps = options->world_size / 2;
  const std::int64_t rows = 64, cols = 32;  // this rank's block of a 64 x 64 weight
  std::vector<float> w(rows * cols), m(rows / dps * cols);
  auto fill = [&](float base) {
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = base + static_cast<float>(tp * 10000 + i);
    for (std::size_t i = 0; i < m.size(); ++i) m[i] = -base - static_cast<float>(rank * 10000 + i);
  };
  fill(1.0f);
  StateDict state;
  state.add("model.w", *Tensor::from_blob(w.data(), DType::f32, Shape{rows, cols}, Device::host()), Shape{rows, 2 * cols},
            Shape{0, cols * tp}, /*replica_id=*/dp);
  state.add("optim.exp_avg.model.w", *Tensor::from_blob(m.data(), DType::f32, Shape{rows / dps, cols}, Device::host()),
            Shape{rows, 2 * cols}, Shape{rows / dps * dp, cols * tp});
  state.objects["scheduler"] = "{\"lr\":0.001}";
  state.objects["rng.rank" + std::to_string(rank)] = "{\"seed\":" + std::to_string(rank) + "}";

  Checkpointer ckpt(*options);
  Status saved = ckpt.save(1, state);
  auto pending = ckpt.async_save(2, state);
  fill(5.0f);  // the next step's values: step 2 holds the old ones
  Status committed = pending.is_ok() ? pending->wait() : pending.status();
  fill(0.0f);
  for (auto& [name, value] : state.objects) value = "null";
  Status loaded = ckpt.load(state, argv[1]);
  std::vector<float> wa = w, ma = m;
  fill(1.0f);
  const bool equal = wa == w && ma == m && state.objects["scheduler"] == "{\"lr\":0.001}" &&
                     state.objects["rng.rank" + std::to_string(rank)] == "{\"seed\":" + std::to_string(rank) + "}";
  std::printf("consumer_spmd rank %d: save %s, async save %s, load %s, values %s\n", rank, saved.to_string().c_str(),
              committed.to_string().c_str(), loaded.to_string().c_str(), equal ? "equal" : "DIFFER");
  std::fflush(stdout);  // before the Checkpointer closes: a rank stuck closing has still said how it did
  return saved.is_ok() && committed.is_ok() && loaded.is_ok() && equal ? 0 : 1;
}
