#pragma once
// The consumer's own core/status.hpp: Stagehand's headers must never pick this one up.
namespace consumer {
enum class Status { fine, broken };
}
