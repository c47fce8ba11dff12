#include "stagehand/checkpoint/load/load_plan.hpp"

#include <algorithm>
#include <map>
#include <tuple>

namespace stagehand {

std::vector<std::vector<std::size_t>> coalesce_ranges(const std::vector<ReadRange>& ranges,
                                                      std::uint64_t max_bytes) {
  std::vector<std::size_t> order(ranges.size());
  for (std::size_t i = 0; i < order.size(); ++i)
    order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return std::tie(ranges[a].file, ranges[a].begin) < std::tie(ranges[b].file, ranges[b].begin);
  });
  std::vector<std::vector<std::size_t>> reads;
  std::uint64_t read_begin = 0;
  for (std::size_t i : order) {
    const ReadRange& r = ranges[i];
    if (!reads.empty()) {
      const ReadRange& last = ranges[reads.back().back()];
      if (last.file == r.file && last.end == r.begin && r.end - read_begin <= max_bytes) {
        reads.back().push_back(i);
        continue;
      }
    }
    reads.push_back({i});
    read_begin = r.begin;
  }
  return reads;
}

void merge_shared_chunks(std::vector<ChunkJob>& jobs) {
  // (file, offset) -> index in `merged`
  std::map<std::pair<std::string, std::uint64_t>, std::size_t> seen;
  std::vector<ChunkJob> merged;
  merged.reserve(jobs.size());
  for (auto& job : jobs) {
    auto [at, fresh] = seen.try_emplace({job.file->path, job.chunk->begin}, merged.size());
    if (fresh) {
      merged.push_back(std::move(job));
      continue;
    }
    ChunkJob& kept = merged[at->second];
    if (kept.direct == nullptr && job.direct != nullptr) std::swap(kept, job);
    kept.copies.push_back(job.live);
    kept.copies.insert(kept.copies.end(), job.copies.begin(), job.copies.end());
  }
  jobs = std::move(merged);
}

std::vector<ReadTask> plan_reads(const std::vector<ChunkJob>& jobs, std::uint64_t max_read_bytes) {
  std::vector<ReadTask> tasks;
  for (bool direct : {true, false}) {
    std::vector<ReadRange> ranges;
    std::vector<Piece> pieces;
    for (std::size_t j = 0; j < jobs.size(); ++j) {
      if ((jobs[j].direct != nullptr) != direct) continue;
      const ChunkMeta& c = *jobs[j].chunk;
      ranges.push_back({c.file, c.begin, c.end});
      pieces.push_back({j, c.begin, c.end});
    }
    for (const auto& read : coalesce_ranges(ranges, max_read_bytes)) {
      ReadTask task{jobs[pieces[read.front()].job].file, direct, {}};
      for (std::size_t i : read)
        task.pieces.push_back(pieces[i]);
      tasks.push_back(std::move(task));
    }
  }
  std::stable_sort(tasks.begin(), tasks.end(), [](const ReadTask& a, const ReadTask& b) {
    return std::tie(a.file->path, a.pieces.front().begin) <
           std::tie(b.file->path, b.pieces.front().begin);
  });
  return tasks;
}

}  // namespace stagehand
