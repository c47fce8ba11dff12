// The check a resume makes before it trusts a step of host folders, and the record of the hosts
// that wrote them (checkpoint/tiers/host_folders.hpp).
#include <algorithm>
#include <functional>
#include <nlohmann/json.hpp>
#include <numeric>

#include "stagehand/checkpoint/load/checkpoint_reader.hpp"
#include "stagehand/checkpoint/tiers/host_folders.hpp"
#include "stagehand/checkpoint/format/layout.hpp"
#include "stagehand/checkpoint/metadata/metadata.hpp"
#include "stagehand/checkpoint/tiers/tier_copy.hpp"
#include "stagehand/core/xxh3.hpp"

namespace stagehand {

namespace {

// -- the check before a resume --

constexpr std::size_t kPieceBytes = std::size_t{8} << 20;

/// Whether the copy at `path` holds what `meta` records: ok, not_found when there is none, or
/// another error saying what differs (corruption) or why it cannot be read.
Status verify_copy(FileSystem& fs, const std::string& path, const FileMeta& meta, std::span<char> buffer) {
  SH_ASSIGN_OR_RETURN(auto in, fs.open_file(path));
  if (in->size() != meta.size) {
    return {ErrorCode::corruption,
            "holds " + std::to_string(in->size()) + " bytes where the metadata records " + describe_file_meta(meta)};
  }
  SH_ASSIGN_OR_RETURN(std::uint64_t digest, read_hashed(*in, meta.size, buffer, nullptr, nullptr));
  if (digest != meta.xxh3) {
    return {ErrorCode::corruption, "has XXH3 " + xxh3_hex(digest) + " where the metadata records " + describe_file_meta(meta)};
  }
  return Status::ok();
}

/// Rewrites `to` from the verified copy `from` (beside it, then renamed over it) and reads it back.
Status restore_copy(FileSystem& fs, const std::string& from, const std::string& to, const FileMeta& meta,
                    std::span<char> buffer) {
  SH_ASSIGN_OR_RETURN(auto in, fs.open_file(from));
  SH_RETURN_IF_ERROR(create_dirs(fs, parent_path(to)));
  auto fill = [&](WritableFile& out) -> Status {
    return read_hashed(*in, meta.size, buffer, nullptr,
                       [&](const char* data, std::size_t bytes) { return out.append(data, bytes); })
        .status();
  };
  SH_RETURN_IF_ERROR(write_file_atomic(fs, to, fill));
  Status back = verify_copy(fs, to, meta, buffer);
  if (!back.is_ok()) return back.with_context("'" + to + "' after it was restored from '" + from + "'");
  return Status::ok();
}

std::string host_name(int host) { return "host " + std::to_string(host); }

/// One file of the step, as the check found it.
struct Examined {
  std::string path;  // with the placeholder
  std::string what;  // "rank 1's part '__1_0.safetensors'"
  FileMeta meta;
  /// The first copy in read order that verifies; -1: none.
  int good = -1;
  /// What was wrong with each copy read before it.
  std::vector<std::string> faults;
  /// Copies to write again from the good one: damaged ones read before it (`in_the_way`: reads
  /// would take them) and missing ones, and holders' copies after it that are missing or of the
  /// wrong size.
  struct Restore {
    int host;
    bool in_the_way;
  };
  std::vector<Restore> restore;
  /// The first host in read order (a data file's own).
  int own = -1;
};

/// Reads every copy of `file` in read order until one verifies, then checks the sizes of the
/// remaining holders' copies.
Examined examine(const HostPlacement& placement, FileSystem& inner, const std::vector<int>& holders,
                 const std::vector<std::string>& unreadable, Examined file, std::span<char> buffer) {
  const std::vector<int> order = placement.read_order(file.path);
  file.own = order.front();
  for (std::size_t i = 0; i < order.size(); ++i) {
    const int host = order[i];
    if (!unreadable[static_cast<std::size_t>(host)].empty()) {
      file.faults.push_back(unreadable[static_cast<std::size_t>(host)]);
      continue;
    }
    Status st = verify_copy(inner, placement.on_host(file.path, host), file.meta, buffer);
    if (st.is_ok()) {
      file.good = host;
      // The holders' copies after it: missing or of another size, written again.
      for (std::size_t j = i + 1; j < order.size(); ++j) {
        const int later = order[j];
        if (std::find(holders.begin(), holders.end(), later) == holders.end()) continue;
        if (!unreadable[static_cast<std::size_t>(later)].empty()) continue;
        auto version = inner.stat_file(placement.on_host(file.path, later));
        if (!version.is_ok() || !*version || (*version)->size != file.meta.size) file.restore.push_back({later, false});
      }
      return file;
    }
    const bool missing = st.code() == ErrorCode::not_found;
    file.faults.push_back(missing ? host_name(host) + " has none" : host_name(host) + "'s copy " + st.message());
    file.restore.push_back({host, !missing});
  }
  return file;
}

std::string describe_placement(std::int64_t hosts, std::int64_t per, std::int64_t replicas, std::int64_t stride) {
  return std::to_string(hosts) + " host folders (" + std::to_string(per) + " ranks per host, " +
         std::to_string(replicas) + " copies of each rank's files, stride " + std::to_string(stride) + ")";
}

}  // namespace

Result<bool> check_host_record(FileSystem& fs, const std::string& root) {
  const HostPlacement* placement = host_placement_of(fs);
  FileSystem* inner = host_folders_inner(fs);
  if (!placement || !inner || root.find(kHostPlaceholder) == std::string::npos) {
    return Status{ErrorCode::invalid_argument, "'" + root + "' is not in host folders"};
  }
  const std::string now = describe_placement(placement->hosts, placement->ranks_per_host, placement->replicas, placement->stride);
  bool owed = false;
  for (int host = 0; host < placement->hosts; ++host) {
    const std::string path = placement->on_host(root, host) + "/" + kHostRecordFile;
    auto text = read_small_file(*inner, path);
    if (!text.is_ok() || !*text) {
      owed = true;
      continue;
    }
    auto j = nlohmann::json::parse(**text, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("hosts") || !j["hosts"].is_number_integer()) {
      owed = true;
      continue;
    }
    auto field = [&](const char* key) { return j.contains(key) && j[key].is_number_integer() ? j[key].get<std::int64_t>() : 0; };
    const std::int64_t hosts = j["hosts"].get<std::int64_t>();
    if (hosts > placement->hosts) {
      return Status{ErrorCode::invalid_argument,
                    "'" + root + "' was written by " + describe_placement(hosts, field("ranks_per_host"), field("replicas"), field("stride")) +
                        " (" + path + "); this run has " + now + ": the folders of hosts " + std::to_string(placement->hosts) +
                        " to " + std::to_string(hosts - 1) + " would never be read. Keep the world size and "
                        "trainer.ranks_per_host, or empty every host's folder of the local tier to resume from the durable tier"};
    }
    if (hosts < placement->hosts) owed = true;
  }
  return owed;
}

Status write_host_record(FileSystem& fs, const std::string& root) {
  const HostPlacement* placement = host_placement_of(fs);
  if (!placement) return Status{ErrorCode::invalid_argument, "'" + root + "' is not in host folders"};
  const nlohmann::json record{{"hosts", placement->hosts},
                              {"ranks_per_host", placement->ranks_per_host},
                              {"replicas", placement->replicas},
                              {"stride", placement->stride}};
  // In every host's folder (the decorator makes what a host's folder lacks).
  SH_RETURN_IF_ERROR(fs.create_dir(root));
  return write_file_atomic(fs, root + "/" + kHostRecordFile, record.dump() + "\n");
}

Result<HostCheckReport> check_host_copies(FileSystem& fs, const std::string& checkpoint_dir,
                                          const std::function<bool()>& should_stop) {
  const HostPlacement* hosts = host_placement_of(fs);
  FileSystem* below = host_folders_inner(fs);
  if (!hosts || !below || checkpoint_dir.find(kHostPlaceholder) == std::string::npos) {
    return Status{ErrorCode::invalid_argument, "'" + checkpoint_dir + "' is not in host folders"};
  }
  const HostPlacement& placement = *hosts;
  FileSystem& inner = *below;
  HostCheckReport report;
  std::vector<int> every(static_cast<std::size_t>(placement.hosts));
  std::iota(every.begin(), every.end(), 0);
  // Why each host's folder offers no copy: it lacks the step (a lost host), or cannot be read.
  std::vector<std::string> unreadable(every.size());
  std::vector<std::string> offers_none(every.size());
  for (int host : every) {
    auto dir = inner.is_dir(placement.on_host(checkpoint_dir, host));
    if (!dir.is_ok()) {
      offers_none[static_cast<std::size_t>(host)] = host_name(host) + "'s folder cannot be read (" + dir.status().message() + ")";
      unreadable[static_cast<std::size_t>(host)] = offers_none[static_cast<std::size_t>(host)];
    } else if (!*dir) {
      offers_none[static_cast<std::size_t>(host)] = host_name(host) + "'s folder lacks the step";
      unreadable[static_cast<std::size_t>(host)] = host_name(host) + " has none (its folder lacks the step)";
    }
  }
  // metadata.json: each distinct text that checks is a candidate, in host order (two differ
  // after a commit cut between hosts, or a host that missed commits); the first whose files all
  // have a good copy is the step.
  struct Version {
    std::string text;
    CheckpointMetadata metadata;
  };
  std::vector<Version> versions;
  std::vector<std::string> metadata_faults;
  // Each host's metadata.json as read: its text when it checks, else why not (for the rewrite).
  std::vector<std::string> host_text(every.size());
  std::vector<std::string> host_fault(every.size());
  for (int host : every) {
    if (!unreadable[static_cast<std::size_t>(host)].empty()) continue;
    std::string text;
    auto m = read_checkpoint_metadata(inner, placement.on_host(checkpoint_dir, host), &text);
    if (!m.is_ok()) {
      metadata_faults.push_back(host_name(host) + ": " + m.status().message());
      const ErrorCode code = m.status().code();
      const bool damaged = code == ErrorCode::corruption || code == ErrorCode::invalid_argument;
      host_fault[static_cast<std::size_t>(host)] =
          code == ErrorCode::not_found ? "missing" : damaged ? "damaged or of another save" : m.status().message();
      continue;
    }
    host_text[static_cast<std::size_t>(host)] = text;
    if (std::none_of(versions.begin(), versions.end(), [&](const Version& v) { return v.text == text; })) {
      versions.push_back({std::move(text), std::move(*m)});
    }
  }
  if (versions.empty()) {
    std::string why;
    for (const auto& f : metadata_faults) why += (why.empty() ? "" : "; ") + f;
    return Status{ErrorCode::corruption, "no host's copy of " + std::string(kMetadataFile) + " of '" + checkpoint_dir +
                                             "' checks (" + (why.empty() ? "no host's folder holds the step" : why) + ")"};
  }
  std::vector<char> buffer(kPieceBytes);
  const std::string policy = CheckpointLayout::policy_dir(checkpoint_dir);
  std::vector<Examined> chosen;
  const Version* version = nullptr;
  std::vector<std::string> first_lost;
  for (const Version& v : versions) {
    std::vector<Examined> files;
    std::vector<std::string> lost;
    auto look = [&](const std::string& path, const FileMeta& meta) -> Status {
      if (should_stop && should_stop()) {
        return Status{ErrorCode::aborted, "the check of '" + checkpoint_dir + "' was stopped: the run is stopping"};
      }
      const int rank = data_file_rank(path);
      const std::string name = path.substr(path.rfind('/') + 1);
      Examined e;
      e.path = path;
      e.meta = meta;
      e.what = rank >= 0 ? "rank " + std::to_string(rank) + "'s part '" + name + "'" : "'" + name + "'";
      e = examine(placement, inner, rank >= 0 ? placement.holders(rank) : every, unreadable,
                  std::move(e), buffer);
      if (e.good < 0) {
        std::string why;
        for (const auto& f : e.faults) why += (why.empty() ? "" : ", ") + f;
        lost.push_back(e.what + ": " + why + (rank >= 0 ? "; no replica verifies" : "; no host's copy verifies"));
      }
      files.push_back(std::move(e));
      return Status::ok();
    };
    for (const auto& [name, meta] : v.metadata.files) SH_RETURN_IF_ERROR(look(policy + "/" + name, meta));
    if (v.metadata.trainer_state) SH_RETURN_IF_ERROR(look(checkpoint_dir + "/" + kTrainerStateFile, *v.metadata.trainer_state));
    if (lost.empty()) {
      chosen = std::move(files);
      version = &v;
      break;
    }
    if (first_lost.empty()) first_lost = std::move(lost);
  }
  if (!version) {
    std::string why;
    for (std::size_t i = 0; i < first_lost.size() && i < 4; ++i) why += (i ? "; " : "") + first_lost[i];
    if (first_lost.size() > 4) why += "; and " + std::to_string(first_lost.size() - 4) + " more file(s)";
    if (versions.size() > 1) {
      why += " (nor do the files of the " + std::to_string(versions.size() - 1) + " other version(s) of " +
             kMetadataFile + " the hosts hold)";
    }
    return Status{ErrorCode::corruption, why};
  }
  // The step verifies: copies that reads would take before a good one, missing ones and
  // under-sized replicas are written again from it; then metadata.json where it differs.
  for (const Examined& e : chosen) {
    const std::string source = placement.on_host(e.path, e.good);
    for (const auto& r : e.restore) {
      Status st = restore_copy(inner, source, placement.on_host(e.path, r.host), e.meta, buffer);
      const std::string what = host_name(r.host) + "'s copy of " + e.what;
      if (st.is_ok()) {
        report.repaired.push_back(what + " from " + host_name(e.good));
        continue;
      }
      // A damaged copy that stays is what reads would take.
      if (r.in_the_way) {
        return Status{ErrorCode::corruption, e.what + ": " + host_name(r.host) +
                                                 "'s copy is damaged and could not be rewritten from " +
                                                 host_name(e.good) + "'s (" + st.message() + ")"};
      }
      report.unrepaired.push_back(what + " (" + st.message() + ")");
    }
    if (e.good != e.own && !offers_none[static_cast<std::size_t>(e.own)].empty()) {
      report.from_replicas.push_back(e.what + " from " + host_name(e.good) + " (" + offers_none[static_cast<std::size_t>(e.own)] + ")");
    }
  }
  // Reads take the first host's metadata.json: a rewrite that fails before the first host that
  // holds the chosen one rejects the step; after it, it is only reported.
  bool chosen_seen = false;
  for (int host : every) {
    if (!unreadable[static_cast<std::size_t>(host)].empty()) continue;
    const std::size_t h = static_cast<std::size_t>(host);
    if (host_fault[h].empty() && host_text[h] == version->text) {
      chosen_seen = true;
      continue;
    }
    const std::string path = CheckpointLayout::policy_dir(placement.on_host(checkpoint_dir, host)) + "/" + kMetadataFile;
    const std::string why = host_fault[h].empty() ? "damaged or of another save" : host_fault[h];
    Status st = create_dirs(inner, parent_path(path));
    if (st.is_ok()) st = write_file_atomic(inner, path, version->text);
    if (!st.is_ok() && !chosen_seen) {
      return Status{ErrorCode::corruption, host_name(host) + "'s " + kMetadataFile + " (" + why +
                                               ") could not be rewritten: " + st.message()};
    }
    (st.is_ok() ? report.repaired : report.unrepaired)
        .push_back(host_name(host) + "'s copy of " + std::string(kMetadataFile) + " (" + why + ")" +
                   (st.is_ok() ? "" : ": " + st.message()));
    chosen_seen = chosen_seen || st.is_ok();
  }
  return report;
}

}  // namespace stagehand
