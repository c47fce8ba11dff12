#pragma once

// Data files of retired steps written over again instead of freed and allocated anew: in a local
// tier that saves every few steps and keeps only the newest, each save otherwise allocates and
// zeroes a whole step's pages (in tmpfs, its memory) while retention frees the same amount.

#include <memory>
#include <string>
#include <vector>

#include "stagehand/storage/file_system.hpp"

namespace stagehand {

/// The folder below each root of reusing_file_system() that holds the retired files.
inline constexpr const char* kSpareFilesDir = ".spare_files";

/// A FileSystem over `inner` that, below each of `roots` (the local tier's folders: one, or one
/// per host) where reuses_files_at() says so (the others are left alone, a folder on a FUSE or
/// network mount logged; `inner` itself is returned when no root qualifies):
/// - on remove_tree() of a folder there, first moves its data files (data_file_rank() >= 0) into
///   `<root>/.spare_files` under their names, replacing a spare of the same name, so that the
///   spares are at most one file per name;
/// - on create_file() of a data file whose name has a spare, takes the spare
///   (FileSystem::reuse_file: renamed into place, written over, cut to what was written when
///   synced or closed; in a folder kept in memory, tmpfs, written through a mapping of the file
///   that is kept for its next reuse, so that a save copies its bytes in with memcpy instead of
///   write calls into pages found one by one), and creates the file as usual when there is
///   none or it cannot be taken;
/// - leaves `.spare_files` out of the root's listing, and removes it when destroyed (at the end of
///   a run; a killed run's spares are taken or replaced by the next run's).
/// Everything else passes to `inner` unchanged. A spare is only ever taken by the save of the
/// rank whose name it has, and a rank's save starts after its previous one has ended, so no
/// writer of a removed step still writes into a file that is taken.
///
/// `inner` must implement reuse_file (the local file system does); where it does not, every data
/// file is created as usual and the spares are removed with their folders' next removal.
///
/// Thread-safety: as any FileSystem's; taking a spare and moving files into the spares hold one
/// lock, so that two threads never take one spare. Across processes (one lock each: a retention
/// in rank 0's process while another rank's save takes its spares), `inner`'s reuse_file takes
/// the file it opens (the local file system takes it under a name of its own first), so a file
/// moved onto a spare's name meanwhile never lands under the new step's name.
std::shared_ptr<FileSystem> reusing_file_system(std::shared_ptr<FileSystem> inner, std::vector<std::string> roots);

/// Whether saves below `root` should write over retired files (trainer.ckpt_reuse_files, the
/// Checkpointer's reuse_files, the local tier's folders): a folder where
/// FileSystemCapabilities::rewrites_in_place (a local file system, or another host's disk
/// through its file server). An object store has nothing to write over; on a FUSE or network
/// mount a rename may be a copy, and a write into a file a read of it first.
bool reuses_files_at(const FileSystem& fs, const std::string& root);

}  // namespace stagehand
