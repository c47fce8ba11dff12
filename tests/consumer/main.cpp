// Saves and loads the consumer's own tensors (its memory, wrapped with Tensor::from_blob) through
// Stagehand's Checkpointer, sync and async, and checks every value after the load.
#include <cstdio>
#include <string>
#include <vector>

#include <stagehand/actors/checkpointer.hpp>

#include "core/status.hpp"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: consumer CHECKPOINT_ROOT\n");
    return 2;
  }
  const std::string root = argv[1];
  consumer::Status own = consumer::Status::fine;
  std::vector<float> embedding(4096);
  std::vector<std::int64_t> counters(8);
  for (std::size_t i = 0; i < embedding.size(); ++i) embedding[i] = 0.25f * static_cast<float>(i);
  for (std::size_t i = 0; i < counters.size(); ++i) counters[i] = static_cast<std::int64_t>(i) * 1000;

  stagehand::StateDict state;
  state.add_full("embedding", *stagehand::Tensor::from_blob(embedding.data(), stagehand::DType::f32,
                                                            stagehand::Shape{64, 64}, stagehand::Device::host()));
  state.add_full("counters", *stagehand::Tensor::from_blob(counters.data(), stagehand::DType::i64,
                                                           stagehand::Shape{8}, stagehand::Device::host()));
  state.objects["consumer.epoch"] = "3";
  const std::vector<float> saved_embedding = embedding;
  const std::vector<std::int64_t> saved_counters = counters;
  int failures = 0;
  auto check = [&](const char* what, const stagehand::Status& st) {
    std::printf("%-12s %s\n", what, st.to_string().c_str());
    if (!st.is_ok()) ++failures;
  };
  {
    stagehand::Checkpointer ckpt({.root = root, .thread_count = 2});
    check("save", ckpt.save(1, state));
    auto pending = ckpt.async_save(2, state);
    check("async_save", pending.status());
    embedding.assign(embedding.size(), -1.0f);  // after the copy: step 2 keeps the saved values
    counters.assign(counters.size(), -1);
    state.objects["consumer.epoch"] = "0";
    if (pending.is_ok()) check("wait", pending->wait());
    check("load", ckpt.load(state, root));
  }
  if (embedding != saved_embedding || counters != saved_counters || state.objects["consumer.epoch"] != "3") {
    std::printf("values after the load differ from the saved ones\n");
    ++failures;
  }
  std::printf("consumer: %s\n", failures == 0 && own == consumer::Status::fine ? "ok" : "FAILED");
  return failures == 0 ? 0 : 1;
}
