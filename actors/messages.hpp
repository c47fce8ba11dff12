#pragma once

#include <caf/atom.hpp>

#include "strategy/messages.hpp"

namespace stagehand {

// -- atoms between trainers, the WorkerDispatch and Workers (plus the checkpoint atoms of
// strategy/messages.hpp: save, finalize, load) --

/// train_atom, step, objective (0 rl, 1 sft) -> (double reward, double loss)
using train_atom = caf::atom_constant<caf::atom("train")>;
/// eval_atom -> double greedy accuracy
using eval_atom = caf::atom_constant<caf::atom("eval")>;
/// Internal to a Worker: attach_atom, strategy actor.
using attach_atom = caf::atom_constant<caf::atom("attach")>;

}  // namespace stagehand
