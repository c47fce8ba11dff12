#pragma once

#include <caf/atom.hpp>

#include "strategy/messages.hpp"

namespace stagehand {

// -- atoms between trainers, the WorkerDispatch and Workers (plus the checkpoint atoms of
// strategy/messages.hpp: save, finalize, load) --

/// train_atom, step, objective (0 rl, 1 sft), behaviour actions (empty: sample on-policy)
///   -> (double reward, double loss)
using train_atom = caf::atom_constant<caf::atom("train")>;
/// eval_atom -> double greedy accuracy
using eval_atom = caf::atom_constant<caf::atom("eval")>;
/// export_atom, version -> void: publish the current weights for generators.
using export_atom = caf::atom_constant<caf::atom("export")>;
/// generate_atom, batch step, weights version, first context, count -> vector<int32> actions
using generate_atom = caf::atom_constant<caf::atom("generate")>;
/// Internal to a Worker: attach_atom, strategy actor.
using attach_atom = caf::atom_constant<caf::atom("attach")>;

}  // namespace stagehand
