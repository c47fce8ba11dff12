// A minimal trainer of your own that embeds Stagehand: it registers its own tensors through the
// Model interface, trains through the WorkerDispatch, and saves (async), finalizes and loads
// through the dispatch's blocking client; underneath, Workers and their MegatronStrategy actors.
//
//   build/bin/stagehand-embed-example /tmp/my-checkpoints
#include <caf/all.hpp>

#include <cstdio>
#include <numeric>

#include "stagehand/actors/dispatch_client.hpp"
#include "stagehand/actors/messages.hpp"

using namespace stagehand;

namespace {

/// Your model: here each of two ranks holds half of a [4, 8] f32 weight and a step counter.
class MyModel final : public Model {
 public:
  explicit MyModel(int rank) : rank_(rank), state_(std::make_shared<StateDict>()) {
    weight_ = *Tensor::empty(DType::f32, Shape{2, 8}, default_device(rank));
    std::vector<float> init(16);
    std::iota(init.begin(), init.end(), 16.0f * static_cast<float>(rank));
    (void)weight_.copy_from_host(init.data());
    state_->add("my.weight", weight_, Shape{4, 8}, Shape{2 * rank, 0});
    state_->objects["my.step.rank" + std::to_string(rank)] = "0";
  }

  std::shared_ptr<StateDict> state() override { return state_; }

  Result<StepMetrics> train_step(std::int64_t step, Objective, const std::vector<std::int32_t>&) override {
    std::vector<float> host(16);
    SH_RETURN_IF_ERROR(weight_.copy_to_host(host.data()));
    for (auto& v : host) v += 1.0f;
    SH_RETURN_IF_ERROR(weight_.copy_from_host(host.data()));
    state_->objects["my.step.rank" + std::to_string(rank_)] = std::to_string(step);
    return StepMetrics{};
  }

  Result<double> evaluate() override {
    std::vector<float> host(16);
    SH_RETURN_IF_ERROR(weight_.copy_to_host(host.data()));
    return static_cast<double>(std::accumulate(host.begin(), host.end(), 0.0f));
  }

  Status export_weights(std::int64_t) override { return Status::ok(); }
  Status on_loaded(const LoadScope&, const LoadReport&) override { return Status::ok(); }

 private:
  int rank_;
  std::shared_ptr<StateDict> state_;
  Tensor weight_;
};

}  // namespace

int main(int argc, char** argv) {
  const std::string root = argc > 1 ? argv[1] : "checkpoints/embed-example";
  caf::actor_system_config cfg;
  register_stagehand_errors(cfg);
  caf::actor_system system{cfg};
  const int world = 2;
  std::vector<std::unique_ptr<Checkpointable>> ranks;
  for (int rank = 0; rank < world; ++rank) ranks.push_back(std::make_unique<MyModel>(rank));
  CheckpointClusterOptions options;
  options.coordinator.destination = root;
  options.strategy.thread_count = 2;
  options.strategy.async_save = true;
  options.timeout = std::chrono::minutes(1);
  auto spawned = CheckpointCluster::spawn(system, std::move(ranks), options);
  if (!spawned.is_ok()) {
    std::fprintf(stderr, "%s\n", spawned.status().to_string().c_str());
    return 1;
  }
  auto& cluster = *spawned;
  DispatchClient& ckpt = cluster->client();
  auto sum = [&] {
    auto value = ckpt.evaluate();
    return value.is_ok() ? *value : 0.0;
  };
  auto train = [&](std::int64_t step) { return ckpt.train({step, Objective::rl, {}}).status(); };
  int code = 0;
  auto check = [&](const char* what, Status st) {
    std::printf("%-32s %s\n", what, st.is_ok() ? "ok" : st.to_string().c_str());
    if (!st.is_ok()) code = 1;
  };
  check("train step 1", train(1));
  double saved = sum();
  auto timing = ckpt.save(1, /*async=*/true, "{\"step\": 1}");
  if (timing.is_ok()) std::printf("save step 1 returned after %.4fs (async %d)\n", timing->stall_s, timing->async);
  check("save step 1", timing.status());
  check("finalize", ckpt.finalize().status());
  check("train step 2", train(2));
  check("load step 1", ckpt.load(root + "/global_step_1").status());
  double restored = sum();
  std::printf("rank 0 weight sum: saved %.1f, after load %.1f\n", saved, restored);
  if (saved != restored) code = 1;
  check("shutdown", cluster->shutdown());
  return code;
}
