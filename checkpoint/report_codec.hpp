#pragma once

#include <string>

#include "stagehand/checkpoint/loader.hpp"
#include "stagehand/checkpoint/report.hpp"

namespace stagehand {

/// A report as JSON text, so that it can cross processes inside a plain CAF string message.
std::string encode_report(const RankSaveReport& report);
Result<RankSaveReport> decode_report(const std::string& text);

/// A committed save's phases as JSON text, with the coordinator's `commit_s` and the CPU seconds
/// its thread spent in them, `commit_cpu_s`: what phases_atom
/// answers and the trainers' save metrics line carries.
std::string encode_phases(const SavePhases& phases, double commit_s, double commit_cpu_s);

// -- loads: what crosses processes in the load messages (plain CAF strings) --

/// A trainer's LoadScope (trainer -> dispatch -> Worker).
std::string encode_load_scope(const LoadScope& scope);
Result<LoadScope> decode_load_scope(const std::string& text);

/// The selection fields of LoadOptions (skip, sources, optional_objects, strict, refuse_unused,
/// list_unused, convert_dtypes), which a Worker's model chooses and its strategy loads with. The other
/// fields of `into` are left as they are.
std::string encode_load_selection(const LoadOptions& options);
Status decode_load_selection(const std::string& text, LoadOptions& into);

/// The name lists of a LoadReport (missing_tensors, missing_objects, unused_tensors), going back
/// up from each rank; decode_load_notes sets `into`'s lists from them.
std::string encode_load_notes(const LoadReport& report);
Status decode_load_notes(const std::string& text, LoadReport& into);

/// A load reply of the dispatch (total_s, read_s, verify_s, copy_s, bytes, encoded notes) as the
/// LoadReport it stands for; the other fields stay 0.
Result<LoadReport> decode_load_reply(double total_s, double read_s, double verify_s, double copy_s,
                                     std::uint64_t bytes, const std::string& notes);

}  // namespace stagehand
