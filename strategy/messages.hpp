#pragma once

#include <caf/atom.hpp>
#include <caf/fwd.hpp>

#include "stagehand/core/status.hpp"

namespace stagehand {

// -- atoms of the checkpoint protocols (at most 10 characters each); the typed interfaces that
// use them say what each carries: strategy/protocol.hpp, actors/protocol.hpp --

using save_atom = caf::atom_constant<caf::atom("save")>;
using finalize_atom = caf::atom_constant<caf::atom("finalize")>;
using load_atom = caf::atom_constant<caf::atom("load")>;
using write_done_atom = caf::atom_constant<caf::atom("writedone")>;
using rank_saved_atom = caf::atom_constant<caf::atom("ranksaved")>;
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
