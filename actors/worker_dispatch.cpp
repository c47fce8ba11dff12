#include "stagehand/actors/worker_dispatch.hpp"

#include <caf/all.hpp>

#include <algorithm>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <vector>

#include "stagehand/core/foreground_gate.hpp"
#include "stagehand/core/status.hpp"

namespace stagehand {

namespace {

using Clock = std::chrono::steady_clock;
using Callback = std::function<void(Status)>;

/// Adds one rank's load notes to `merged`: missing names of any rank, unused tensors of every
/// rank (`first` for the first rank's notes). Lists stay sorted.
void merge_load_report(const LoadReport& rank, bool first, LoadReport& merged) {
  merged.total_s = std::max(merged.total_s, rank.total_s);
  merged.read_s = std::max(merged.read_s, rank.read_s);
  merged.verify_s = std::max(merged.verify_s, rank.verify_s);
  merged.copy_s = std::max(merged.copy_s, rank.copy_s);
  merged.bytes += rank.bytes;
  auto unite = [](std::vector<std::string>& into, const std::vector<std::string>& more) {
    std::vector<std::string> out;
    std::set_union(into.begin(), into.end(), more.begin(), more.end(), std::back_inserter(out));
    into.swap(out);
  };
  unite(merged.missing_tensors, rank.missing_tensors);
  unite(merged.missing_objects, rank.missing_objects);
  if (first) {
    merged.unused_tensors = rank.unused_tensors;
  } else {
    std::vector<std::string> out;
    std::set_intersection(merged.unused_tensors.begin(), merged.unused_tensors.end(), rank.unused_tensors.begin(),
                          rank.unused_tensors.end(), std::back_inserter(out));
    merged.unused_tensors.swap(out);
  }
}

template <class T>
void answer(caf::typed_response_promise<T>& rp, const Status& st, T value) {
  if (st.is_ok()) {
    rp.deliver(std::move(value));
  } else {
    rp.deliver(to_caf_error(st));
  }
}

class WorkerDispatch : public dispatch_actor::base {
 public:
  WorkerDispatch(caf::actor_config& cfg, std::vector<worker_actor> workers, coordinator_actor coordinator,
                 DispatchOptions options)
      : dispatch_actor::base(cfg),
        workers_(std::move(workers)),
        coordinator_(std::move(coordinator)),
        options_(std::move(options)) {}

  behavior_type make_behavior() override {
    for (std::size_t rank = 0; rank < workers_.size(); ++rank) {
      monitor(workers_[rank]);
      rank_of_[workers_[rank].address()] = options_.first_rank + static_cast<int>(rank);
    }
    monitor(coordinator_);
    set_down_handler([this](const caf::down_msg& down) { on_down(down); });
    return {
        [this](train_atom, const TrainOrder& order) -> caf::result<StepMetrics> {
          auto rp = make_response_promise<StepMetrics>();
          auto metrics = std::make_shared<StepMetrics>();
          fan_out<StepMetrics>(
              "training step " + std::to_string(order.step),
              [this, order](std::size_t r) { return request(workers_[r], options_.timeout, train_atom::value, order); },
              [metrics, options_first_rank = options_.first_rank](int rank, StepMetrics& m) {
                // The first rank's reward and loss (global figures), the longest fence wait.
                if (rank == options_first_rank) std::tie(metrics->reward, metrics->loss) = std::tie(m.reward, m.loss);
                metrics->fence_wait_s = std::max(metrics->fence_wait_s, m.fence_wait_s);
              },
              [rp, metrics](Status st) mutable { answer(rp, st, *metrics); });
          return rp;
        },
        [this](fence_atom) -> caf::result<double> {
          auto rp = make_response_promise<double>();
          auto longest = std::make_shared<double>(0);
          fan_out<double>(
              "the fence", [this](std::size_t r) { return request(workers_[r], options_.timeout, fence_atom::value); },
              [longest](int, double waited) { *longest = std::max(*longest, waited); },
              [rp, longest](Status st) mutable { answer(rp, st, *longest); });
          return rp;
        },
        [this](eval_atom) -> caf::result<double> {
          auto rp = make_response_promise<double>();
          auto accuracy = std::make_shared<double>(0);
          fan_out<double>(
              "the evaluation",
              [this](std::size_t r) { return request(workers_[r], options_.timeout, eval_atom::value); },
              [accuracy, first = options_.first_rank](int rank, double a) {
                if (rank == first) *accuracy = a;
              },
              [rp, accuracy](Status st) mutable { answer(rp, st, *accuracy); });
          return rp;
        },
        [this](export_atom, std::int64_t version, std::int32_t wait_for) -> caf::result<void> {
          auto rp = make_response_promise<void>();
          fan_out<>(
              "the weight export of version " + std::to_string(version),
              [this, version, wait_for](std::size_t r) {
                return request(workers_[r], options_.timeout, export_atom::value, version, wait_for);
              },
              [](int) {},
              [rp](Status st) mutable {
                // A void promise is satisfied through its untyped self.
                caf::response_promise& untyped = rp;
                if (st.is_ok()) {
                  untyped.deliver(caf::unit);
                } else {
                  untyped.deliver(to_caf_error(st));
                }
              });
          return rp;
        },
        [this](save_atom, const SaveCall& call) -> caf::result<SaveResult> {
          auto rp = make_response_promise<SaveResult>();
          save(call, [rp](Status st, SaveResult result) mutable { answer(rp, st, result); });
          return rp;
        },
        [this](finalize_atom) -> caf::result<FinalizeResult> {
          auto rp = make_response_promise<FinalizeResult>();
          finalize([rp](Status st, FinalizeResult result) mutable { answer(rp, st, result); });
          return rp;
        },
        [this](load_atom, const LoadCall& call) -> caf::result<LoadReport> {
          auto rp = make_response_promise<LoadReport>();
          finalize([this, rp, call](Status st, FinalizeResult) mutable {
            if (!st.is_ok()) {
              rp.deliver(to_caf_error(st));
              return;
            }
            auto merged = std::make_shared<LoadReport>();
            auto first = std::make_shared<bool>(true);
            fan_out<LoadReport>(
                "the load of '" + call.path + "'",
                [this, call](std::size_t r) { return request(workers_[r], options_.timeout, load_atom::value, call); },
                [merged, first](int, LoadReport& report) {
                  merge_load_report(report, *first, *merged);
                  *first = false;
                },
                [rp, merged](Status loaded) mutable { answer(rp, loaded, *merged); });
          });
          return rp;
        },
    };
  }

  void on_exit() override {
    // The handles go with the actor's end, not its destruction: nothing it held may keep a
    // detached Worker or the coordinator (and so the actor system's shutdown) waiting.
    workers_.clear();
    coordinator_ = nullptr;
    in_flight_.clear();
  }

 private:
  using FinalizeCallback = std::function<void(Status, FinalizeResult)>;

  /// The replies of one call that are not all in.
  struct Gather {
    std::size_t remaining = 0;
    /// The ranks whose reply is not in (fan_out).
    std::set<int> waiting;
    bool done = false;
    Callback on_done;

    void finish(Status st) {
      if (done) return;
      done = true;
      on_done(std::move(st));
    }
  };

  /// Why every call fails at once: the coordinator or a rank is gone.
  std::optional<Status> broken() const {
    if (coordinator_down_) return *coordinator_down_;
    if (!dead_.empty()) {
      return Status{ErrorCode::aborted,
                    "rank " + std::to_string(dead_.begin()->first) + " is dead: " + dead_.begin()->second};
    }
    return std::nullopt;
  }

  std::shared_ptr<Gather> track(std::size_t replies, Callback on_done) {
    auto gather = std::make_shared<Gather>();
    gather->remaining = replies;
    gather->on_done = std::move(on_done);
    std::erase_if(in_flight_, [](const std::weak_ptr<Gather>& g) { return g.expired(); });
    in_flight_.push_back(gather);
    return gather;
  }

  /// The error of rank `rank`'s failed reply to `what`, naming the rank (and the limit, when it
  /// passed: then every rank in `waiting` whose reply was not in either, since a rank that stalls
  /// holds up the ranks waiting for it in a collective, and the first to time out may be one of
  /// those).
  Status rank_error(int rank, const std::string& what, const caf::error& err, const std::set<int>& waiting) const {
    const std::string who = "rank " + std::to_string(rank);
    if (coordinator_down_) return *coordinator_down_;
    if (auto dead = dead_.find(rank); dead != dead_.end()) return {ErrorCode::aborted, who + " died: " + dead->second};
    if (err == caf::sec::request_timeout) {
      std::string late = who;
      if (waiting.size() > 1) {
        late = "ranks ";
        for (int r : waiting) late += (r == *waiting.begin() ? "" : ", ") + std::to_string(r);
      }
      return {ErrorCode::timeout, late + " did not finish " + what + " within " + seconds(options_.timeout) + " (" +
                                      options_.timeout_setting + ")"};
    }
    return from_caf_error(err).with_context(who);
  }

  static std::string seconds(std::chrono::milliseconds limit) {
    std::ostringstream out;
    out << static_cast<double>(limit.count()) / 1000.0 << " s";
    return out.str();
  }

  /// Sends a request (made by `make` for each rank) to every Worker at once; `each` sees every
  /// reply, `on_done` runs once with ok after all replied, or with the first failure (named by
  /// rank) as soon as it happens.
  template <class... Ts, class MakeRequest, class Each>
  void fan_out(const std::string& what, MakeRequest make, Each each, Callback on_done) {
    if (auto why = broken()) {
      on_done(*why);
      return;
    }
    auto gather = track(workers_.size(), std::move(on_done));
    for (std::size_t rank = 0; rank < workers_.size(); ++rank) {
      const int r = options_.first_rank + static_cast<int>(rank);
      gather->waiting.insert(r);
      make(rank).then(
          [gather, each, r](Ts&... xs) mutable {
            if (gather->done) return;
            gather->waiting.erase(r);
            each(r, xs...);
            if (--gather->remaining == 0) gather->finish(Status::ok());
          },
          [this, gather, r, what](caf::error& err) { gather->finish(rank_error(r, what, err, gather->waiting)); });
    }
  }

  /// Waits at the coordinator for the commit of `step`.
  void await_commit(std::int64_t step, std::function<void(Result<CommitInfo>)> on_done) {
    if (coordinator_down_) {
      on_done(*coordinator_down_);
      return;
    }
    auto info = std::make_shared<CommitInfo>();
    auto gather = track(1, [on_done, info](Status st) {
      if (st.is_ok()) {
        on_done(*info);
      } else {
        on_done(st);
      }
    });
    request(coordinator_, options_.timeout, await_atom::value, step)
        .then(
            [gather, info](CommitInfo& committed) {
              *info = committed;
              gather->finish(Status::ok());
            },
            [this, gather, step](caf::error& err) {
              gather->finish(err == caf::sec::request_timeout
                                 ? Status{ErrorCode::timeout, "the commit of step " + std::to_string(step) +
                                                                  " did not finish within " + seconds(options_.timeout) +
                                                                  " (" + options_.timeout_setting + ")"}
                                 : from_caf_error(err));
            });
  }

  /// Drains every rank and waits for the pending step's commit; nothing to do when no save is
  /// pending (a failed background write was reported by it).
  void finalize(FinalizeCallback on_done) {
    if (!pending_step_) {
      on_done(Status::ok(), {});
      return;
    }
    const std::int64_t step = *pending_step_;
    pending_step_.reset();
    fan_out<bool>(
        "the finalize of step " + std::to_string(step),
        [this](std::size_t r) { return request(workers_[r], options_.timeout, finalize_atom::value); },
        [](int, bool) {},
        [this, step, on_done](Status drained) {
          if (!drained.is_ok()) {
            abort_step(step, drained, [on_done](Status st) { on_done(st, {}); });
            return;
          }
          commit_of(step, on_done);
        });
  }

  void commit_of(std::int64_t step, FinalizeCallback on_done) {
    await_commit(step, [on_done](Result<CommitInfo> committed) {
      if (committed.is_ok()) {
        on_done(Status::ok(), FinalizeResult{true, *committed});
      } else {
        on_done(committed.status(), {});
      }
    });
  }

  void save(const SaveCall& call, std::function<void(Status, SaveResult)> on_done) {
    const auto start = Clock::now();
    auto elapsed = [start] { return std::chrono::duration<double>(Clock::now() - start).count(); };
    finalize([=, this](Status prior, FinalizeResult) {
      if (!prior.is_ok()) {
        on_done(prior.with_context("an earlier checkpoint save failed"), {});
        return;
      }
      pending_step_ = call.step;
      auto async = std::make_shared<bool>(true);
      // The caller is blocked until every rank has staged: background writes in this process
      // (ranks that staged first, a tier copy) wait meanwhile, whichever rank is still staging.
      auto foreground = std::make_shared<ForegroundGate::Hold>();
      if (call.async) *foreground = foreground_gate().hold();
      fan_out<SaveAck>(
          "the save of step " + std::to_string(call.step),
          [this, call](std::size_t r) {
            SaveCall one = call;
            if (r != 0) one.trainer_state.clear();
            // A Worker's save waits for the plan, then for its strategy's save, each limited
            // on its own: their errors name the late rank; this limit is only their backstop.
            return request(workers_[r], outer_limit(plan_wait_limit(options_.timeout) + options_.timeout),
                           save_atom::value, std::move(one));
          },
          [async](int, SaveAck& ack) { *async = *async && ack.async; },
          [=, this](Status saved) {
            foreground->release();
            if (!saved.is_ok()) {
              pending_step_.reset();
              abort_step(call.step, saved, [on_done](Status st) { on_done(st, {}); });
              return;
            }
            if (*async) {
              on_done(Status::ok(), SaveResult{elapsed(), true, false, {}});
              return;
            }
            // Written on every rank: every report is on its way; the commit follows.
            pending_step_.reset();
            commit_of(call.step, [on_done, elapsed](Status committed, FinalizeResult f) {
              on_done(committed, SaveResult{elapsed(), false, f.committed, f.commit});
            });
          });
    });
  }

  /// Gives up `step` at the coordinator and answers `on_done` with `why` once the coordinator
  /// has removed what the step left (its answer to the await follows the abort, in order).
  void abort_step(std::int64_t step, Status why, Callback on_done) {
    if (coordinator_down_) {
      on_done(why);
      return;
    }
    send(coordinator_, abort_atom::value, step, static_cast<std::int32_t>(options_.first_rank), why.message());
    // The caller goes on once the coordinator has taken the abort (it answers in order). Not an
    // await of the step: another rank may already be saving the step again, and that save
    // needs this rank's plan too, which the caller sends only after this call returns.
    auto gather = track(1, [on_done, why](Status) { on_done(why); });
    request(coordinator_, options_.timeout, poll_atom::value, step)
        .then([gather](bool) { gather->finish(Status::ok()); },
              [gather](caf::error& err) { gather->finish(from_caf_error(err)); });
  }

  void on_down(const caf::down_msg& down) {
    const std::string reason = down.reason == caf::exit_reason::remote_link_unreachable
                                   ? "its process exited or cannot be reached"
                                   : caf::to_string(down.reason);
    Status died;
    if (down.source == coordinator_.address()) {
      coordinator_down_ = Status{ErrorCode::aborted, "the checkpoint coordinator (rank 0) died: " + reason};
      died = *coordinator_down_;
    } else if (auto it = rank_of_.find(down.source); it != rank_of_.end()) {
      dead_[it->second] = reason;
      died = {ErrorCode::aborted, "rank " + std::to_string(it->second) + " died: " + reason};
      // The coordinator learns it from here when the rank was in this process (a rank in another
      // process is reported by the world's host too): a dead rank will never report, and the
      // coordinator must not wait for it to stop writing.
      send(coordinator_, rank_down_atom::value, static_cast<std::int32_t>(it->second), reason);
      if (pending_step_) {
        send(coordinator_, abort_atom::value, *pending_step_, static_cast<std::int32_t>(options_.first_rank),
             died.message() + " during the save");
      }
    } else {
      return;
    }
    // Calls waiting on that rank fail now (a request to an actor in a process that died may
    // otherwise only end at its time limit).
    // Taken out first: finishing a call may start another (an abort), which tracks its own.
    auto waiting = std::exchange(in_flight_, {});
    for (auto& weak : waiting) {
      if (auto gather = weak.lock()) gather->finish(died);
    }
  }

  std::vector<worker_actor> workers_;
  coordinator_actor coordinator_;
  DispatchOptions options_;
  std::map<caf::actor_addr, int> rank_of_;
  std::map<int, std::string> dead_;
  std::optional<Status> coordinator_down_;
  std::optional<std::int64_t> pending_step_;
  /// Calls whose replies are not all in.
  std::vector<std::weak_ptr<Gather>> in_flight_;
};

}  // namespace

dispatch_actor spawn_worker_dispatch(caf::actor_system& system, std::vector<worker_actor> workers,
                                     coordinator_actor coordinator, DispatchOptions options) {
  return system.spawn<WorkerDispatch>(std::move(workers), std::move(coordinator), std::move(options));
}

}  // namespace stagehand
