// stagehand-train: trains the reference workload with sync RL or SFT, saving and resuming
// checkpoints through Trainer -> WorkerDispatch -> Worker -> MegatronStrategy.
#include <CLI/CLI.hpp>
#include <caf/all.hpp>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <memory>

#include "actors/messages.hpp"
#include "actors/worker.hpp"
#include "actors/worker_dispatch.hpp"
#include "config/config.hpp"
#include "core/device.hpp"
#include "models/bandit_mlp.hpp"
#include "strategy/checkpoint_coordinator.hpp"
#include "trainers/trainer.hpp"

using namespace stagehand;

namespace {

std::atomic<bool> g_stop{false};

extern "C" void on_stop_signal(int) { g_stop.store(true); }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"stagehand-train: RL and SFT training with asynchronous sharded checkpoints"};
  std::string config_path;
  std::vector<std::string> overrides;
  std::string metrics_out;
  bool quiet = false;
  app.add_option("--config", config_path, "YAML config (examples/configs/*.yaml)")->required();
  app.add_option("--set", overrides, "override a key, e.g. --set trainer.total_steps=50");
  app.add_option("--metrics-out", metrics_out, "write one JSON line per step and per save");
  app.add_flag("--quiet", quiet, "no progress output");
  CLI11_PARSE(app, argc, argv);

  auto config = load_config_file(config_path, overrides);
  if (!config.is_ok()) {
    std::fprintf(stderr, "stagehand-train: %s\n", config.status().message().c_str());
    return 2;
  }
  const Config& c = *config;
  std::signal(SIGTERM, on_stop_signal);
  std::signal(SIGINT, on_stop_signal);

  caf::actor_system_config cfg;
  register_stagehand_errors(cfg);
  caf::actor_system system{cfg};
  ParallelLayout layout{static_cast<int>(c.parallel.tensor_parallel), static_cast<int>(c.parallel.data_parallel)};
  auto groups = make_host_groups(layout);
  std::shared_ptr<WeightStore> weights;
  if (c.trainer.kind == TrainerKind::fully_async) {
    weights = std::make_shared<WeightStore>(layout.tensor_parallel, c.model.context_dim, c.model.num_arms,
                                            c.model.hidden);
  }
  const ObjectStoreOptions store = ObjectStoreOptions::from_config(c.storage.s3);
  auto coordinator = spawn_checkpoint_coordinator(
      system, {c.trainer.ckpt_path, c.megatron_config.local_work_dir, layout.world_size(), store});
  std::vector<caf::actor> workers;
  auto stop_all = [&] {
    for (auto& w : workers) caf::anon_send_exit(w, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(coordinator, caf::exit_reason::user_shutdown);
  };
  for (int rank = 0; rank < layout.world_size(); ++rank) {
    auto model =
        BanditMlp::create(c.model, c.trainer.seed, layout, rank, groups[static_cast<std::size_t>(rank)], weights);
    StrategyOptions strategy{rank,
                             static_cast<int>(c.megatron_config.ckpt_save_thread_count),
                             static_cast<int>(c.megatron_config.ckpt_save_staging_buckets),
                             c.megatron_config.async_dist_ckpt_save,
                             c.megatron_config.ckpt_writer_low_priority,
                             local_storage(),
                             store};
    auto worker = model.is_ok() ? spawn_worker(system, std::move(*model), strategy, coordinator)
                                : Result<caf::actor>(model.status());
    if (!worker.is_ok()) {
      std::fprintf(stderr, "stagehand-train: rank %d: %s\n", rank, worker.status().message().c_str());
      stop_all();
      return 2;
    }
    workers.push_back(*worker);
  }
  const std::chrono::milliseconds timeout = std::chrono::seconds(c.trainer.call_timeout_s);
  auto dispatch = spawn_worker_dispatch(system, workers, coordinator, {c.trainer.ckpt_path, timeout});
  auto summary = std::make_shared<TrainerSummary>();
  if (!quiet) {
    std::printf("stagehand-train: %s trainer, %d ranks (tensor %d x data %d) on %s, checkpoints %s in %s\n",
                to_string(c.trainer.kind), layout.world_size(), layout.tensor_parallel, layout.data_parallel,
                default_device(0).to_string().c_str(), c.megatron_config.async_dist_ckpt_save ? "async" : "sync",
                c.trainer.ckpt_path.c_str());
  }
  auto trainer = spawn_trainer(system, dispatch, {c, metrics_out, !quiet, &g_stop, weights}, summary);
  int code = 0;
  {
    caf::scoped_actor self{system};
    if (trainer.is_ok()) {
      self->monitor(*trainer);
      self->receive([](const caf::down_msg&) {});
      if (!summary->status.is_ok()) code = 1;
    } else {
      std::fprintf(stderr, "stagehand-train: %s\n", trainer.status().message().c_str());
      code = 2;
    }
    // Teardown: every pending save is finished, whatever ckpt_interval was.
    self->request(dispatch, timeout, finalize_atom::value)
        .receive([](bool) {},
                 [&](caf::error& err) {
                   std::fprintf(stderr, "stagehand-train: finalizing at teardown: %s\n",
                                from_caf_error(err).message().c_str());
                   code = 1;
                 });
    self->send_exit(dispatch, caf::exit_reason::user_shutdown);
  }
  stop_all();
  if (!quiet && trainer.is_ok()) {
    std::printf("summary: steps %lld-%lld, accuracy %.3f, %lld checkpoints committed, total save stall %.3fs, "
                "latest checkpoint %s\n",
                static_cast<long long>(summary->first_step), static_cast<long long>(summary->last_step),
                summary->last_accuracy, static_cast<long long>(summary->checkpoints_committed),
                summary->total_stall_s,
                summary->latest_checkpoint.empty() ? "(none)" : summary->latest_checkpoint.c_str());
  }
  if (summary->stopped_by_signal) {
    std::printf("stopped by signal: checkpoint of step %lld is committed; exiting\n",
                static_cast<long long>(summary->signal_save_step));
  }
  return code;
}
