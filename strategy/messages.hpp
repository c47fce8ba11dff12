#pragma once

#include <caf/atom.hpp>
#include <caf/fwd.hpp>

#include "stagehand/core/status.hpp"

namespace stagehand {

// -- atoms between a MegatronStrategy and its Worker (at most 10 characters each) --

/// save_atom, step, destination, policy_dir -> (stall seconds, bool async)
using save_atom = caf::atom_constant<caf::atom("save")>;
/// finalize_atom -> bool (true when a pending save was drained)
using finalize_atom = caf::atom_constant<caf::atom("finalize")>;
/// load_atom, checkpoint_dir, encoded load selection (encode_load_selection)
///   -> (total_s, read_s, verify_s, copy_s, uint64 bytes, encoded load notes (encode_load_notes))
using load_atom = caf::atom_constant<caf::atom("load")>;
/// Internal to a strategy: its queue finished a background write.
using write_done_atom = caf::atom_constant<caf::atom("writedone")>;
/// rank_saved_atom, encoded RankSaveReport: pushed upward when a rank's write ended.
using rank_saved_atom = caf::atom_constant<caf::atom("ranksaved")>;
/// stats_atom -> (staging bytes, pending writes, saves)
using stats_atom = caf::atom_constant<caf::atom("stats")>;

/// The CAF error category of Stagehand's errors.
inline constexpr caf::atom_value kErrorCategory = caf::atom("stagehand");

/// A Status as a caf::error of category kErrorCategory with the message as its context.
caf::error to_caf_error(const Status& status);

/// Back from a caf::error; errors of other categories (time-outs, dead actors) keep CAF's text.
Status from_caf_error(const caf::error& error);

/// Registers kErrorCategory so that CAF renders Stagehand errors readably.
void register_stagehand_errors(caf::actor_system_config& config);

}  // namespace stagehand
