#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "stagehand/checkpoint/metadata/metadata.hpp"
#include "stagehand/core/status.hpp"

namespace stagehand {

class WritableFile;

// -- writing --

/// metadata.json's text: deterministic (members in key order, strings escaped as
/// nlohmann::json's dump() escapes them), one line for each file, object, tensor and chunk, and
/// a "checksum" member first (metadata_text_checksum of the text).
/// @pre every name and object is valid UTF-8 (is_valid_utf8).
std::string metadata_to_json(const CheckpointMetadata& metadata);
/// The same text for the metadata the reports hold (what metadata_to_json of the copy holds).
std::string metadata_to_json(const GatheredMetadata& metadata);
/// Appends that text to `file` a few MiB at a time as it is formed, starting each piece's
/// write-back at once, and writes the checksum into its place last; the caller syncs the file.
Status write_metadata_json(const GatheredMetadata& metadata, WritableFile& file);

// -- reading --

/// Parses metadata.json, checks the format name and version and every field's type and range,
/// then applies validate_metadata, then checks the file's "checksum" against
/// metadata_text_checksum of `text`, so that a hand edit of any field is found (also one that
/// reorders members or escapes a string otherwise; only whitespace outside strings may change).
/// Never throws: errors are corruption naming `source` and the field (for instance
/// "tensors['w'].chunks[1].byte_range[0]"), or saying that the file "was changed after it was
/// written" with both digests.
Result<CheckpointMetadata> metadata_from_json(const std::string& text, const std::string& source);

// -- the checksum --

/// What metadata.json's "checksum" holds: the XXH3 of the file's compact text without that
/// member, taken in one pass over the bytes of `text` as they are. Hashed is everything except
/// whitespace outside strings (space, tab, line feed, carriage return) and the top-level
/// "checksum" member: its key, colon, value and the comma that separates it from a neighbour,
/// wherever in the top level it stands. Only the first top-level member whose key is written
/// "checksum" is left out; a "checksum" key inside a value, a second top-level one, or one
/// spelled with an escape is hashed like any other text (so a file with two never verifies).
///
/// For every text metadata_to_json writes, indented any way, this is the digest its checksum
/// holds: its compact text is that text minus whitespace, with members already in key order and
/// strings escaped as nlohmann::json's dump() escapes them. Every other change alters the digest:
/// a value, the order of members, the escaping of a string.
/// Defined for any text (on text that is not JSON the digest means nothing); never reads past
/// `text`.
std::uint64_t metadata_text_checksum(std::string_view text);

}  // namespace stagehand
