#pragma once

// The protocol between a Worker and the MegatronStrategy it owns: a typed actor interface, so
// that a wrong message does not compile, and the structs its messages carry.

#include <caf/fwd.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "stagehand/checkpoint/load/loader.hpp"
#include "stagehand/checkpoint/save/report.hpp"
#include "stagehand/strategy/messages.hpp"

namespace stagehand {

/// What a rank saves of one step, as the coordinator's global plan assigned it.
struct SaveOrder {
  std::int64_t step = 0;
  /// Stage and return, writing in the background (turned sync where the destination's writes
  /// are uploads); false: write, then return.
  bool async = false;
  /// `<checkpoint>/policy`, where the rank's bucket files go.
  std::string policy_dir;
  /// The blocks of the rank's state it writes, by index (global_plan.hpp).
  std::vector<std::uint32_t> writes;
};

/// The answer to a SaveOrder.
struct SaveAck {
  /// How long the save blocked its caller (the whole write when sync; the staging when async).
  double stall_s = 0;
  /// Whether the write goes on in the background.
  bool async = false;
};

/// A load of one rank: from which checkpoint folder, with which selection (the owner's
/// Checkpointable::load_selection; the strategy sets the thread count).
struct LoadOrder {
  std::string checkpoint_dir;
  LoadOptions selection;
};

/// What a strategy holds, for tests and the bench.
struct StrategyStats {
  std::uint64_t staging_bytes = 0;
  std::int32_t pending_writes = 0;
  std::int64_t saves = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SaveOrder& x) {
  return f(x.step, x.async, x.policy_dir, x.writes);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SaveAck& x) {
  return f(x.stall_s, x.async);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, LoadOrder& x) {
  return f(x.checkpoint_dir, x.selection);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StrategyStats& x) {
  return f(x.staging_bytes, x.pending_writes, x.saves);
}

/// Whoever hears a rank's write reports: the Worker, which passes them on to the coordinator.
/// `(rank_saved_atom, report)` arrives once per save, when the rank's write ended (or failed).
using report_listener_actor = caf::typed_actor<caf::reacts_to<rank_saved_atom, RankSaveReport>>;

/// A rank's MegatronStrategy (strategy/megatron_strategy.hpp says what each message does).
/// Every reply is a value or an error, never an exception.
using strategy_actor = caf::typed_actor<
    /// Saves as ordered: waits for a pending save first; async stages and returns.
    caf::replies_to<save_atom, SaveOrder>::with<SaveAck>,
    /// Drains the queue; true when a pending write was drained; the kept error of a background
    /// write, once.
    caf::replies_to<finalize_atom>::with<bool>,
    /// Drains, then loads into the live state.
    caf::replies_to<load_atom, LoadOrder>::with<LoadReport>,
    caf::replies_to<stats_atom>::with<StrategyStats>,
    /// Internal: the strategy's queue finished a background write.
    caf::reacts_to<write_done_atom, std::int64_t>>;

}  // namespace stagehand
