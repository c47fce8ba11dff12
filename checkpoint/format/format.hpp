#pragma once

// The checkpoint format, whole: the folder layout, the safetensors data files, metadata.json
// (what it holds, its text and its checks) and the checksums they carry. Each part has a header
// of its own; include just the one a file needs.

#include "stagehand/checkpoint/format/layout.hpp"
#include "stagehand/checkpoint/metadata/metadata.hpp"
#include "stagehand/checkpoint/metadata/metadata_json.hpp"
#include "stagehand/checkpoint/metadata/metadata_validation.hpp"
#include "stagehand/checkpoint/format/safetensors.hpp"
#include "stagehand/core/utf8.hpp"
#include "stagehand/core/xxh3.hpp"
