// stagehand-train: trains the reference workload with sync RL or SFT, saving and resuming
// checkpoints through Trainer -> WorkerDispatch -> Worker -> MegatronStrategy.
//
// One process runs every rank as in-process Workers (the embedded default). With WORLD_SIZE > 1
// (or --world-size), each process runs one rank: rank 0 runs the trainer, the WorkerDispatch and
// the checkpoint coordinator, and every rank its Worker, joined over CAF's middleman.
#include <CLI/CLI.hpp>
#include <caf/all.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>

#include <unistd.h>

#include "stagehand/actors/checkpoint_coordinator.hpp"
#include "stagehand/actors/dispatch_client.hpp"
#include "stagehand/actors/launch.hpp"
#include "stagehand/actors/messages.hpp"
#include "stagehand/actors/process_world.hpp"
#include "stagehand/actors/worker.hpp"
#include "stagehand/actors/worker_dispatch.hpp"
#include "stagehand/checkpoint/tiers/host_folders.hpp"
#include "stagehand/models/host_servers.hpp"
#include "stagehand/checkpoint/load/load_group.hpp"
#include "stagehand/config/load.hpp"
#include "stagehand/core/device.hpp"
#include "stagehand/models/bandit_limits.hpp"
#include "stagehand/models/process_collectives.hpp"
#include "stagehand/storage/default_file_system.hpp"
#include "stagehand/trainers/trainer.hpp"
#include "stagehand/examples/train_ranks.hpp"

using namespace stagehand;
using namespace stagehand::train;

namespace {

std::atomic<bool> g_stop{false};
/// The signal that set g_stop.
std::atomic<int> g_stop_signal{0};
/// The trainer left an export or upload behind, in a call that does not return: main ends the
/// process with std::_Exit, without the static destructors that job's thread may still use.
std::atomic<bool> g_work_left_behind{false};

extern "C" void on_stop_signal(int sig) {
  g_stop_signal.store(sig);
  g_stop.store(true);
}

int fail(const std::string& what, int code = 2) {
  std::fprintf(stderr, "stagehand-train: %s\n", what.c_str());
  return code;
}

/// Ends the process when its teardown (its actors stopping, the actor system shutting down)
/// outlasts a limit after its run ended: a rank of a failed world whose actors do not stop (one
/// still waiting on a peer that is gone) must not stay forever. By then nothing it could still do
/// commits: the trainer finished every save before returning, and a save left pending by a failed
/// run has no commit. Declared before the actor system, so that its destructor, which disarms
/// it, runs after the system's.
class TeardownLimit {
 public:
  /// When the teardown is still going this long after its run ended (and the limit is longer),
  /// it says once where it is, so that a process slow to stop names what holds it.
  static constexpr std::chrono::seconds kNoteAfter{5};

  TeardownLimit() = default;
  TeardownLimit(const TeardownLimit&) = delete;
  TeardownLimit& operator=(const TeardownLimit&) = delete;
  ~TeardownLimit() {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  /// Where the teardown is now (a string literal), named in the messages.
  void at(const char* stage) { stage_.store(stage); }

  /// Starts the limit of `limit` seconds (trainer.call_timeout_s), once: past it, prints where
  /// the teardown is and exits with `code` (1 if 0).
  void arm(std::int64_t limit, std::string who, int code) {
    if (thread_.joinable()) return;
    thread_ = std::thread([this, limit, who = std::move(who), code] {
      std::unique_lock lock(mutex_);
      const auto start = std::chrono::steady_clock::now();
      const auto end = start + std::chrono::seconds(limit);
      if (start + kNoteAfter < end) {
        if (cv_.wait_until(lock, start + kNoteAfter, [this] { return done_; })) return;
        std::fprintf(stderr, "stagehand-train: %s: still stopping %lld s after its run ended, at: %s\n", who.c_str(),
                     static_cast<long long>(kNoteAfter.count()), stage_.load());
        std::fflush(stderr);
      }
      if (cv_.wait_until(lock, end, [this] { return done_; })) return;
      std::fprintf(stderr,
                   "stagehand-train: %s: the process did not stop within %lld s (trainer.call_timeout_s) after "
                   "its run ended (exit code %d), at: %s; leaving without it\n",
                   who.c_str(), static_cast<long long>(limit), code, stage_.load());
      std::fflush(stderr);
      std::_Exit(code != 0 ? code : 1);
    });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::atomic<const char*> stage_{"ending the run"};
  std::thread thread_;
};

/// The teardown's last stage, on every rank: the actors stopping, as the actor system waits for
/// every one.
constexpr const char* kStoppingActors = "stopping the actors (the actor system waits for every one)";

/// STAGEHAND_TEST_STUCK_TEARDOWN=1 (tests only): an actor that never stops, so that the teardown
/// limit must end the process.
void spawn_stuck_actor_for_tests(caf::actor_system& system) {
  const char* stuck = std::getenv("STAGEHAND_TEST_STUCK_TEARDOWN");
  if (stuck == nullptr || std::string(stuck) != "1") return;
  // With an argument: CAF 0.17 binds a null reference to the empty argument tuple of a function
  // actor without one (UBSan reports it).
  system.spawn<caf::detached>([](caf::blocking_actor*, int hours) { std::this_thread::sleep_for(std::chrono::hours(hours)); },
                              1);
}

/// Says what a stop by signal left committed.
void report_stop(const TrainerSummary& summary, const TrainerConfig& t) {
  const std::string& ckpt_path = save_root(t);
  const auto step = static_cast<long long>(summary.signal_save_step);
  if (summary.status.is_ok()) {
    if (step > 0 && !t.local_ckpt_path.empty()) {
      // The local tier may go with its host: say what the durable one holds.
      std::printf("stopped by signal: checkpoint of step %lld is committed in the local tier '%s'; the durable tier "
                  "'%s' holds %s; exiting\n",
                  step, ckpt_path.c_str(), t.ckpt_path.c_str(),
                  summary.durable_step < 0 ? "no step" : ("step " + std::to_string(summary.durable_step)).c_str());
    } else if (step > 0) {
      std::printf("stopped by signal: checkpoint of step %lld is committed; exiting\n", step);
    } else {
      std::printf("stopped by signal before the first step: nothing to save; exiting\n");
    }
    return;
  }
  std::string committed = summary.tracked_step ? "the newest committed checkpoint is step " +
                                                     std::to_string(*summary.tracked_step) + " (the tracker names it)"
                                               : "there is no committed checkpoint in '" + ckpt_path + "' (no tracker)";
  if (step > 0) {
    std::printf("stopped by signal: the checkpoint of step %lld is not committed (the error is above); %s; exiting\n",
                step, committed.c_str());
  } else {
    std::printf("stopped by signal: the run failed (the error is above); %s; exiting\n", committed.c_str());
  }
}

/// Runs the trainer on `workers` until it ends, then finalizes every pending save.
/// @param on_trainer_failed called when the trainer failed, before the teardown finalize.
int run_trainer(caf::actor_system& system, const Config& c, const ParallelLayout& layout,
                const std::vector<worker_actor>& workers, coordinator_actor coordinator, const RunWeights& weights,
                const std::shared_ptr<FileSystem>& fs, const std::string& metrics_out, bool quiet, const std::string& where,
                const std::function<void()>& on_trainer_failed) {
  const std::chrono::milliseconds timeout = std::chrono::seconds(c.trainer.call_timeout_s);
  auto dispatch = spawn_worker_dispatch(system, workers, std::move(coordinator), {timeout, "trainer.call_timeout_s"});
  auto summary = std::make_shared<TrainerSummary>();
  if (!quiet) {
    // Saves to an object store are sync whatever async_dist_ckpt_save says (MegatronStrategy).
    const char* saves = !c.megatron_config.async_dist_ckpt_save ? "sync"
                        : fs->capabilities(save_root(c.trainer)).uploads
                            ? "sync (an object store; async_dist_ckpt_save is ignored)"
                            : "async";
    std::printf("stagehand-train: %s trainer, %d ranks (tensor %d x data %d) %s on %s, checkpoints %s in %s\n",
                to_string(c.trainer.kind), layout.world_size(), layout.tensor_parallel, layout.data_parallel,
                where.c_str(),
                (default_device(0).to_string() + (device_info().simulated ? " (a simulated GPU: STAGEHAND_SIMULATED_GPU=1)" : ""))
                    .c_str(),
                saves, save_root(c.trainer).c_str());
    if (!c.trainer.local_ckpt_path.empty()) {
      std::printf("stagehand-train: a local tier: saves every %lld steps into %s (keeps %lld), copied every %lld steps "
                  "in the background into the durable tier %s\n",
                  static_cast<long long>(c.trainer.local_ckpt_interval), c.trainer.local_ckpt_path.c_str(),
                  static_cast<long long>(c.trainer.local_max_ckpts_to_keep),
                  static_cast<long long>(c.trainer.ckpt_interval), c.trainer.ckpt_path.c_str());
      if (const HostPlacement* hosts = host_placement_of(*fs)) {
        std::printf("stagehand-train: the local tier spans %d host folders (%d ranks per host), each rank's files "
                    "on %d of them%s\n",
                    hosts->hosts, hosts->ranks_per_host, hosts->replicas,
                    hosts->replicas > 1 ? (", " + std::to_string(hosts->stride) + " host(s) apart").c_str() : "");
      }
    }
  }
  auto trainer = spawn_trainer(system, dispatch, {c, metrics_out, !quiet, &g_stop, weights.store, weights.channel, fs}, summary);
  int code = 0;
  {
    caf::scoped_actor self{system};
    if (trainer.is_ok()) {
      self->monitor(*trainer);
      self->receive([&](const caf::down_msg& down) {
        // A trainer ended by anything but its own return (an exit message, an exception) left
        // its summary as it was.
        if (down.reason && summary->status.is_ok()) {
          summary->status = from_caf_error(down.reason).with_context("the trainer stopped");
          fail(summary->status.message());
        }
      });
      if (!summary->status.is_ok()) code = 1;
      if (summary->work_left_behind) g_work_left_behind = true;
    } else {
      fail(trainer.status().message());
      code = 2;
    }
    if (code != 0) on_trainer_failed();
    // Teardown: every pending save is finished, whatever ckpt_interval was. The dispatch bounds
    // each of its waits by the call limit and names the rank that did not answer: wait for it
    // as the trainer does.
    if (auto finalized = DispatchClient(system, dispatch, timeout * 6, "6 x trainer.call_timeout_s").finalize();
        !finalized.is_ok()) {
      fail("finalizing at teardown: " + finalized.status().message());
      code = 1;
    }
    self->send_exit(dispatch, caf::exit_reason::user_shutdown);
  }
  if (!quiet && trainer.is_ok()) {
    const bool trained = summary->first_step > 0 && summary->last_step >= summary->first_step;
    const std::string steps = trained ? "steps " + std::to_string(summary->first_step) + "-" +
                                            std::to_string(summary->last_step)
                                      : "no step trained";
    std::printf("summary: %s, accuracy %.3f, %lld checkpoints committed, total save stall %.3fs, "
                "total fence wait %.3fs, latest checkpoint %s\n",
                steps.c_str(), summary->last_accuracy, static_cast<long long>(summary->checkpoints_committed),
                summary->total_stall_s, summary->total_fence_wait_s,
                summary->latest_checkpoint.empty() ? "(none)" : summary->latest_checkpoint.c_str());
    if (c.trainer.export_interval > 0) {
      std::printf("exports: %lld written to %s, %lld failed\n", static_cast<long long>(summary->exports_done),
                  c.trainer.export_path.c_str(), static_cast<long long>(summary->exports_failed));
    }
    if (!c.trainer.local_ckpt_path.empty()) {
      std::printf("durable tier: %lld uploads to %s, %lld failed; it holds %s\n",
                  static_cast<long long>(summary->uploads_done), c.trainer.ckpt_path.c_str(),
                  static_cast<long long>(summary->uploads_failed),
                  summary->durable_step < 0 ? "no step" : ("step " + std::to_string(summary->durable_step)).c_str());
    }
  }
  if (summary->stopped_by_signal) report_stop(*summary, c.trainer);
  return code;
}

/// The embedded default: every rank a Worker of this process.
int run_in_process(caf::actor_system& system, const Config& c, const ParallelLayout& layout,
                   const std::string& metrics_out, bool quiet) {
  auto groups = make_host_groups(layout);
  // The fully-async generators' channel of its own: named after this process.
  const bool own_tcp = c.weight_sync.transport == WeightTransport::tcp && c.weight_sync.channel.empty();
  RunWeights weights{nullptr, run_channel(c, "train-" + std::to_string(::getpid()),
                                          own_tcp ? "127.0.0.1:" + std::to_string(free_loopback_port()) : "")};
  if (c.trainer.kind == TrainerKind::fully_async && c.weight_sync.transport == WeightTransport::collective) {
    weights.store = std::make_shared<WeightStore>(layout.tensor_parallel, c.model.context_dim, c.model.num_arms,
                                            c.model.hidden);
  }
  const auto fs = with_test_hangs(config_file_system(c));
  if (!fs) return 2;
  auto coordinator = spawn_checkpoint_coordinator(
      system, {save_root(c.trainer), layout.world_size(), fs, std::chrono::seconds(c.trainer.call_timeout_s)});
  std::vector<worker_actor> workers;
  auto stop_all = [&] {
    for (auto& w : workers) caf::anon_send_exit(w, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(coordinator, caf::exit_reason::user_shutdown);
  };
  auto load_group = std::make_shared<LoadGroup>(layout.world_size(), std::chrono::seconds(c.trainer.call_timeout_s));
  for (int rank = 0; rank < layout.world_size(); ++rank) {
    auto worker = spawn_rank(system, c, layout, rank, groups[static_cast<std::size_t>(rank)], weights, fs, coordinator,
                             load_group);
    if (!worker.is_ok()) {
      stop_all();
      return fail(worker.status().message());
    }
    workers.push_back(*worker);
  }
  int code = run_trainer(system, c, layout, workers, coordinator, weights, fs, metrics_out, quiet, "in this process",
                         [] {});
  stop_all();
  return code;
}

/// One rank of a world of processes.
int run_rank_process(caf::actor_system& system, const Config& c, const ParallelLayout& layout, const LaunchInfo& launch,
                     const std::string& metrics_out, bool quiet, TeardownLimit& teardown) {
  std::shared_ptr<RoutedFileSystem> routes;
  const auto fs = with_test_hangs(config_file_system(c, launch.rank, &routes));
  if (!fs) return 2;
  // With routes: this process's part of the host servers, once the world formed.
  std::unique_ptr<HostServers> servers;
  auto start_servers = [&](caf::actor rendezvous) -> Status {
    if (!routes) return Status::ok();
    auto started = HostServers::start(system, host_placement_of_config(c), launch.rank, local_file_system(), routes,
                                      std::move(rendezvous), launch.master_addr, std::chrono::seconds(c.trainer.call_timeout_s));
    if (!started.is_ok()) return started.status().with_context("trainer.local_replication_transport network");
    servers = std::move(*started);
    return Status::ok();
  };
  ProcessCollectives collectives(system, launch.master_addr, std::chrono::seconds(c.trainer.call_timeout_s),
                                 "trainer.call_timeout_s");
  const int rank = launch.rank;
  RankGroups groups = collectives.groups(layout, rank);
  // Fully async over the shared-memory channel: every rank pushes its part of each version to
  // the generators in rank 0's process (a channel named after the launch's port, which every
  // rank knows; over TCP rank 0 listens on the master address at the master port + 1). With the collective transport, the first data-parallel replica's ranks publish
  // each version through their tensor-parallel group to rank 0.
  RunWeights weights{nullptr, run_channel(c, "train-port" + std::to_string(launch.master_port),
                                          launch.master_addr + ":" + std::to_string(launch.master_port + 1))};
  if (c.trainer.kind == TrainerKind::fully_async && c.weight_sync.transport == WeightTransport::collective &&
      layout.data_index(rank) == 0) {
    weights.store = WeightStore::across_group(groups.tensor, layout.tensor_index(rank), rank == 0, c.model.context_dim,
                                        c.model.num_arms, c.model.hidden);
  }
  if (rank == 0) {
    auto host = WorldHost::open(system, launch);
    if (!host.is_ok()) return fail(host.status().message());
    auto coordinator = spawn_checkpoint_coordinator(
      system, {save_root(c.trainer), layout.world_size(), fs, std::chrono::seconds(c.trainer.call_timeout_s)});
    auto worker0 = spawn_rank(system, c, layout, 0, std::move(groups), weights, fs, coordinator);
    if (!worker0.is_ok()) {
      caf::anon_send_exit(coordinator, caf::exit_reason::user_shutdown);
      return fail(worker0.status().message());
    }
    auto world = (*host)->gather({*worker0}, collectives.host_rendezvous(), coordinator);
    int code = 0;
    Status served = world.is_ok() ? start_servers(collectives.host_rendezvous()) : Status::ok();
    if (!world.is_ok()) {
      code = fail("starting the world of " + std::to_string(launch.world_size) + " processes: " +
                  world.status().message());
    } else if (!served.is_ok()) {
      code = fail("rank 0: " + served.message());
    } else {
      collectives.set_rendezvous(collectives.host_rendezvous());
      code = run_trainer(system, c, layout, *world, coordinator, weights, fs, metrics_out, quiet,
                         "in " + std::to_string(launch.world_size) + " processes",
                         [&] { collectives.abort("the trainer failed"); });
    }
    (*host)->shutdown(code);
    servers.reset();
    if (Status closed = collectives.close("rank 0 is done"); !closed.is_ok())
      fail("rank 0: closing the collectives: " + closed.message());
    teardown.arm(c.trainer.call_timeout_s, "rank 0", code);
    teardown.at(kStoppingActors);
    caf::anon_send_exit(*worker0, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(coordinator, caf::exit_reason::user_shutdown);
    return code;
  }
  auto worker = spawn_rank(system, c, layout, rank, std::move(groups), weights, fs, coordinator_actor{});
  if (!worker.is_ok()) return fail(worker.status().message());
  WorldMember member(system, launch);
  auto joined = member.join({*worker});
  int code = 0;
  Status served = joined.is_ok() ? start_servers(joined->rendezvous) : Status::ok();
  if (!joined.is_ok()) {
    code = fail("rank " + std::to_string(rank) + ": " + joined.status().message());
  } else if (!served.is_ok()) {
    code = fail("rank " + std::to_string(rank) + ": " + served.message());
    collectives.abort("rank " + std::to_string(rank) + " cannot reach the other hosts' folders");
  } else {
    collectives.set_rendezvous(joined->rendezvous);
    caf::anon_send(*worker, report_to_atom::value, joined->coordinator);
    if (!quiet) std::printf("stagehand-train: rank %d joined rank 0 at %s\n", rank, launch.master().c_str());
    std::string lost;
    code = member.serve(lost, &g_stop);
    if (g_stop.load()) {
      // Only rank 0's trainer can stop the job cleanly (a signal to rank 0 saves and stops): this
      // rank leaves it, and rank 0 sees it gone and fails the run, naming it.
      const char* signal = g_stop_signal.load() == SIGINT ? "SIGINT" : "SIGTERM";
      code = fail("rank " + std::to_string(rank) + ": stopped by " + signal +
                      ": leaving the job (rank 0 fails the run naming this rank; send the signal to "
                      "rank 0 to save and stop)",
                  1);
      // Bounded from here: nothing below waits for the other ranks (the abort does not).
      teardown.arm(c.trainer.call_timeout_s, "rank " + std::to_string(rank), code);
      teardown.at("aborting the collectives");
      collectives.abort("rank " + std::to_string(rank) + " was stopped by " + signal);
    } else if (!lost.empty()) {
      fail("rank " + std::to_string(rank) + ": " + lost, 1);
    } else if (code != 0) {
      fail("rank " + std::to_string(rank) + ": rank 0 ended with exit code " + std::to_string(code), code);
    }
  }
  // Leaving on a signal, the collectives are aborted, not closed: the other ranks are still
  // training and would not say goodbye.
  if (!g_stop.load()) {
    if (Status closed = collectives.close("rank " + std::to_string(rank) + " is shutting down"); !closed.is_ok())
      fail("rank " + std::to_string(rank) + ": closing the collectives: " + closed.message());
  }
  teardown.at("stopping the file servers");
  servers.reset();
  teardown.arm(c.trainer.call_timeout_s, "rank " + std::to_string(rank), code);
  teardown.at(kStoppingActors);
  caf::anon_send_exit(*worker, caf::exit_reason::user_shutdown);
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"stagehand-train: RL and SFT training with asynchronous sharded checkpoints"};
  std::string config_path;
  std::vector<std::string> overrides;
  std::string metrics_out;
  bool quiet = false;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr;
  int master_port = 0;
  int join_timeout_s = 60;
  app.add_option("--config", config_path, "YAML config (examples/configs/*.yaml)")->required();
  app.add_option("--set", overrides, "override a key, e.g. --set trainer.total_steps=50");
  app.add_option("--metrics-out", metrics_out, "write one JSON line per step and per save (rank 0)");
  app.add_flag("--quiet", quiet, "no progress output");
  auto* rank_opt = app.add_option("--rank", rank, "this process's rank (default: RANK)");
  auto* world_opt = app.add_option("--world-size", world_size, "processes in all (default: WORLD_SIZE, else 1)");
  auto* local_opt = app.add_option("--local-rank", local_rank, "rank on this host (default: LOCAL_RANK)");
  auto* addr_opt = app.add_option("--master-addr", master_addr, "host of rank 0 (default: MASTER_ADDR, 127.0.0.1)");
  auto* port_opt = app.add_option("--master-port", master_port, "port rank 0 listens on (default: MASTER_PORT, 29500)");
  app.add_option("--join-timeout-s", join_timeout_s, "limit for every rank to join rank 0")
      ->check(CLI::Range(1, 86400));
  CLI11_PARSE(app, argc, argv);

  auto config = load_config_file(config_path, overrides);
  if (!config.is_ok()) return fail(config.status().message());
  if (Status model = validate_bandit_config(*config); !model.is_ok()) return fail(model.message());
  const Config& c = *config;
  LaunchFlags flags;
  if (rank_opt->count() > 0) flags.rank = rank;
  if (world_opt->count() > 0) flags.world_size = world_size;
  if (local_opt->count() > 0) flags.local_rank = local_rank;
  if (addr_opt->count() > 0) flags.master_addr = master_addr;
  if (port_opt->count() > 0) flags.master_port = master_port;
  auto launch = read_launch_info(flags);
  if (!launch.is_ok()) return fail(launch.status().message());
  launch->join_timeout = std::chrono::seconds(join_timeout_s);
  launch->job = c.trainer.ckpt_path;
  ParallelLayout layout{static_cast<int>(c.parallel.tensor_parallel), static_cast<int>(c.parallel.data_parallel)};
  if (launch->multi_process()) {
    if (launch->world_size != layout.world_size()) {
      return fail("WORLD_SIZE=" + std::to_string(launch->world_size) +
                  " does not match parallel.tensor_parallel x parallel.data_parallel = " +
                  std::to_string(layout.tensor_parallel) + " x " + std::to_string(layout.data_parallel) + " = " +
                  std::to_string(layout.world_size()) + ": each process runs one rank");
    }
  }
  std::signal(SIGTERM, on_stop_signal);
  std::signal(SIGINT, on_stop_signal);
  // A write to a peer process that died fails with EPIPE (the collective names that rank) instead
  // of ending this process.
  if (launch->multi_process()) std::signal(SIGPIPE, SIG_IGN);

  caf::actor_system_config cfg;
  register_stagehand_errors(cfg);
  if (launch->multi_process()) register_wire_types(cfg);
  TeardownLimit teardown;  // outlives the system: bounds its shutdown
  int code = 0;
  {
    caf::actor_system system{cfg};
    if (!launch->multi_process()) {
      code = run_in_process(system, c, layout, metrics_out, quiet);
    } else {
      spawn_stuck_actor_for_tests(system);
      code = run_rank_process(system, c, layout, *launch, metrics_out, quiet, teardown);
    }
  }
  if (g_work_left_behind) {
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(code);
  }
  return code;
}
