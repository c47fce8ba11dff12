// The local file system's files written over again (FileSystem::reuse_file): cut to what was
// written, and in a folder kept in memory written through a mapping kept for the next reuse;
// and files written and read around the page cache (create_file_uncached, open_file_uncached).
#define BOOST_TEST_MODULE file_system
#include <boost/test/unit_test.hpp>

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <atomic>
#include <chrono>
#include <thread>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include "stagehand/storage/file_system.hpp"
#include "tests/test_util.hpp"

using namespace stagehand;
using stagehand::test::TempDir;
namespace fs = std::filesystem;

namespace {

constexpr const char* kMemoryFolder = "/dev/shm";

bool in_memory(const std::string& path) {
  struct statfs s {};
  return ::statfs(path.c_str(), &s) == 0 && static_cast<unsigned long>(s.f_type) == TMPFS_MAGIC;
}

boost::test_tools::assertion_result memory_folder_exists(boost::unit_test::test_unit_id) {
  boost::test_tools::assertion_result ok(in_memory(kMemoryFolder));
  ok.message() << kMemoryFolder << " is not a tmpfs on this machine";
  return ok;
}

struct stat stat_of(const std::string& path) {
  struct stat st {};
  BOOST_REQUIRE_MESSAGE(::stat(path.c_str(), &st) == 0, path);
  return st;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

/// Sets the file's times far in the past, so that a write that sets them shows.
void age(const std::string& path) {
  const timespec old[2] = {{1000, 0}, {1000, 0}};
  BOOST_REQUIRE(::utimensat(AT_FDCWD, path.c_str(), old, 0) == 0);
}

using AlignedMemory = std::unique_ptr<char, decltype(&std::free)>;

/// `bytes` (a multiple of kDirectIoBlock) of memory aligned as staging memory is.
AlignedMemory aligned_memory(std::size_t bytes) {
  AlignedMemory memory(static_cast<char*>(std::aligned_alloc(kDirectIoBlock, bytes)), &std::free);
  BOOST_REQUIRE(memory);
  return memory;
}

std::string pattern(std::size_t bytes, char seed) {
  std::string s(bytes, '\0');
  for (std::size_t i = 0; i < bytes; ++i) s[i] = static_cast<char>(seed + static_cast<char>(i % 61));
  return s;
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_reused_file_is_written_over_and_cut_to_what_was_written) {
  for (const std::string& parent : {fs::temp_directory_path().string(), std::string(kMemoryFolder)}) {
    for (bool mapped : {false, true}) {
      BOOST_TEST_CONTEXT("in " << parent << (mapped ? ", with mappings" : "")) {
        TempDir dir(parent);
        auto local = local_file_system();
        FileMappings mappings;
        FileMappings* kept = mapped ? &mappings : nullptr;
        const std::string spare = dir / "spare";
        write_file(spare, std::string(100, 'x'));
        const auto inode = stat_of(spare).st_ino;
        auto file = local->reuse_file(spare, dir / "taken", kept);
        BOOST_REQUIRE_MESSAGE(file.is_ok(), file.status().to_string());
        BOOST_REQUIRE((*file)->append("abc", 3).is_ok());
        BOOST_REQUIRE((*file)->write_at(5, "fg", 2).is_ok());
        BOOST_REQUIRE((*file)->append("de", 2).is_ok());
        BOOST_REQUIRE((*file)->sync().is_ok());
        BOOST_REQUIRE((*file)->close().is_ok());
        BOOST_TEST(!fs::exists(spare));
        BOOST_TEST(test::read_file(dir / "taken") == "abcdefg");
        BOOST_TEST(stat_of(dir / "taken").st_ino == inode);
        // Mapped only in memory, and only when asked.
        BOOST_TEST(mappings.size() == (mapped && in_memory(parent) ? 1u : 0u));
        // Closed without a sync, a reused file is cut as well; none to take is not_found.
        write_file(spare, std::string(100, 'x'));
        auto unsynced = local->reuse_file(spare, dir / "unsynced", kept);
        BOOST_REQUIRE(unsynced.is_ok());
        BOOST_REQUIRE((*unsynced)->append("ab", 2).is_ok());
        BOOST_REQUIRE((*unsynced)->close().is_ok());
        BOOST_TEST(test::read_file(dir / "unsynced") == "ab");
        BOOST_TEST(local->reuse_file(spare, dir / "none", kept).status().code() == ErrorCode::not_found);
        BOOST_TEST(!fs::exists(dir / "none"));
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(a_spare_that_cannot_be_written_over_is_dropped_and_the_target_left_free) {
  TempDir dir;
  auto local = local_file_system();
  // Hard-linked (a snapshot of the retired step made with cp -al): the other name keeps its bytes.
  const std::string spare = dir / "spare";
  write_file(spare, "retired bytes");
  BOOST_REQUIRE(::link(spare.c_str(), (dir / "snapshot").c_str()) == 0);
  auto linked = local->reuse_file(spare, dir / "taken", nullptr);
  BOOST_TEST(!linked.is_ok());
  BOOST_TEST(linked.status().message().find("hard links") != std::string::npos, linked.status().to_string());
  BOOST_TEST(!fs::exists(spare));
  BOOST_TEST(!fs::exists(dir / "taken"));
  BOOST_TEST(test::read_file(dir / "snapshot") == "retired bytes");
  // A symbolic link: neither it nor what it points to is written; the target stays free.
  write_file(dir / "elsewhere", "not ours");
  BOOST_REQUIRE(::symlink((dir / "elsewhere").c_str(), spare.c_str()) == 0);
  BOOST_TEST(!local->reuse_file(spare, dir / "taken", nullptr).is_ok());
  BOOST_TEST(!fs::exists(dir / "taken"));
  BOOST_TEST(!fs::is_symlink(spare));
  BOOST_TEST(test::read_file(dir / "elsewhere") == "not ours");
  // Either way a new file can be made where the spare would have gone.
  auto created = local->create_file(dir / "taken");
  BOOST_REQUIRE(created.is_ok());
  BOOST_REQUIRE((*created)->append("new", 3).is_ok());
  BOOST_REQUIRE((*created)->close().is_ok());
  BOOST_TEST(test::read_file(dir / "taken") == "new");
  BOOST_TEST(test::read_file(dir / "snapshot") == "retired bytes");
}

BOOST_AUTO_TEST_CASE(a_spare_replaced_while_it_is_taken_never_leaves_another_file_under_the_new_name) {
  // Another process's retention moves retired files onto a spare's name while this one takes it
  // (each process has its own lock): the file moved under the new name must be the one written.
  // Taking the spare by opening it and then renaming its name put the retired file there when the
  // name was replaced in between.
  TempDir dir;
  auto local = local_file_system();
  const std::string spare = dir / "spare";
  std::atomic<bool> stop{false};
  std::thread retention([&] {
    for (int k = 0; !stop.load(); ++k) {
      const std::string retired = dir / ("retired" + std::to_string(k % 4));
      write_file(retired, "RETIRED");
      (void)::rename(retired.c_str(), spare.c_str());
    }
  });
  int taken = 0;
  int wrong = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (int i = 0; taken < 1000 && std::chrono::steady_clock::now() < deadline; ++i) {
    const std::string to = dir / ("new" + std::to_string(i % 8));
    auto file = local->reuse_file(spare, to, nullptr);
    if (!file.is_ok()) {
      std::this_thread::yield();  // no spare yet
      continue;
    }
    ++taken;
    const std::string bytes = "NEW " + std::to_string(100000 + i);
    BOOST_REQUIRE((*file)->append(bytes.data(), bytes.size()).is_ok());
    BOOST_REQUIRE((*file)->close().is_ok());
    if (test::read_file(to) != bytes) ++wrong;
  }
  stop = true;
  retention.join();
  BOOST_TEST(taken > 100);
  BOOST_TEST(wrong == 0, wrong << " of " << taken << " new files held a retired file's bytes");
}

BOOST_AUTO_TEST_CASE(a_reused_file_in_memory_lends_its_mapping_and_keeps_what_is_copied_there,
                     *boost::unit_test::precondition(memory_folder_exists)) {
  TempDir dir(kMemoryFolder);
  auto local = local_file_system();
  BOOST_TEST(local->capabilities(dir.path()).in_memory);
  const std::string disk = fs::temp_directory_path().string();
  BOOST_TEST(local->capabilities(disk).in_memory == in_memory(disk));
  // A path not made yet is asked of the folder it will be made in.
  BOOST_TEST(local->capabilities(dir / "missing/deeper").in_memory);
  BOOST_TEST(local->capabilities(dir / "missing/deeper").cheap_reads);
  BOOST_TEST(local->capabilities(dir / "missing/deeper").rewrites_in_place);
  FileMappings mappings;
  const std::string spare = dir / "spare";
  const std::string taken = dir / "taken";
  constexpr std::size_t kOld = 64u << 10;
  write_file(spare, pattern(kOld, 'a'));
  auto file = local->reuse_file(spare, taken, &mappings);
  BOOST_REQUIRE(file.is_ok());
  BOOST_REQUIRE(mappings.size() == 1u);
  // Only ranges within the mapping.
  BOOST_TEST((*file)->memory_at(kOld - 10, 11) == nullptr);
  BOOST_TEST((*file)->memory_at(kOld + 1, 0) == nullptr);
  // Bytes copied there count as written: the file is cut after them, not after the old bytes.
  const std::string fresh = pattern(1100, 'q');
  BOOST_REQUIRE((*file)->append(fresh.data(), 100).is_ok());
  std::uint8_t* memory = (*file)->memory_at(100, 1000);
  BOOST_REQUIRE(memory != nullptr);
  BOOST_TEST(memory == mappings.front()->data() + 100);
  std::memcpy(memory, fresh.data() + 100, 1000);
  BOOST_REQUIRE((*file)->sync().is_ok());
  BOOST_REQUIRE((*file)->close().is_ok());
  BOOST_TEST(test::read_file(taken) == fresh);
  // A new file has no memory to lend.
  auto created = local->create_file(dir / "created");
  BOOST_REQUIRE(created.is_ok());
  BOOST_TEST((*created)->memory_at(0, 0) == nullptr);
  BOOST_REQUIRE((*created)->close().is_ok());
}

BOOST_AUTO_TEST_CASE(reused_files_in_memory_are_written_through_a_mapping_kept_for_their_next_reuse,
                     *boost::unit_test::precondition(memory_folder_exists)) {
  TempDir dir(kMemoryFolder);
  auto local = local_file_system();
  FileMappings mappings;
  const std::string spare = dir / "spare";
  const std::string taken = dir / "taken";
  constexpr std::size_t kOld = 64u << 10;
  write_file(spare, pattern(kOld, 'a'));
  age(spare);

  // Written within the old size: through the mapping, no write call (the time stays until the
  // sync sets it); past it, with write calls.
  const std::string fresh = pattern(kOld + 100, 'k');
  auto file = local->reuse_file(spare, taken, &mappings);
  BOOST_REQUIRE_MESSAGE(file.is_ok(), file.status().to_string());
  BOOST_REQUIRE(mappings.size() == 1u);
  const std::shared_ptr<FileMapping> first = mappings.front();
  BOOST_TEST(first->size() == kOld);
  BOOST_REQUIRE((*file)->append(fresh.data(), 10).is_ok());
  BOOST_REQUIRE((*file)->write_at(10, fresh.data() + 10, kOld - 10).is_ok());
  BOOST_TEST(stat_of(taken).st_mtim.tv_sec == 1000);
  BOOST_TEST(std::memcmp(first->data(), fresh.data(), kOld) == 0);
  BOOST_REQUIRE((*file)->write_at(kOld, fresh.data() + kOld, 100).is_ok());
  BOOST_REQUIRE((*file)->sync().is_ok());
  BOOST_REQUIRE((*file)->close().is_ok());
  BOOST_TEST(stat_of(taken).st_mtim.tv_sec != 1000);
  BOOST_TEST(test::read_file(taken) == fresh);

  // The file grew: its mapping no longer maps it whole and is replaced by one of its new size,
  // which the next reuse at that size takes again.
  BOOST_REQUIRE(::rename(taken.c_str(), spare.c_str()) == 0);
  const std::string again = pattern(kOld + 100, 'p');
  for (int round = 0; round < 2; ++round) {
    BOOST_TEST_CONTEXT("round " << round) {
      auto over = local->reuse_file(spare, taken, &mappings);
      BOOST_REQUIRE(over.is_ok());
      BOOST_REQUIRE(mappings.size() == 1u);
      BOOST_TEST(mappings.front() != first);
      BOOST_TEST(mappings.front()->size() == kOld + 100);
      BOOST_REQUIRE((*over)->write_at(0, again.data(), again.size()).is_ok());
      BOOST_REQUIRE((*over)->close().is_ok());
      BOOST_TEST(test::read_file(taken) == again);
      BOOST_REQUIRE(::rename(taken.c_str(), spare.c_str()) == 0);
    }
  }
  const FileMapping* kept = mappings.front().get();

  // A second file: its own mapping beside the first; once the first is removed, its mapping is
  // dropped at the next reuse (it held the removed file's memory).
  const std::string other = dir / "other";
  write_file(other, pattern(kOld, 'z'));
  auto second = local->reuse_file(other, dir / "other_taken", &mappings);
  BOOST_REQUIRE(second.is_ok());
  BOOST_REQUIRE((*second)->write_at(0, fresh.data(), kOld).is_ok());
  BOOST_REQUIRE((*second)->close().is_ok());
  BOOST_TEST(mappings.size() == 2u);
  BOOST_TEST(mappings.front().get() == kept);
  BOOST_REQUIRE(::unlink(spare.c_str()) == 0);
  BOOST_TEST(!mappings.front()->linked());
  BOOST_REQUIRE(::rename((dir / "other_taken").c_str(), other.c_str()) == 0);
  auto third = local->reuse_file(other, dir / "other_taken", &mappings);
  BOOST_REQUIRE(third.is_ok());
  BOOST_REQUIRE((*third)->write_at(0, fresh.data(), kOld).is_ok());
  BOOST_REQUIRE((*third)->close().is_ok());
  BOOST_REQUIRE(mappings.size() == 1u);
  BOOST_TEST(mappings.front()->linked());
  BOOST_TEST(test::read_file(dir / "other_taken") == fresh.substr(0, kOld));

  // A file with holes is written the usual way, never mapped: a write into a hole of a full
  // tmpfs would be a SIGBUS instead of an error.
  const std::string sparse = dir / "sparse";
  { std::ofstream(sparse, std::ios::binary); }
  fs::resize_file(sparse, kOld);
  auto holes = local->reuse_file(sparse, dir / "holes_taken", &mappings);
  BOOST_REQUIRE(holes.is_ok());
  BOOST_TEST(mappings.size() == 1u);
  BOOST_REQUIRE((*holes)->write_at(0, fresh.data(), kOld).is_ok());
  BOOST_REQUIRE((*holes)->close().is_ok());
  BOOST_TEST(test::read_file(dir / "holes_taken") == fresh.substr(0, kOld));
}

BOOST_AUTO_TEST_CASE(uncached_files_hold_every_byte_written_whatever_its_alignment_and_leave_no_cache_behind) {
  // On disk (O_DIRECT where the file system takes it, the usual files where it does not) and in
  // memory.
  constexpr std::size_t kMiB = 1u << 20;
  const AlignedMemory memory = aligned_memory(4 * kMiB);
  const std::string bytes = pattern(4 * kMiB, 'c');
  std::memcpy(memory.get(), bytes.data(), bytes.size());
  for (const std::string& parent : {fs::temp_directory_path().string(), std::string(kMemoryFolder)}) {
    BOOST_TEST_CONTEXT("in " << parent) {
      TempDir dir(parent);
      auto local = local_file_system();
      const std::string path = dir / "copy";
      // Aligned whole blocks, a piece that ends mid-block, an unaligned piece of memory, and a
      // write at an unaligned offset: the file is exactly what was written.
      auto file = local->create_file_uncached(path);
      BOOST_REQUIRE_MESSAGE(file.is_ok(), file.status().to_string());
      BOOST_REQUIRE((*file)->append(memory.get(), 2 * kMiB).is_ok());
      BOOST_REQUIRE((*file)->append(memory.get() + 2 * kMiB, kMiB + 100).is_ok());
      BOOST_REQUIRE((*file)->append(memory.get() + 3 * kMiB + 101, 5000).is_ok());
      std::string expected = bytes.substr(0, 3 * kMiB + 100) + bytes.substr(3 * kMiB + 101, 5000);
      BOOST_REQUIRE((*file)->write_at(7, "unaligned", 9).is_ok());
      expected.replace(7, 9, "unaligned");
      BOOST_REQUIRE((*file)->sync().is_ok());
      BOOST_REQUIRE((*file)->close().is_ok());
      BOOST_TEST(fs::file_size(path) == expected.size());
      // Read back around the cache, into aligned and unaligned memory, from aligned and
      // unaligned offsets, to the file's end.
      auto in = local->open_file_uncached(path);
      BOOST_REQUIRE_MESSAGE(in.is_ok(), in.status().to_string());
      BOOST_TEST((*in)->size() == expected.size());
      const AlignedMemory back = aligned_memory(4 * kMiB);
      BOOST_REQUIRE((*in)->read(0, back.get(), expected.size()).is_ok());
      BOOST_TEST(std::string(back.get(), expected.size()) == expected);
      BOOST_REQUIRE((*in)->read(4096 * 3, back.get() + 1, 10000).is_ok());
      BOOST_TEST(std::string(back.get() + 1, 10000) == expected.substr(4096 * 3, 10000));
      BOOST_REQUIRE((*in)->read(expected.size() - 33, back.get(), 33).is_ok());
      BOOST_TEST(std::string(back.get(), 33) == expected.substr(expected.size() - 33));
      BOOST_TEST((*in)->read(expected.size() - 10, back.get(), 11).code() == ErrorCode::corruption);
      // What went around the cache is not in it: at most the blocks written through it (a
      // file system on a device; tmpfs, which takes O_DIRECT since Linux 6.6, is its cache).
      if (!in_memory(parent) && test::takes_direct_io(dir.path())) {
        BOOST_TEST(test::cached_pages(path) <= 3u);
      }
      BOOST_TEST(test::read_file(path) == expected);
    }
  }
}

BOOST_AUTO_TEST_CASE(uncached_writes_go_around_the_cache_wherever_memory_and_file_share_the_offset_within_a_block) {
  // As a bucket file is written with uncached staging (SaveEngineOptions::uncached_writes): a
  // header of no particular size, then the data in pieces whose memory lies at the offset
  // within a 4096-byte block that their file bytes have.
  constexpr std::size_t kMiB = 1u << 20;
  constexpr std::size_t kHeader = 4096 + 123;
  const AlignedMemory memory = aligned_memory(4 * kMiB);
  const std::string bytes = pattern(3 * kMiB + 777, 'd');
  char* at = memory.get() + kHeader % 4096;
  std::memcpy(at, bytes.data(), bytes.size());
  TempDir dir(fs::temp_directory_path().string());
  const std::string path = dir / "bucket";
  auto file = local_file_system()->create_file_uncached(path);
  BOOST_REQUIRE_MESSAGE(file.is_ok(), file.status().to_string());
  const std::string header = pattern(kHeader, 'h');
  BOOST_REQUIRE((*file)->append(header.data(), header.size()).is_ok());
  // Pieces of 1 MiB (the last one shorter), each at its own file offset.
  for (std::size_t done = 0; done < bytes.size(); done += kMiB) {
    const std::size_t n = std::min(kMiB, bytes.size() - done);
    BOOST_REQUIRE((*file)->write_at(kHeader + done, at + done, n).is_ok());
  }
  BOOST_REQUIRE((*file)->sync().is_ok());
  BOOST_REQUIRE((*file)->close().is_ok());
  if (test::takes_direct_io(dir.path()) && !in_memory(dir.path())) {
    // The blocks holding the header and each piece's ends at most: the rest went to the device.
    BOOST_TEST(test::cached_pages(path) <= 2u + 4u);
  }
  BOOST_TEST(test::read_file(path) == header + bytes);
}

BOOST_AUTO_TEST_CASE(an_uncached_file_names_its_block_where_it_goes_around_the_cache_and_none_in_memory) {
  // create_file_uncached() and reuse_file_uncached() give files whose direct_block() is
  // kDirectIoBlock where their writes go to the device, and 0 in a folder kept in memory (tmpfs
  // is the cache: written through it). A rate-limited file system passes the file on with its
  // block, and its paced writes still go around the cache.
  constexpr std::size_t kMiB = 1u << 20;
  const AlignedMemory memory = aligned_memory(2 * kMiB);
  const std::string bytes = pattern(2 * kMiB, 'r');
  std::memcpy(memory.get(), bytes.data(), bytes.size());
  const auto limited = rate_limited(local_file_system(), 512.0 * kMiB);
  BOOST_REQUIRE(limited != local_file_system());
  std::vector<std::string> parents{fs::temp_directory_path().string()};
  if (in_memory(kMemoryFolder)) parents.emplace_back(kMemoryFolder);
  for (const std::string& parent : parents) {
    for (const bool paced : {false, true}) {
      BOOST_TEST_CONTEXT("in " << parent << (paced ? ", rate-limited" : "")) {
        TempDir dir(parent);
        FileSystem& files = paced ? *limited : *local_file_system();
        const bool device = !in_memory(dir.path()) && test::takes_direct_io(dir.path());
        const std::string path = dir / "data";
        auto file = files.create_file_uncached(path);
        BOOST_REQUIRE_MESSAGE(file.is_ok(), file.status().to_string());
        BOOST_TEST((*file)->direct_block() == (device ? kDirectIoBlock : 0u));
        BOOST_REQUIRE((*file)->append(memory.get(), bytes.size()).is_ok());
        BOOST_REQUIRE((*file)->sync().is_ok());
        BOOST_REQUIRE((*file)->close().is_ok());
        if (device) BOOST_TEST(test::cached_pages(path) == 0u);
        BOOST_TEST(test::read_file(path) == bytes);
        if (paced) continue;  // a wrapper does not reuse files (FileSystem::reuse_file)
        // Written over in place: the same kind of file.
        const std::string again = dir / "again";
        auto reused = files.reuse_file_uncached(path, again, nullptr);
        BOOST_REQUIRE_MESSAGE(reused.is_ok(), reused.status().to_string());
        BOOST_TEST((*reused)->direct_block() == (device ? kDirectIoBlock : 0u));
        BOOST_REQUIRE((*reused)->write_at(0, memory.get() + kMiB, kMiB).is_ok());
        BOOST_REQUIRE((*reused)->close().is_ok());
        if (device) BOOST_TEST(test::cached_pages(again) == 0u);
        BOOST_TEST(test::read_file(again) == bytes.substr(kMiB));
      }
    }
  }
}
