#pragma once

#include <string>

#include "stagehand/checkpoint/report.hpp"

namespace stagehand {

/// A report as JSON text, so that it can cross processes inside a plain CAF string message.
std::string encode_report(const RankSaveReport& report);
Result<RankSaveReport> decode_report(const std::string& text);

/// A committed save's phases as JSON text, with the coordinator's `commit_s` and the CPU seconds
/// its thread spent in them, `commit_cpu_s`: what phases_atom
/// answers and the trainers' save metrics line carries.
std::string encode_phases(const SavePhases& phases, double commit_s, double commit_cpu_s);

}  // namespace stagehand
