#include "stagehand/checkpoint/report_codec.hpp"

#include <nlohmann/json.hpp>
#include <set>

#include "stagehand/checkpoint/format.hpp"

namespace stagehand {

using nlohmann::json;

namespace {

json shape_json(const Shape& s) { return json(std::vector<std::int64_t>(s.dims().begin(), s.dims().end())); }

Shape shape_from(const json& j) {
  auto dims = j.get<std::vector<std::int64_t>>();
  return Shape(std::span<const std::int64_t>(dims));
}

json status_json(const Status& s) {
  return {{"code", static_cast<int>(s.code())}, {"message", s.message()}, {"errno", s.sys_errno()}};
}

Status status_from(const json& j) {
  return {static_cast<ErrorCode>(j.at("code").get<int>()), j.at("message").get<std::string>(),
          j.at("errno").get<int>()};
}

json phases_json(const SavePhases& p) {
  return {{"copy_s", p.copy_s}, {"hash_s", p.hash_s}, {"write_s", p.write_s}, {"fsync_s", p.fsync_s},
          {"upload_s", p.upload_s}};
}

}  // namespace

std::string encode_phases(const SavePhases& phases, double commit_s, double commit_cpu_s) {
  json out = phases_json(phases);
  out["commit_s"] = commit_s;
  out["commit_cpu_s"] = commit_cpu_s;
  return out.dump();
}

std::string encode_report(const RankSaveReport& r) {
  json buckets = json::array();
  for (const auto& b : r.buckets) {
    json chunks = json::array();
    for (const auto& c : b.chunks) {
      chunks.push_back({{"name", c.desc.name},
                        {"dtype", std::string(dtype_name(c.desc.dtype))},
                        {"global_shape", shape_json(c.desc.global_shape)},
                        {"offset", shape_json(c.desc.global_offset)},
                        {"shape", shape_json(c.desc.local_shape)},
                        {"replica", c.desc.replica_id},
                        {"range", {c.begin, c.end}},
                        {"xxh3", xxh3_hex(c.xxh3)}});
    }
    buckets.push_back({{"bucket", b.bucket}, {"file", b.file}, {"size", b.size},
                       {"xxh3", xxh3_hex(b.xxh3)}, {"chunks", chunks}, {"status", status_json(b.status)}});
  }
  json out = {{"format_version", kFormatVersion}, {"rank", r.rank}, {"step", r.step},
              {"buckets", buckets}, {"objects", r.objects}, {"status", status_json(r.status)},
              {"phases", phases_json(r.phases)}};
  return out.dump();
}

Result<RankSaveReport> decode_report(const std::string& text) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Status{ErrorCode::corruption, "a save report is not JSON"};
  try {
    if (j.at("format_version").get<int>() != kFormatVersion) {
      return Status{ErrorCode::unsupported, "a save report of format version " + j.at("format_version").dump() +
                                                " came from another Stagehand version"};
    }
    RankSaveReport r;
    r.rank = j.at("rank").get<int>();
    r.step = j.at("step").get<std::int64_t>();
    r.objects = j.at("objects").get<std::map<std::string, std::string>>();
    r.status = status_from(j.at("status"));
    const json& phases = j.at("phases");
    r.phases = {phases.at("copy_s").get<double>(), phases.at("hash_s").get<double>(),
                phases.at("write_s").get<double>(), phases.at("fsync_s").get<double>(),
                phases.at("upload_s").get<double>()};
    for (const auto& b : j.at("buckets")) {
      BucketWriteResult out;
      out.bucket = b.at("bucket").get<int>();
      out.file = b.at("file").get<std::string>();
      out.size = b.at("size").get<std::uint64_t>();
      out.xxh3 = parse_xxh3_hex(b.at("xxh3").get<std::string>()).value_or(0);
      out.status = status_from(b.at("status"));
      for (const auto& c : b.at("chunks")) {
        ChunkRecord rec;
        rec.desc.name = c.at("name").get<std::string>();
        auto dtype = dtype_from_name(c.at("dtype").get<std::string>());
        if (!dtype) return Status{ErrorCode::corruption, "a save report names an unknown dtype"};
        rec.desc.dtype = *dtype;
        rec.desc.global_shape = shape_from(c.at("global_shape"));
        rec.desc.global_offset = shape_from(c.at("offset"));
        rec.desc.local_shape = shape_from(c.at("shape"));
        rec.desc.replica_id = c.at("replica").get<std::int32_t>();
        rec.begin = c.at("range").at(0).get<std::uint64_t>();
        rec.end = c.at("range").at(1).get<std::uint64_t>();
        rec.xxh3 = parse_xxh3_hex(c.at("xxh3").get<std::string>()).value_or(0);
        out.chunks.push_back(std::move(rec));
      }
      r.buckets.push_back(std::move(out));
    }
    return r;
  } catch (const json::exception& e) {
    return Status{ErrorCode::corruption, std::string("malformed save report: ") + e.what()};
  }
}

namespace {

/// Runs `parse` on the JSON object in `text`; a missing field or a wrong type is corruption
/// naming `what`.
template <class F>
Status parse_object(const std::string& text, const char* what, F&& parse) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Status{ErrorCode::corruption, std::string(what) + " is not a JSON object"};
  try {
    parse(j);
  } catch (const json::exception& e) {
    return Status{ErrorCode::corruption, std::string(what) + ": " + e.what()};
  }
  return Status::ok();
}

}  // namespace

std::string encode_load_scope(const LoadScope& scope) {
  return json{{"optimizer", scope.optimizer}, {"rng", scope.rng}, {"strict", scope.strict}}.dump();
}

Result<LoadScope> decode_load_scope(const std::string& text) {
  LoadScope scope;
  SH_RETURN_IF_ERROR(parse_object(text, "a load scope", [&](const json& j) {
    scope = {j.at("optimizer").get<bool>(), j.at("rng").get<bool>(), j.at("strict").get<bool>()};
  }));
  return scope;
}

std::string encode_load_selection(const LoadOptions& o) {
  return json{{"skip", o.skip},
              {"sources", o.sources},
              {"optional_objects", o.optional_objects},
              {"strict", o.strict},
              {"refuse_unused", o.refuse_unused},
              {"list_unused", o.list_unused},
              {"convert_dtypes", o.convert_dtypes}}
      .dump();
}

Status decode_load_selection(const std::string& text, LoadOptions& into) {
  return parse_object(text, "a load selection", [&](const json& j) {
    into.skip = j.at("skip").get<std::set<std::string>>();
    into.sources = j.at("sources").get<std::map<std::string, std::string>>();
    into.optional_objects = j.at("optional_objects").get<std::set<std::string>>();
    into.strict = j.at("strict").get<bool>();
    into.refuse_unused = j.at("refuse_unused").get<bool>();
    into.list_unused = j.at("list_unused").get<bool>();
    into.convert_dtypes = j.at("convert_dtypes").get<bool>();
  });
}

std::string encode_load_notes(const LoadReport& r) {
  return json{{"missing_tensors", r.missing_tensors},
              {"missing_objects", r.missing_objects},
              {"unused_tensors", r.unused_tensors}}
      .dump();
}

Status decode_load_notes(const std::string& text, LoadReport& into) {
  return parse_object(text, "load notes", [&](const json& j) {
    into.missing_tensors = j.at("missing_tensors").get<std::vector<std::string>>();
    into.missing_objects = j.at("missing_objects").get<std::vector<std::string>>();
    into.unused_tensors = j.at("unused_tensors").get<std::vector<std::string>>();
  });
}

Result<LoadReport> decode_load_reply(double total_s, double read_s, double verify_s, double copy_s,
                                     std::uint64_t bytes, const std::string& notes) {
  LoadReport report;
  report.total_s = total_s;
  report.read_s = read_s;
  report.verify_s = verify_s;
  report.copy_s = copy_s;
  report.bytes = bytes;
  SH_RETURN_IF_ERROR(decode_load_notes(notes, report));
  return report;
}

}  // namespace stagehand
