// A minimal trainer of your own that embeds Stagehand: it registers its own tensors through the
// Model interface, then saves (async), finalizes and loads through WorkerDispatch, Workers and
// their MegatronStrategy actors.
//
//   build/bin/stagehand-embed-example /tmp/my-checkpoints
#include <caf/all.hpp>

#include <cstdio>
#include <numeric>

#include "actors/messages.hpp"
#include "actors/worker.hpp"
#include "actors/worker_dispatch.hpp"
#include "strategy/checkpoint_coordinator.hpp"

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
  Status on_loaded() override { return Status::ok(); }

 private:
  int rank_;
  std::shared_ptr<StateDict> state_;
  Tensor weight_;
};

/// Sends a request and waits for its reply (of types Reply...) or its error.
template <class... Reply, class... Ts>
Status call(caf::scoped_actor& self, const caf::actor& dispatch, Ts... xs) {
  Status st;
  self->request(dispatch, std::chrono::minutes(1), xs...)
      .receive([](Reply...) {}, [&](caf::error& err) { st = from_caf_error(err); });
  return st;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string root = argc > 1 ? argv[1] : "checkpoints/embed-example";
  caf::actor_system_config cfg;
  register_stagehand_errors(cfg);
  caf::actor_system system{cfg};
  const int world = 2;
  auto coordinator = spawn_checkpoint_coordinator(system, {root, "/tmp/stagehand-work", world});
  std::vector<caf::actor> workers;
  for (int rank = 0; rank < world; ++rank) {
    StrategyOptions options{rank, /*thread_count=*/2, /*staging_buckets=*/0, /*async_save=*/true};
    workers.push_back(*spawn_worker(system, std::make_unique<MyModel>(rank), options, coordinator));
  }
  auto dispatch = spawn_worker_dispatch(system, workers, coordinator, {root});
  caf::scoped_actor self{system};
  auto sum = [&] {
    double value = 0;
    self->request(dispatch, std::chrono::minutes(1), eval_atom::value)
        .receive([&](double v) { value = v; }, [](caf::error&) {});
    return value;
  };
  int code = 0;
  auto check = [&](const char* what, Status st) {
    std::printf("%-32s %s\n", what, st.is_ok() ? "ok" : st.to_string().c_str());
    if (!st.is_ok()) code = 1;
  };
  check("train step 1", call<double, double>(self, dispatch, train_atom::value, std::int64_t{1}, std::int32_t{0}, std::vector<std::int32_t>{}));
  double saved = sum();
  Status save;
  self->request(dispatch, std::chrono::minutes(1), save_atom::value, std::int64_t{1}, std::string("{\"step\": 1}"))
      .receive([&](double stall, bool async) { std::printf("save step 1 returned after %.4fs (async %d)\n", stall, async); },
               [&](caf::error& err) { save = from_caf_error(err); });
  check("save step 1", save);
  check("finalize", call<bool>(self, dispatch, finalize_atom::value));
  check("train step 2", call<double, double>(self, dispatch, train_atom::value, std::int64_t{2}, std::int32_t{0}, std::vector<std::int32_t>{}));
  check("load step 1", call<>(self, dispatch, load_atom::value, root + "/global_step_1"));
  double restored = sum();
  std::printf("rank 0 weight sum: saved %.1f, after load %.1f\n", saved, restored);
  if (saved != restored) code = 1;
  for (auto& w : workers) self->send_exit(w, caf::exit_reason::user_shutdown);
  self->send_exit(dispatch, caf::exit_reason::user_shutdown);
  self->send_exit(coordinator, caf::exit_reason::user_shutdown);
  return code;
}
