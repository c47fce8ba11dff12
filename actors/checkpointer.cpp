#include "stagehand/actors/checkpointer.hpp"

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include <map>
#include <mutex>
#include <optional>

#include "stagehand/actors/dispatch_client.hpp"
#include "stagehand/core/log.hpp"
#include "stagehand/strategy/messages.hpp"

namespace stagehand {

/// The Checkpointer's state, shared with its PendingSaves (which may outlive it).
struct PendingSave::Shared {
  explicit Shared(CheckpointerOptions o) : options(std::move(o)) {}

  std::mutex mutex;
  CheckpointerOptions options;
  /// The actor system keeps a reference to its config: both live as long as this.
  std::unique_ptr<caf::actor_system_config> config;
  std::unique_ptr<caf::actor_system> system;
  std::unique_ptr<CheckpointCluster> cluster;
  /// Each rank's state as its strategy sees it: the caller's tensors (shared, not copied).
  std::vector<std::shared_ptr<StateDict>> live;
  std::vector<ShardedTensorDesc> structure;
  std::optional<std::int64_t> pending;
  /// How each async save ended, for its PendingSave.
  std::map<std::int64_t, Status> outcomes;
  bool closed = false;

  /// Starts the actors for `states` at the first call; later, checks they have the same ranks
  /// and structure, and hands them to the strategies.
  Status bind(const std::vector<StateDict>& states) {
    if (closed) return {ErrorCode::aborted, "the Checkpointer is closed"};
    if (static_cast<int>(states.size()) != options.world_size) {
      return {ErrorCode::invalid_argument, "the Checkpointer saves " + std::to_string(options.world_size) +
                                               " rank(s) (CheckpointerOptions::world_size) but got " +
                                               std::to_string(states.size()) + " state(s)"};
    }
    for (std::size_t r = 0; r < states.size(); ++r) SH_RETURN_IF_ERROR(states[r].validate().with_context("rank " + std::to_string(r)));
    if (!cluster) return start(states);
    for (std::size_t r = 0; r < states.size(); ++r) {
      if (states[r].descriptors() != live[r]->descriptors()) {
        return {ErrorCode::invalid_argument,
                "rank " + std::to_string(r) +
                    "'s state has other tensors or shapes than at this Checkpointer's first call; one "
                    "Checkpointer serves one structure (make a new one for another)"};
      }
      *live[r] = states[r];
    }
    return Status::ok();
  }

  Status start(const std::vector<StateDict>& states) {
    if (options.root.empty()) return {ErrorCode::invalid_argument, "CheckpointerOptions::root is empty"};
    config = std::make_unique<caf::actor_system_config>();
    register_stagehand_errors(*config);
    system = std::make_unique<caf::actor_system>(*config);
    std::vector<std::unique_ptr<Checkpointable>> ranks;
    for (const auto& state : states) {
      live.push_back(std::make_shared<StateDict>(state));
      ranks.push_back(checkpointable_state(live.back()));
    }
    CheckpointClusterOptions cluster_options;
    ObjectStoreOptions store = ObjectStoreOptions::from_environment();
    store.spool_dir = options.local_work_dir;
    auto fs = default_file_system(store);
    cluster_options.coordinator.destination = options.root;
    cluster_options.coordinator.file_system = fs;
    cluster_options.strategy.file_system = fs;
    cluster_options.strategy.thread_count = options.thread_count;
    cluster_options.strategy.load_thread_count = options.load_thread_count;
    cluster_options.strategy.staging_buckets = options.staging_buckets;
    // Async underneath whenever it can be: a sync save is then an async one finalized at once.
    cluster_options.strategy.async_save = options.staging_buckets == 0;
    cluster_options.timeout = options.timeout;
    auto spawned = CheckpointCluster::spawn(*system, std::move(ranks), cluster_options);
    if (!spawned.is_ok()) {
      live.clear();
      system.reset();
      config.reset();
      return spawned.status();
    }
    cluster = std::move(*spawned);
    return Status::ok();
  }

  /// Finishes the pending async save; records and returns its outcome.
  Status finalize() {
    if (!cluster) return Status::ok();
    Status st = cluster->client().finalize();
    if (pending) {
      outcomes[*pending] = st;
      pending.reset();
    }
    return st;
  }

  Result<SaveTiming> save(std::int64_t step, const std::vector<StateDict>& states, bool async) {
    if (async && options.staging_buckets != 0) {
      return Status{ErrorCode::invalid_argument,
                    "async_save needs CheckpointerOptions::staging_buckets 0 (all buckets staged at once)"};
    }
    SH_RETURN_IF_ERROR(finalize());
    SH_RETURN_IF_ERROR(bind(states));
    SH_ASSIGN_OR_RETURN(SaveTiming timing, cluster->client().save(step));
    if (!timing.async) return timing;
    pending = step;
    if (!async) SH_RETURN_IF_ERROR(finalize());
    return timing;
  }

  Status load(std::vector<StateDict>& states, const std::string& path) {
    SH_RETURN_IF_ERROR(finalize());
    SH_RETURN_IF_ERROR(bind(states));
    SH_RETURN_IF_ERROR(cluster->client().load(path));
    // Tensors were filled in place (shared storage); small objects come back by value.
    for (std::size_t r = 0; r < states.size(); ++r) states[r].objects = live[r]->objects;
    return Status::ok();
  }

  void close() {
    if (closed) return;
    closed = true;
    if (!cluster) return;
    const std::optional<std::int64_t> step = pending;
    Status st = finalize();
    if (!st.is_ok()) {
      logger()->error("Checkpointer closing: {}{}", step ? "step " + std::to_string(*step) + " was not committed: " : "",
                      st.message());
    }
    (void)cluster->shutdown();
    cluster.reset();
  }
};

Status PendingSave::wait() {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  if (shared_->pending == step_) (void)shared_->finalize();
  auto outcome = shared_->outcomes.find(step_);
  if (outcome == shared_->outcomes.end()) {
    return {ErrorCode::internal, "no outcome for step " + std::to_string(step_)};
  }
  return outcome->second;
}

Checkpointer::Checkpointer(CheckpointerOptions options)
    : shared_(std::make_shared<PendingSave::Shared>(std::move(options))) {}

Checkpointer::~Checkpointer() {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  shared_->close();
}

Status Checkpointer::save(std::int64_t step, const StateDict& state) { return save(step, std::vector<StateDict>{state}); }

Status Checkpointer::save(std::int64_t step, const std::vector<StateDict>& states) {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  return shared_->save(step, states, false).status();
}

Result<PendingSave> Checkpointer::async_save(std::int64_t step, const StateDict& state) {
  return async_save(step, std::vector<StateDict>{state});
}

Result<PendingSave> Checkpointer::async_save(std::int64_t step, const std::vector<StateDict>& states) {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  SH_ASSIGN_OR_RETURN(SaveTiming timing, shared_->save(step, states, true));
  if (!timing.async) shared_->outcomes[step] = Status::ok();  // an object store: saved synchronously
  return PendingSave(shared_, step, timing.stall_s);
}

Status Checkpointer::load(StateDict& state, const std::string& path) {
  std::vector<StateDict> states{state};
  SH_RETURN_IF_ERROR(load(states, path));
  state.objects = std::move(states[0].objects);
  return Status::ok();
}

Status Checkpointer::load(std::vector<StateDict>& states, const std::string& path) {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  return shared_->load(states, path);
}

Status Checkpointer::finalize() {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  return shared_->finalize();
}

}  // namespace stagehand
