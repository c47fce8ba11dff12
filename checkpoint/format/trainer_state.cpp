#include "stagehand/checkpoint/format/trainer_state.hpp"

#include <cstdint>
#include <nlohmann/json.hpp>

#include "stagehand/checkpoint/format/format.hpp"
#include "stagehand/checkpoint/load/checkpoint_reader.hpp"

namespace stagehand {

std::string trainer_state_to_json(const TrainerState& s) {
  nlohmann::json j{{"step", s.step}, {"kind", s.kind}, {"seed", s.seed}, {"data_cursor", s.data_cursor}};
  if (s.layout) {
    j["layout"] = {{"tensor_parallel", s.layout->tensor_parallel}, {"data_parallel", s.layout->data_parallel}};
  }
  if (s.fully_async) {
    nlohmann::json batches = nlohmann::json::array();
    for (const auto& b : s.fully_async->pending_batches) {
      batches.push_back({{"step", b.step}, {"version", b.version}, {"actions", b.actions}});
    }
    j["fully_async"] = {{"max_staleness_steps", s.fully_async->max_staleness_steps},
                        {"num_generators", s.fully_async->num_generators},
                        {"next_generation_step", s.fully_async->next_generation_step},
                        {"max_staleness_seen", s.fully_async->max_staleness_seen},
                        {"pending_batches", std::move(batches)}};
  }
  return j.dump(1) + "\n";
}

namespace {

/// One JSON object of a trainer_state.json: reads its fields by type, and says which field of
/// which file is wrong instead of letting nlohmann::json throw.
class StateObject {
 public:
  StateObject(const nlohmann::json& j, const std::string& file, std::string path)
      : j_(j), file_(file), path_(std::move(path)) {}

  /// Reads `key` into `out`; a missing key leaves `out` as it is unless `required`.
  Status integer(const char* key, std::int64_t& out, bool required = false) const {
    const nlohmann::json* v = find(key);
    if (v == nullptr) return required ? missing(key) : Status::ok();
    if (!v->is_number_integer() || (v->is_number_unsigned() && v->get<std::uint64_t>() > kMaxInt64)) {
      return wrong(key, *v, "an integer");
    }
    out = v->get<std::int64_t>();
    return Status::ok();
  }

  Status unsigned_integer(const char* key, std::uint64_t& out) const {
    const nlohmann::json* v = find(key);
    if (v == nullptr) return Status::ok();
    if (!v->is_number_unsigned()) return wrong(key, *v, "a non-negative integer");
    out = v->get<std::uint64_t>();
    return Status::ok();
  }

  Status string(const char* key, std::string& out) const {
    const nlohmann::json* v = find(key);
    if (v == nullptr) return Status::ok();
    if (!v->is_string()) return wrong(key, *v, "a string");
    out = v->get<std::string>();
    return Status::ok();
  }

  Status int32_array(const char* key, std::vector<std::int32_t>& out) const {
    const nlohmann::json* v = find(key);
    if (v == nullptr) return missing(key);
    if (!v->is_array()) return wrong(key, *v, "an array of integers");
    out.clear();
    for (const auto& e : *v) {
      const bool fits = e.is_number_unsigned() ? e.get<std::uint64_t>() <= INT32_MAX
                                               : e.is_number_integer() && e.get<std::int64_t>() >= INT32_MIN &&
                                                     e.get<std::int64_t>() <= INT32_MAX;
      if (!fits) return error(key, "holds " + e.dump() + ", not a 32-bit integer");
      out.push_back(e.get<std::int32_t>());
    }
    return Status::ok();
  }

  /// The object or array at `key`; null when missing and not `required`.
  Result<const nlohmann::json*> nested(const char* key, nlohmann::json::value_t type, bool required) const {
    const nlohmann::json* v = find(key);
    if (v == nullptr && required) return missing(key);
    if (v != nullptr && v->type() != type) {
      return wrong(key, *v, type == nlohmann::json::value_t::array ? "an array" : "an object");
    }
    return v;
  }

  std::string field(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

  Status error(const std::string& key, const std::string& why) const {
    return {ErrorCode::corruption, "'" + file_ + "': field '" + field(key) + "' " + why};
  }

 private:
  static constexpr std::uint64_t kMaxInt64 = static_cast<std::uint64_t>(INT64_MAX);

  const nlohmann::json* find(const char* key) const {
    auto it = j_.find(key);
    return it == j_.end() ? nullptr : &*it;
  }
  Status missing(const std::string& key) const { return error(key, "is missing"); }
  Status wrong(const std::string& key, const nlohmann::json& v, const std::string& expected) const {
    return error(key, "is " + std::string(v.type_name()) + " " + v.dump() + ", not " + expected);
  }

  const nlohmann::json& j_;
  const std::string& file_;
  std::string path_;
};

Result<FullyAsyncState> read_fully_async_state(const nlohmann::json& j, const std::string& file) {
  const StateObject part(j, file, "fully_async");
  FullyAsyncState s;
  SH_RETURN_IF_ERROR(part.integer("max_staleness_steps", s.max_staleness_steps));
  SH_RETURN_IF_ERROR(part.integer("num_generators", s.num_generators));
  SH_RETURN_IF_ERROR(part.integer("next_generation_step", s.next_generation_step));
  SH_RETURN_IF_ERROR(part.integer("max_staleness_seen", s.max_staleness_seen));
  SH_ASSIGN_OR_RETURN(const nlohmann::json* batches,
                      part.nested("pending_batches", nlohmann::json::value_t::array, true));
  for (std::size_t i = 0; i < batches->size(); ++i) {
    const std::string key = "pending_batches[" + std::to_string(i) + "]";
    const nlohmann::json& b = (*batches)[i];
    if (!b.is_object()) return part.error(key, "is " + std::string(b.type_name()) + ", not an object");
    const StateObject batch(b, file, part.field(key));
    PendingBatch p;
    SH_RETURN_IF_ERROR(batch.integer("step", p.step, true));
    SH_RETURN_IF_ERROR(batch.integer("version", p.version, true));
    SH_RETURN_IF_ERROR(batch.int32_array("actions", p.actions));
    s.pending_batches.push_back(std::move(p));
  }
  return s;
}

}  // namespace

Result<TrainerState> trainer_state_from_json(const std::string& text, const std::string& path) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Status{ErrorCode::corruption, "'" + path + "' is not a JSON object"};
  const StateObject top(j, path, "");
  TrainerState s;
  SH_RETURN_IF_ERROR(top.integer("step", s.step, true));
  if (s.step < 0) return top.error("step", "is " + std::to_string(s.step) + ", a negative step");
  SH_RETURN_IF_ERROR(top.string("kind", s.kind));
  SH_RETURN_IF_ERROR(top.unsigned_integer("seed", s.seed));
  SH_RETURN_IF_ERROR(top.integer("data_cursor", s.data_cursor));
  SH_ASSIGN_OR_RETURN(const nlohmann::json* fully_async,
                      top.nested("fully_async", nlohmann::json::value_t::object, false));
  if (fully_async != nullptr) {
    SH_ASSIGN_OR_RETURN(s.fully_async, read_fully_async_state(*fully_async, path));
  }
  SH_ASSIGN_OR_RETURN(const nlohmann::json* layout, top.nested("layout", nlohmann::json::value_t::object, false));
  if (layout != nullptr) {
    const StateObject part(*layout, path, "layout");
    SavedLayout saved;
    SH_RETURN_IF_ERROR(part.integer("tensor_parallel", saved.tensor_parallel, true));
    SH_RETURN_IF_ERROR(part.integer("data_parallel", saved.data_parallel, true));
    if (saved.tensor_parallel < 1) return part.error("tensor_parallel", "must be at least 1");
    if (saved.data_parallel < 1) return part.error("data_parallel", "must be at least 1");
    s.layout = saved;
  }
  return s;
}

Result<TrainerState> read_trainer_state(FileSystem& fs, const std::string& checkpoint_dir) {
  SH_ASSIGN_OR_RETURN(std::string text, read_trainer_state_text(fs, checkpoint_dir));
  return trainer_state_from_json(text, checkpoint_dir + "/" + kTrainerStateFile);
}

}  // namespace stagehand
