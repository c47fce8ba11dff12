#pragma once

#include <string_view>

namespace stagehand {

/// Whether `text` is well-formed UTF-8: no stray or missing continuation bytes, overlong forms,
/// surrogates or code points past U+10FFFF. JSON text is UTF-8, so every string Stagehand writes
/// into a JSON file (names, objects) must pass.
bool is_valid_utf8(std::string_view text);

}  // namespace stagehand
