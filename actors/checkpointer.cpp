#include "stagehand/actors/checkpointer.hpp"

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include <future>
#include <map>
#include <mutex>
#include <optional>

#include "stagehand/actors/dispatch_client.hpp"
#include "stagehand/actors/process_world.hpp"
#include "stagehand/actors/worker.hpp"
#include "stagehand/checkpoint/store/checkpoint_store.hpp"
#include "stagehand/checkpoint/save/file_reuse.hpp"
#include "stagehand/checkpoint/load/load_group.hpp"
#include "stagehand/checkpoint/load/resolve.hpp"
#include "stagehand/core/log.hpp"
#include "stagehand/storage/default_file_system.hpp"

namespace stagehand {

Result<CheckpointerOptions> CheckpointerOptions::from_environment(std::string root) {
  SH_ASSIGN_OR_RETURN(LaunchInfo launch, read_launch_info({}, kControlPortVariable, kDefaultControlPort));
  CheckpointerOptions options;
  options.root = std::move(root);
  options.rank = launch.rank;
  options.world_size = launch.world_size;
  options.local_ranks = launch.multi_process() ? 1 : 0;
  options.master_addr = launch.master_addr;
  options.port = launch.master_port;
  return options;
}

/// The Checkpointer's state, shared with its PendingSaves (which may outlive it).
class PendingSave::Impl {
 public:
  explicit Impl(CheckpointerOptions o) : options(std::move(o)) {}

  std::mutex mutex;
  CheckpointerOptions options;
  /// The actor system keeps a reference to its config: both live as long as this.
  std::unique_ptr<caf::actor_system_config> config;
  std::unique_ptr<caf::actor_system> system;
  std::shared_ptr<FileSystem> fs;
  std::unique_ptr<FileLock> lock;
  coordinator_actor coordinator;
  bool coordinator_here = false;
  std::vector<worker_actor> workers;
  /// Owned by the Workers, which live until close().
  std::vector<Checkpointable*> ranks;
  dispatch_actor dispatch;
  std::unique_ptr<DispatchClient> client;
  std::unique_ptr<WorldHost> host;
  std::unique_ptr<WorldMember> member;
  /// Each rank's state as its strategy sees it: the caller's tensors (shared, not copied).
  std::vector<std::shared_ptr<StateDict>> live;
  std::optional<std::int64_t> pending;
  /// How each async save ended, for its PendingSave.
  std::map<std::int64_t, Status> outcomes;
  /// Since when PendingSave::done()'s polls of the coordinator have gone unanswered (none: the
  /// last one was answered).
  std::optional<std::chrono::steady_clock::time_point> unanswered_since;
  bool started = false;
  /// Why the first call could not start the actors or join the job: every later call says so.
  std::optional<Status> start_error;
  bool closed = false;
  /// prepare() asked for async saves' staging at the start.
  bool prepare_async = false;
  /// The prepare that prepare_in_background() runs; every call waits for it first.
  std::shared_future<void> background;
  /// Why that prepare failed, for the next call (reported once).
  std::optional<Status> background_error;

  /// Waits for the background prepare, if any; its error, once.
  Status await_background() {
    std::shared_future<void> running;
    {
      std::lock_guard<std::mutex> held(mutex);
      running = background;
    }
    if (running.valid()) running.wait();
    std::lock_guard<std::mutex> held(mutex);
    if (!background_error) return Status::ok();
    return std::exchange(background_error, std::nullopt)->with_context("the prepare that prepare_in_background started");
  }

  int ranks_here() const { return options.ranks_here(); }
  bool spans_processes() const { return ranks_here() < options.world_size; }

  Status check_options() const {
    const CheckpointerOptions& o = options;
    if (o.root.empty()) return {ErrorCode::invalid_argument, "CheckpointerOptions::root is empty"};
    if (o.world_size < 1 || o.local_ranks < 0 || o.rank < 0 || o.rank + ranks_here() > o.world_size) {
      return {ErrorCode::invalid_argument,
              "CheckpointerOptions: ranks " + std::to_string(o.rank) + ".." + std::to_string(o.rank + ranks_here() - 1) +
                  " (rank, local_ranks) do not lie in a world of " + std::to_string(o.world_size) +
                  " (world_size) ranks"};
    }
    if (spans_processes() && (o.port < 1 || o.port > 65535)) {
      return {ErrorCode::invalid_argument, "CheckpointerOptions::port " + std::to_string(o.port) + " is not a TCP port"};
    }
    if (o.max_to_keep < 0) {
      return {ErrorCode::invalid_argument, "CheckpointerOptions::max_to_keep must be 0 (keep all) or more, got " +
                                               std::to_string(o.max_to_keep)};
    }
    // Both are multiplied (6 x timeout for a client's call) and taken in nanoseconds: past a
    // week they would overflow, and a call would then fail at once or never end.
    constexpr std::chrono::milliseconds kMostTimeout = std::chrono::hours(24 * 7);
    for (const auto& [what, limit] : {std::pair{"timeout", o.timeout}, std::pair{"join_timeout", o.join_timeout}}) {
      if (limit < std::chrono::milliseconds(1) || limit > kMostTimeout) {
        return {ErrorCode::invalid_argument, std::string("CheckpointerOptions::") + what +
                                                 " must be from 1 ms to 7 days, got " + std::to_string(limit.count()) +
                                                 " ms"};
      }
    }
    if (!(o.write_rate_limit_mib_s >= 0)) {
      return {ErrorCode::invalid_argument, "CheckpointerOptions::write_rate_limit_mib_s must be 0 (unlimited) or "
                                           "more, got " + std::to_string(o.write_rate_limit_mib_s)};
    }
    return Status::ok();
  }

  /// Starts the actors for `states` at the first call; later, checks they have the same ranks
  /// and structure, and hands them to the strategies.
  /// `states` are taken (their tensors shared with the caller's: no data is copied).
  Status bind(std::vector<StateDict>&& states) {
    if (closed) return {ErrorCode::aborted, "the Checkpointer is closed"};
    if (start_error) return *start_error;
    if (static_cast<int>(states.size()) != ranks_here()) {
      return {ErrorCode::invalid_argument, "the Checkpointer saves " + std::to_string(ranks_here()) +
                                               " rank(s) in this process (CheckpointerOptions::world_size, "
                                               "local_ranks) but got " +
                                               std::to_string(states.size()) + " state(s)"};
    }
    for (std::size_t r = 0; r < states.size(); ++r) {
      SH_RETURN_IF_ERROR(states[r].validate().with_context("rank " + std::to_string(options.rank + r)));
    }
    if (!started) {
      started = true;
      Status st = start(std::move(states));
      if (!st.is_ok()) {
        start_error = st.with_context("the Checkpointer could not start");
        stop();
        return *start_error;
      }
      return Status::ok();
    }
    for (std::size_t r = 0; r < states.size(); ++r) {
      if (!same_structure(states[r], *live[r])) {
        return {ErrorCode::invalid_argument,
                "rank " + std::to_string(options.rank + r) +
                    "'s state has other tensors or shapes than at this Checkpointer's first call; one "
                    "Checkpointer serves one structure (make a new one for another)"};
      }
      *live[r] = std::move(states[r]);
    }
    return Status::ok();
  }

  /// The same tensors (descriptors, in order), compared without copying them.
  static bool same_structure(const StateDict& a, const StateDict& b) {
    if (a.tensors.size() != b.tensors.size()) return false;
    for (std::size_t i = 0; i < a.tensors.size(); ++i) {
      if (!(a.tensors[i].desc == b.tensors[i].desc)) return false;
    }
    return true;
  }

  Status start(std::vector<StateDict>&& states) {
    SH_RETURN_IF_ERROR(check_options());
    config = std::make_unique<caf::actor_system_config>();
    register_stagehand_errors(*config);
    if (spans_processes()) register_wire_types(*config);
    system = std::make_unique<caf::actor_system>(*config);
    if (options.file_system) {
      fs = options.file_system;
    } else {
      ObjectStoreOptions store = ObjectStoreOptions::from_environment();
      store.spool_dir = options.local_work_dir;
      fs = default_file_system(store);
    }
    if (options.max_to_keep > 0 && options.reuse_files) {
      // Retention's removed steps lend their data files to the next saves (on a local disk).
      fs = reusing_file_system(std::move(fs), {options.root});
    }
    coordinator_here = options.rank == 0;
    if (coordinator_here) {
      // One lock for the whole job, taken where rank 0 is; the leftovers of a killed run go now.
      const CheckpointStore root(fs, options.root);
      SH_ASSIGN_OR_RETURN(lock, root.lock());
      SH_RETURN_IF_ERROR(root.clean_interrupted().status());
      CoordinatorOptions coordination{options.root, options.world_size, fs, options.timeout, options.timeout,
                                      "CheckpointerOptions::timeout"};
      coordinator = spawn_checkpoint_coordinator(*system, std::move(coordination));
    }
    StrategyOptions strategy;
    strategy.thread_count = options.thread_count;
    strategy.load_thread_count = options.load_thread_count;
    strategy.staging_buckets = options.staging_buckets;
    strategy.uncached_writes = options.uncached_writes;
    // Async saves to an object store run as sync saves, which write host tensors straight from
    // them: no staging to reserve there.
    strategy.async_save = prepare_async && !fs->capabilities(options.root).uploads;
    strategy.file_system = rate_limited(fs, options.write_rate_limit_mib_s * 1048576.0);
    if (states.size() > 1) strategy.load_group = std::make_shared<LoadGroup>(static_cast<int>(states.size()), options.timeout);
    for (std::size_t r = 0; r < states.size(); ++r) {
      live.push_back(std::make_shared<StateDict>(std::move(states[r])));
      auto owner = checkpointable_state(live.back());
      ranks.push_back(owner.get());
      strategy.rank = options.rank + static_cast<int>(r);
      auto worker = spawn_worker(*system, std::move(owner), strategy, coordinator, options.timeout);
      if (!worker.is_ok()) return worker.status().with_context("rank " + std::to_string(strategy.rank));
      workers.push_back(*worker);
    }
    if (spans_processes()) SH_RETURN_IF_ERROR(join_world());
    dispatch = spawn_worker_dispatch(*system, workers, coordinator,
                                     {options.timeout, "CheckpointerOptions::timeout", options.rank});
    // The dispatch bounds each of its waits; a call is a few of them.
    client = std::make_unique<DispatchClient>(*system, dispatch, options.timeout * 6,
                                              "6 x CheckpointerOptions::timeout");
    return Status::ok();
  }

  Status join_world() {
    LaunchInfo launch;
    launch.rank = options.rank;
    launch.world_size = options.world_size;
    launch.master_addr = options.master_addr;
    launch.master_port = options.port;
    launch.join_timeout = options.join_timeout;
    launch.job = options.root;
    if (coordinator_here) {
      SH_ASSIGN_OR_RETURN(host, WorldHost::open(*system, launch));
      return host->gather(workers, caf::actor{}, coordinator).status().with_context("starting the job");
    }
    member = std::make_unique<WorldMember>(*system, launch);
    SH_ASSIGN_OR_RETURN(JoinedWorld joined, member->join(workers));
    coordinator = std::move(joined.coordinator);
    for (auto& w : workers) caf::anon_send(w, report_to_atom::value, coordinator);
    return Status::ok();
  }

  Status prepare(std::vector<StateDict>&& states, bool async) {
    if (started && !closed && !start_error) {
      return {ErrorCode::invalid_argument,
              "Checkpointer::prepare must be the first call: an earlier prepare, save or load already started this "
              "Checkpointer"};
    }
    prepare_async = async;
    Status st = bind(std::move(states));
    // A state refused before the start leaves the next first call as it would have been.
    if (!st.is_ok()) prepare_async = false;
    return st;
  }

  /// Finishes the pending async save; records and returns its outcome.
  Status finalize() {
    if (!client || !pending) return Status::ok();
    const std::int64_t step = *pending;
    pending.reset();
    Status st = client->finalize().status();
    outcomes[step] = st;
    if (st.is_ok()) apply_retention();
    return st;
  }

  /// Removes the committed steps beyond options.max_to_keep, where rank 0's process is (once for
  /// the job). A step that cannot be removed leaves the save committed: it is logged, and the
  /// next commit tries again.
  void apply_retention() {
    if (options.max_to_keep <= 0 || !coordinator_here) return;
    auto removed = CheckpointStore(fs, options.root).apply_retention(options.max_to_keep, {});
    if (!removed.is_ok()) logger()->warn("Checkpointer: retention in '{}': {}", options.root, removed.status().message());
  }

  /// Finishes the pending async save before the call `what`; its failure fails that call, undone
  /// (it is not lost in a log), said so in its message. The next call then goes ahead.
  Status finalize_before(const std::string& what) {
    const std::optional<std::int64_t> prior = pending;
    Status st = finalize();
    if (st.is_ok() || !prior) return st;
    return st.with_context("the async save of step " + std::to_string(*prior) + " failed, and " + what +
                           " was not done (call it again)");
  }

  Result<PendingSave> save(std::int64_t step, std::vector<StateDict>&& states, bool async,
                           const std::shared_ptr<Impl>& self) {
    SH_RETURN_IF_ERROR(finalize_before("the save of step " + std::to_string(step)));
    SH_RETURN_IF_ERROR(bind(std::move(states)));
    SH_ASSIGN_OR_RETURN(SaveResult saved, client->save(step, async));
    if (saved.async) {
      pending = step;
    } else {
      outcomes[step] = Status::ok();
      apply_retention();
    }
    return PendingSave(self, step, saved.stall_s);
  }

  Status load(std::vector<StateDict>& states, const std::string& path) {
    SH_RETURN_IF_ERROR(finalize_before("this load"));
    // The tensors are shared with the caller's (filled in place); the objects come back below.
    SH_RETURN_IF_ERROR(bind(std::vector<StateDict>(states)));
    // Resolved once for the process, not once per rank.
    SH_ASSIGN_OR_RETURN(std::string dir, resolve_checkpoint(*fs, path));
    SH_RETURN_IF_ERROR(client->load(dir).status());
    // Tensors were filled in place (shared storage); small objects come back by value.
    for (std::size_t r = 0; r < states.size(); ++r) states[r].objects = live[r]->objects;
    return Status::ok();
  }

  bool staged() const {
    for (const Checkpointable* rank : ranks) {
      if (!rank->fence_open()) return false;
    }
    return true;
  }

  void close() {
    if (closed) return;
    closed = true;
    if (!system) return;
    const std::optional<std::int64_t> step = pending;
    Status st = finalize();
    if (!st.is_ok()) {
      logger()->error("Checkpointer closing: {}{}", step ? "step " + std::to_string(*step) + " was not committed: " : "",
                      st.message());
    }
    if (member) member->leave();
    if (host) {
      // The coordinator stays until every other process is done with it.
      if (Status left = host->await_leaves(options.timeout); !left.is_ok()) {
        logger()->warn("Checkpointer closing: {}", left.message());
      }
    }
    stop();
  }

  /// Stops every actor of this process (waiting at most `timeout`) and lets go of the system.
  void stop() {
    if (!system) return;
    {
      // Scoped: every handle must be gone before the system is, which waits for their actors.
      std::vector<caf::actor> actors;
      if (dispatch) actors.push_back(caf::actor_cast<caf::actor>(dispatch));
      for (const auto& w : workers) actors.push_back(caf::actor_cast<caf::actor>(w));
      if (coordinator_here && coordinator) actors.push_back(caf::actor_cast<caf::actor>(coordinator));
      if (!stop_actors(*system, actors, options.timeout)) {
        logger()->error("Checkpointer closing: not every actor stopped within the time limit");
      }
    }
    if (host) host->shutdown(0);
    client.reset();
    dispatch = nullptr;
    workers.clear();
    coordinator = nullptr;
    ranks.clear();
    host.reset();
    member.reset();
    system.reset();
    config.reset();
    // The last reference where the actors' are gone: a file system over retired steps' files
    // removes them now, not when the last PendingSave goes.
    fs.reset();
    lock.reset();
  }
};

Status PendingSave::wait() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (impl_->pending == step_) (void)impl_->finalize();
  auto outcome = impl_->outcomes.find(step_);
  if (outcome == impl_->outcomes.end()) {
    return {ErrorCode::internal, "no outcome for step " + std::to_string(step_)};
  }
  return outcome->second;
}

bool PendingSave::done() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (impl_->outcomes.count(step_) != 0) return true;
  if (impl_->pending != step_ || !impl_->system || !impl_->coordinator) return true;
  caf::scoped_actor self{*impl_->system};
  bool known = false;
  // A coordinator that does not answer within kDonePollLimit (busy in a commit) does not know
  // yet; one that is gone makes wait() return at once, with the error, and so does one that has
  // not answered for `timeout` (its host unreachable: wait() then fails within its own limit).
  self->request(impl_->coordinator, kDonePollLimit, poll_atom::value, step_)
      .receive(
          [&](bool outcome) {
            known = outcome;
            impl_->unanswered_since.reset();
          },
          [&](caf::error& e) {
            if (e != caf::sec::request_timeout) {
              known = true;
              return;
            }
            const auto now = std::chrono::steady_clock::now();
            if (!impl_->unanswered_since) impl_->unanswered_since = now;
            known = now - *impl_->unanswered_since >= impl_->options.timeout;
          });
  return known;
}

bool PendingSave::staged() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->staged();
}

std::chrono::milliseconds PendingSave::timeout() const { return impl_->options.timeout; }

Result<double> PendingSave::wait_staged() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (!impl_->client) return 0.0;
  return impl_->client->fence();
}

Checkpointer::Checkpointer(CheckpointerOptions options)
    : impl_(std::make_shared<PendingSave::Impl>(std::move(options))) {}

Checkpointer::~Checkpointer() {
  (void)impl_->await_background();
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->close();
}

namespace {

std::vector<StateDict> one_state(StateDict state) {
  std::vector<StateDict> states;
  states.push_back(std::move(state));
  return states;
}

}  // namespace

Status Checkpointer::prepare_in_background(std::vector<StateDict> states) {
  SH_RETURN_IF_ERROR(impl_->await_background());
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (impl_->started) {
    return {ErrorCode::invalid_argument,
            "Checkpointer::prepare_in_background must be the first call: an earlier prepare, save or load already "
            "started this Checkpointer"};
  }
  std::shared_ptr<PendingSave::Impl> impl = impl_;
  impl_->background = std::async(std::launch::async, [impl, states = std::move(states)]() mutable {
                        std::lock_guard<std::mutex> held(impl->mutex);
                        Status st = impl->prepare(std::move(states), true);
                        if (!st.is_ok()) impl->background_error = st;
                      }).share();
  return Status::ok();
}

Status Checkpointer::prepare_in_background(StateDict state) { return prepare_in_background(one_state(std::move(state))); }

Status Checkpointer::prepare(const StateDict& state, bool async) { return prepare(one_state(state), async); }

Status Checkpointer::prepare(StateDict&& state, bool async) { return prepare(one_state(std::move(state)), async); }

Status Checkpointer::prepare(const std::vector<StateDict>& states, bool async) {
  return prepare(std::vector<StateDict>(states), async);
}

Status Checkpointer::prepare(std::vector<StateDict>&& states, bool async) {
  SH_RETURN_IF_ERROR(impl_->await_background());
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->prepare(std::move(states), async);
}

Status Checkpointer::save(std::int64_t step, const StateDict& state) { return save(step, one_state(state)); }

Status Checkpointer::save(std::int64_t step, StateDict&& state) { return save(step, one_state(std::move(state))); }

Status Checkpointer::save(std::int64_t step, const std::vector<StateDict>& states) {
  return save(step, std::vector<StateDict>(states));
}

Status Checkpointer::save(std::int64_t step, std::vector<StateDict>&& states) {
  SH_RETURN_IF_ERROR(impl_->await_background());
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->save(step, std::move(states), false, impl_).status();
}

Result<PendingSave> Checkpointer::async_save(std::int64_t step, const StateDict& state) {
  return async_save(step, one_state(state));
}

Result<PendingSave> Checkpointer::async_save(std::int64_t step, StateDict&& state) {
  return async_save(step, one_state(std::move(state)));
}

Result<PendingSave> Checkpointer::async_save(std::int64_t step, const std::vector<StateDict>& states) {
  return async_save(step, std::vector<StateDict>(states));
}

Result<PendingSave> Checkpointer::async_save(std::int64_t step, std::vector<StateDict>&& states) {
  SH_RETURN_IF_ERROR(impl_->await_background());
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->save(step, std::move(states), true, impl_);
}

bool Checkpointer::staged() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->staged();
}

Result<double> Checkpointer::fence() {
  SH_RETURN_IF_ERROR(impl_->await_background());
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (!impl_->client) return 0.0;
  return impl_->client->fence();
}

Status Checkpointer::load(StateDict& state, const std::string& path) {
  std::vector<StateDict> states = one_state(state);
  SH_RETURN_IF_ERROR(load(states, path));
  state.objects = std::move(states[0].objects);
  return Status::ok();
}

Status Checkpointer::load(std::vector<StateDict>& states, const std::string& path) {
  SH_RETURN_IF_ERROR(impl_->await_background());
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->load(states, path);
}

Status Checkpointer::finalize() {
  SH_RETURN_IF_ERROR(impl_->await_background());
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->finalize();
}

}  // namespace stagehand
