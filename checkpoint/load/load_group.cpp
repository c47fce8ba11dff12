#include "stagehand/checkpoint/load/load_group.hpp"

#include <algorithm>
#include <utility>

namespace stagehand {

LoadGroup::LoadGroup(int size, std::chrono::milliseconds arrival_limit)
    : size_(std::max(size, 1)), arrival_limit_(arrival_limit) {}

LoadGroup::Turn LoadGroup::begin(int member) {
  std::lock_guard lock(mutex_);
  Turn turn;
  turn.round = loads_[member]++;
  rounds_[turn.round];
  return turn;
}

std::shared_ptr<DataFiles> LoadGroup::data_files(const Turn& turn, FileSystem& fs, const std::string& folder) {
  std::lock_guard lock(mutex_);
  auto& files = rounds_.at(turn.round).files[{&fs, folder}];
  if (!files) files = std::make_shared<DataFiles>(fs, folder);
  return files;
}

void LoadGroup::arrive(Turn& turn, const std::string& checkpoint_dir, std::vector<ChunkJob>& jobs) {
  std::unique_lock lock(mutex_);
  Round& round = rounds_.at(turn.round);
  if (round.solo) {
    ++round.arrived;
    leave(turn.round);
    return;
  }
  if (round.arrived == 0) round.dir = checkpoint_dir;
  if (round.dir != checkpoint_dir) round.solo = true;
  ++round.arrived;
  ++round.readers;
  round.jobs.push_back(&jobs);
  if (round.arrived == size_ && !round.solo) {
    assign(round);
    round.assigned = true;
    changed_.notify_all();
  } else if (!round.solo) {
    const bool ready = changed_.wait_for(lock, arrival_limit_, [&] { return round.assigned || round.solo; });
    if (!ready) round.solo = true;  // a member is late: nobody waits for it
  }
  if (round.solo) {
    changed_.notify_all();  // the members waiting above go on alone
    leave(turn.round);
    return;
  }
  turn.shared = true;
}

void LoadGroup::abstain(const Turn& turn) {
  std::lock_guard lock(mutex_);
  Round& round = rounds_.at(turn.round);
  ++round.arrived;
  if (round.arrived == size_ && !round.solo) {
    assign(round);
    round.assigned = true;
    changed_.notify_all();
  }
  leave(turn.round);
}

Status LoadGroup::depart(const Turn& turn, Status read) {
  if (!turn.shared) return read;
  std::unique_lock lock(mutex_);
  Round& round = rounds_.at(turn.round);
  ++round.departed;
  if (!read.is_ok() && round.first_error.is_ok()) round.first_error = std::move(read);
  changed_.notify_all();
  // The other readers are reading now (they have arrived and been given their jobs), so this
  // waits as long as the slowest read does.
  changed_.wait(lock, [&] { return round.departed == round.readers; });
  Status result = round.first_error;
  leave(turn.round);
  return result;
}

void LoadGroup::assign(Round& round) {
  // Every job of every member, grouped by the chunk it reads.
  struct Owned {
    std::size_t member;
    ChunkJob job;
  };
  std::map<std::pair<std::string, std::uint64_t>, std::vector<Owned>> by_chunk;
  for (std::size_t m = 0; m < round.jobs.size(); ++m) {
    for (auto& job : *round.jobs[m]) {
      by_chunk[{job.file->path, job.chunk->begin}].push_back({m, std::move(job)});
    }
    round.jobs[m]->clear();
  }
  std::vector<std::uint64_t> bytes(round.jobs.size(), 0);
  auto give = [&](std::size_t member, ChunkJob job) {
    bytes[member] += job.chunk->end - job.chunk->begin;
    round.jobs[member]->push_back(std::move(job));
  };
  // A chunk one member needs is read by it; a shared one by a member that reads it straight
  // into its block if there is one, else by the member with the fewest bytes to read so far.
  for (auto& [key, owners] : by_chunk) {
    if (owners.size() == 1) give(owners.front().member, std::move(owners.front().job));
  }
  for (auto& [key, owners] : by_chunk) {
    if (owners.size() == 1) continue;
    std::size_t best = 0;
    for (std::size_t i = 1; i < owners.size(); ++i) {
      const bool direct = owners[i].job.direct != nullptr, best_direct = owners[best].job.direct != nullptr;
      if (direct != best_direct ? direct : bytes[owners[i].member] < bytes[owners[best].member]) best = i;
    }
    ChunkJob reader = std::move(owners[best].job);
    for (std::size_t i = 0; i < owners.size(); ++i) {
      if (i == best) continue;
      reader.copies.push_back(owners[i].job.live);
      reader.copies.insert(reader.copies.end(), owners[i].job.copies.begin(), owners[i].job.copies.end());
    }
    give(owners[best].member, std::move(reader));
  }
}

void LoadGroup::leave(std::uint64_t index) {
  auto found = rounds_.find(index);
  if (++found->second.left == size_) rounds_.erase(found);
}

}  // namespace stagehand
