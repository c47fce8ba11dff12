#pragma once

#include <string>

#include "stagehand/checkpoint/report.hpp"

namespace stagehand {

/// A report as JSON text, so that it can cross processes inside a plain CAF string message.
std::string encode_report(const RankSaveReport& report);
Result<RankSaveReport> decode_report(const std::string& text);

}  // namespace stagehand
