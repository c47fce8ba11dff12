#include "stagehand/actors/worker_dispatch.hpp"

#include <caf/all.hpp>

#include <algorithm>
#include <array>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <tuple>
#include <vector>

#include "stagehand/actors/messages.hpp"
#include "stagehand/checkpoint/report_codec.hpp"
#include "stagehand/core/status.hpp"

namespace stagehand {

namespace {

/// Adds one rank's load notes to `merged`: missing names of any rank, unused tensors of every
/// rank (`first` for the first rank's notes). Lists stay sorted.
void merge_load_notes(const LoadReport& rank, bool first, LoadReport& merged) {
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

using Clock = std::chrono::steady_clock;
using Callback = std::function<void(Status)>;

class WorkerDispatch : public caf::event_based_actor {
 public:
  WorkerDispatch(caf::actor_config& cfg, std::vector<caf::actor> workers, caf::actor coordinator,
                 DispatchOptions options)
      : caf::event_based_actor(cfg),
        workers_(std::move(workers)),
        coordinator_(std::move(coordinator)),
        options_(std::move(options)) {}

  caf::behavior make_behavior() override {
    for (std::size_t rank = 0; rank < workers_.size(); ++rank) {
      monitor(workers_[rank]);
      rank_of_[workers_[rank].address()] = static_cast<int>(rank);
    }
    set_down_handler([this](const caf::down_msg& down) { on_worker_down(down); });
    return {
        [this](train_atom, std::int64_t step, std::int32_t objective,
               const std::vector<std::int32_t>& behaviour_actions) -> caf::result<double, double, double> {
          auto rp = make_response_promise<double, double, double>();
          // Rank 0's reward and loss (global figures), the longest fence wait of any rank.
          auto metrics = std::make_shared<std::array<double, 3>>();
          fan_out<double, double, double>(
              caf::make_message(train_atom::value, step, objective, behaviour_actions),
              [metrics](int rank, double reward, double loss, double fence_wait) {
                if (rank == 0) std::tie((*metrics)[0], (*metrics)[1]) = std::tie(reward, loss);
                (*metrics)[2] = std::max((*metrics)[2], fence_wait);
              },
              [rp, metrics](Status st) mutable {
                if (st.is_ok()) {
                  rp.deliver((*metrics)[0], (*metrics)[1], (*metrics)[2]);
                } else {
                  rp.deliver(to_caf_error(st));
                }
              });
          return rp;
        },
        [this](phases_atom atom, std::int64_t step) { return delegate(coordinator_, atom, step); },
        [this](fence_atom) -> caf::result<double> {
          auto rp = make_response_promise<double>();
          auto longest = std::make_shared<double>(0);
          fan_out<double>(
              caf::make_message(fence_atom::value),
              [longest](int, double waited) { *longest = std::max(*longest, waited); },
              [rp, longest](Status st) mutable {
                if (st.is_ok()) {
                  rp.deliver(*longest);
                } else {
                  rp.deliver(to_caf_error(st));
                }
              });
          return rp;
        },
        [this](eval_atom) -> caf::result<double> {
          auto rp = make_response_promise<double>();
          auto accuracy = std::make_shared<double>(0);
          fan_out<double>(
              caf::make_message(eval_atom::value), [accuracy](int rank, double a) { if (rank == 0) *accuracy = a; },
              [rp, accuracy](Status st) mutable {
                if (st.is_ok()) {
                  rp.deliver(*accuracy);
                } else {
                  rp.deliver(to_caf_error(st));
                }
              });
          return rp;
        },
        [this](export_atom, std::int64_t version) -> caf::result<void> {
          auto rp = make_response_promise();
          fan_out<>(caf::make_message(export_atom::value, version), [](int) {}, [rp](Status st) mutable {
            if (st.is_ok()) {
              rp.deliver(caf::unit);
            } else {
              rp.deliver(to_caf_error(st));
            }
          });
          return rp;
        },
        [this](save_atom, std::int64_t step, const std::string& trainer_state) -> caf::result<double, bool> {
          auto rp = make_response_promise<double, bool>();
          save(step, trainer_state, [rp](Status st, double stall, bool async) mutable {
            if (st.is_ok()) {
              rp.deliver(stall, async);
            } else {
              rp.deliver(to_caf_error(st));
            }
          });
          return rp;
        },
        [this](finalize_atom) -> caf::result<bool> {
          auto rp = make_response_promise<bool>();
          finalize([rp](Status st) mutable {
            if (st.is_ok()) {
              rp.deliver(true);
            } else {
              rp.deliver(to_caf_error(st));
            }
          });
          return rp;
        },
        [this](load_atom, const std::string& checkpoint_dir, const std::string& scope)
            -> caf::result<double, double, double, double, std::uint64_t, std::string> {
          auto rp = make_response_promise<double, double, double, double, std::uint64_t, std::string>();
          finalize([this, rp, checkpoint_dir, scope](Status st) mutable {
            if (!st.is_ok()) {
              rp.deliver(to_caf_error(st));
              return;
            }
            // The slowest rank's times, every rank's bytes and missing names, and the tensors no
            // rank used (a rank of a pipeline-parallel model holds only some of them).
            auto merged = std::make_shared<LoadReport>();
            auto notes_ok = std::make_shared<Status>();
            auto first = std::make_shared<bool>(true);
            fan_out<double, double, double, double, std::uint64_t, std::string>(
                caf::make_message(load_atom::value, checkpoint_dir, scope),
                [merged, notes_ok, first](int, double total_s, double read_s, double verify_s, double copy_s,
                                          std::uint64_t b, const std::string& notes) {
                  merged->total_s = std::max(merged->total_s, total_s);
                  merged->read_s = std::max(merged->read_s, read_s);
                  merged->verify_s = std::max(merged->verify_s, verify_s);
                  merged->copy_s = std::max(merged->copy_s, copy_s);
                  merged->bytes += b;
                  LoadReport rank;
                  if (Status decoded = decode_load_notes(notes, rank); !decoded.is_ok()) *notes_ok = decoded;
                  merge_load_notes(rank, *first, *merged);
                  *first = false;
                },
                [rp, merged, notes_ok](Status loaded) mutable {
                  if (loaded.is_ok()) loaded = *notes_ok;
                  if (loaded.is_ok()) {
                    const LoadReport& m = *merged;
                    rp.deliver(m.total_s, m.read_s, m.verify_s, m.copy_s, m.bytes, encode_load_notes(m));
                  } else {
                    rp.deliver(to_caf_error(loaded));
                  }
                });
          });
          return rp;
        },
    };
  }

 private:
  struct Gather {
    std::size_t remaining = 0;
    bool failed = false;
    Callback on_done;
  };

  /// Sends `msg` to every Worker at once; `each` sees every reply, `done` runs once with ok
  /// after all replied, or with the first failure (named by rank) as soon as it happens.
  template <class... Ts, class Each>
  void fan_out(const caf::message& msg, Each each, Callback on_done) {
    for (std::size_t rank = 0; rank < workers_.size(); ++rank) {
      auto dead = dead_.find(static_cast<int>(rank));
      if (dead != dead_.end()) {
        on_done({ErrorCode::aborted, "rank " + std::to_string(rank) + " is dead: " + dead->second});
        return;
      }
    }
    auto gather = std::make_shared<Gather>();
    gather->remaining = workers_.size();
    gather->on_done = on_done;
    std::erase_if(in_flight_, [](const std::weak_ptr<Gather>& g) { return g.expired(); });
    in_flight_.push_back(gather);
    for (std::size_t rank = 0; rank < workers_.size(); ++rank) {
      const int r = static_cast<int>(rank);
      request(workers_[rank], options_.timeout, msg)
          .then(
              [gather, each, on_done, r](Ts... xs) {
                if (gather->failed) return;
                each(r, xs...);
                if (--gather->remaining == 0) {
                  gather->failed = true;  // done: a later death does not fail it again
                  on_done(Status::ok());
                }
              },
              [this, gather, on_done, r](caf::error& err) {
                if (gather->failed) return;
                gather->failed = true;
                Status st = from_caf_error(err);
                auto dead = dead_.find(r);
                if (dead != dead_.end()) st = {ErrorCode::aborted, "rank " + std::to_string(r) + " died: " + dead->second};
                on_done(st.with_context("rank " + std::to_string(r)));
              });
    }
  }

  void finalize(Callback on_done) {
    fan_out<bool>(caf::make_message(finalize_atom::value), [](int, bool) {}, [this, on_done](Status drained) {
      if (!pending_step_) {
        on_done(drained);
        return;
      }
      std::int64_t step = *pending_step_;
      pending_step_.reset();
      if (!drained.is_ok()) {
        abort_step(step, drained, on_done);
        return;
      }
      request(coordinator_, options_.timeout, await_atom::value, step)
          .then([on_done]() { on_done(Status::ok()); }, [on_done](caf::error& err) { on_done(from_caf_error(err)); });
    });
  }

  void save(std::int64_t step, const std::string& trainer_state, std::function<void(Status, double, bool)> on_done) {
    auto start = Clock::now();
    auto elapsed = [start] { return std::chrono::duration<double>(Clock::now() - start).count(); };
    finalize([=, this](Status prior) {
      if (!prior.is_ok()) {
        on_done(prior.with_context("an earlier checkpoint save failed"), 0, false);
        return;
      }
      request(coordinator_, options_.timeout, begin_atom::value, step, trainer_state)
          .then(
              [=, this](const std::string& policy_dir) {
                pending_step_ = step;
                auto async = std::make_shared<bool>(false);
                fan_out<double, bool>(
                    caf::make_message(save_atom::value, step, options_.destination, policy_dir),
                    [async](int, double, bool a) { *async = a; },
                    [=, this](Status saved) {
                      if (!saved.is_ok()) {
                        pending_step_.reset();
                        abort_step(step, saved, [on_done](Status st) { on_done(st, 0, false); });
                      } else if (*async) {
                        on_done(Status::ok(), elapsed(), true);
                      } else {
                        finalize([=](Status committed) { on_done(committed, elapsed(), false); });
                      }
                    });
              },
              [on_done](caf::error& err) { on_done(from_caf_error(err), 0, false); });
    });
  }

  /// Gives up `step` at the coordinator and answers `on_done` with `why` once the coordinator
  /// has removed what the step left (its answer to the await follows the abort, in order).
  void abort_step(std::int64_t step, Status why, Callback on_done) {
    send(coordinator_, abort_atom::value, step, why.message());
    request(coordinator_, options_.timeout, await_atom::value, step)
        .then([on_done, why] { on_done(why); }, [on_done, why](caf::error&) { on_done(why); });
  }

  void on_worker_down(const caf::down_msg& down) {
    auto it = rank_of_.find(down.source);
    if (it == rank_of_.end()) return;
    std::string reason = down.reason == caf::exit_reason::remote_link_unreachable
                             ? "its process exited or cannot be reached"
                             : caf::to_string(down.reason);
    dead_[it->second] = reason;
    // Calls waiting on that rank fail now (a request to a Worker in a process that died may
    // otherwise only end at its time limit).
    const Status died{ErrorCode::aborted, "rank " + std::to_string(it->second) + " died: " + reason};
    for (auto& weak : in_flight_) {
      if (auto gather = weak.lock(); gather && !gather->failed) {
        gather->failed = true;
        gather->on_done(died);
      }
    }
    in_flight_.clear();
    if (pending_step_) {
      send(coordinator_, abort_atom::value, *pending_step_,
           "rank " + std::to_string(it->second) + " died during the save: " + reason);
    }
  }

  std::vector<caf::actor> workers_;
  caf::actor coordinator_;
  DispatchOptions options_;
  std::map<caf::actor_addr, int> rank_of_;
  std::map<int, std::string> dead_;
  std::optional<std::int64_t> pending_step_;
  /// Fan-outs whose replies are not all in.
  std::vector<std::weak_ptr<Gather>> in_flight_;
};

}  // namespace

caf::actor spawn_worker_dispatch(caf::actor_system& system, std::vector<caf::actor> workers, caf::actor coordinator,
                                 DispatchOptions options) {
  return system.spawn<WorkerDispatch>(std::move(workers), std::move(coordinator), std::move(options));
}

}  // namespace stagehand
