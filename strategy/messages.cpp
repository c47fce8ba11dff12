#include "stagehand/strategy/messages.hpp"

#include <caf/all.hpp>

namespace stagehand {

caf::error to_caf_error(const Status& status) {
  if (status.is_ok()) return caf::none;
  return caf::error(static_cast<std::uint8_t>(status.code()), kErrorCategory,
                    caf::make_message(status.message(), static_cast<std::int32_t>(status.sys_errno())));
}

Status from_caf_error(const caf::error& error) {
  if (!error) return Status::ok();
  if (error.category() == kErrorCategory && error.context().match_elements<std::string, std::int32_t>()) {
    return {static_cast<ErrorCode>(error.code()), error.context().get_as<std::string>(0),
            error.context().get_as<std::int32_t>(1)};
  }
  ErrorCode code = ErrorCode::aborted;
  if (error == caf::sec::request_timeout) code = ErrorCode::timeout;
  return {code, "actor error " + caf::to_string(error)};
}

void register_stagehand_errors(caf::actor_system_config& config) {
  config.add_error_category(kErrorCategory, [](std::uint8_t code, caf::atom_value, const caf::message& ctx) {
    std::string out = std::string("stagehand ") + to_string(static_cast<ErrorCode>(code));
    if (ctx.match_elements<std::string, std::int32_t>()) out += ": " + ctx.get_as<std::string>(0);
    return out;
  });
}

}  // namespace stagehand
