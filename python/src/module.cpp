// stagehand._stagehand: the C++ Checkpointer for Python (nanobind). The Python layer
// (python/stagehand/__init__.py) flattens state dicts and keeps every array alive; this module
// wraps each array without a copy (Tensor::from_blob over its buffer or DLPack capsule) and runs
// every save, load and wait with the GIL released.

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>

#include "stagehand/actors/checkpointer.hpp"
#include "stagehand/checkpoint/load/checkpoint_reader.hpp"
#include "stagehand/checkpoint/interop/export.hpp"
#include "stagehand/checkpoint/load/resolve.hpp"
#include "stagehand/checkpoint/load/verify.hpp"
#include "stagehand/core/progress_meter.hpp"
#include "stagehand/storage/default_file_system.hpp"
#include "stagehand/core/copy_engine.hpp"
#include "stagehand/core/device.hpp"
#include "stagehand/core/dtype.hpp"
#include "stagehand/core/xxh3.hpp"

#include "binding_common.hpp"

namespace nb = nanobind;
using namespace stagehand;
using namespace stagehand_python;

namespace {

/// `progress` as stagehand-ckpt's --progress spells it: "auto" (a terminal, after a second),
/// "always" or "never"; anything else is a ValueError.
ProgressMeter::Mode progress_mode(const std::string& progress) {
  if (progress != "auto" && progress != "always" && progress != "never") {
    throw nb::value_error(("progress: '" + progress + "' is none of 'auto', 'always', 'never'").c_str());
  }
  return ProgressMeter::parse_mode(progress);
}

/// Resolves `path` (a root, through its tracker, or one step folder) on the default file system
/// and runs `read(fs, dir)` on the folder, the GIL released throughout.
/// @return the folder and what `read` returned; raises stagehand.Error on a failure of either.
template <class Read>
auto read_resolved(const std::string& path, Read read) {
  using Value = std::remove_cvref_t<decltype(*read(std::declval<FileSystem&>(), std::string()))>;
  std::string dir;
  Result<Value> result = Status{ErrorCode::internal, "not run"};
  {
    nb::gil_scoped_release release;
    auto fs = default_file_system(ObjectStoreOptions::from_environment());
    auto resolved = resolve_checkpoint(*fs, path);
    if (resolved.is_ok()) {
      dir = *resolved;
      result = read(*fs, dir);
    } else {
      result = resolved.status();
    }
  }
  check(result.status());
  return std::pair<std::string, Value>(std::move(dir), std::move(*result));
}

struct PyCheckpointer {
  std::unique_ptr<Checkpointer> impl;
  int rank = 0;
  int world_size = 1;
  /// CheckpointerOptions::timeout.
  std::chrono::milliseconds timeout{0};

  Checkpointer& get() {
    if (!impl) throw Error("aborted: the Checkpointer is closed");
    return *impl;
  }
};

/// DLPack's code and bits for a dtype Stagehand saves (not the fp8 ones, which DLPack 0.8 lacks).
std::optional<nb::dlpack::dtype> dlpack_of(DType dtype) {
  for (const DlpackDtype& k : kDlpackDtypes) {
    if (k.dtype == dtype) return nb::dlpack::dtype{static_cast<std::uint8_t>(k.code), static_cast<std::uint8_t>(k.bits), 1};
  }
  return std::nullopt;
}

/// Device memory for tests and device checks: `shape` of `dtype_name` (Stagehand's names: F32,
/// BF16, ...) on device `index` of the process (a GPU, or the simulated one under
/// STAGEHAND_SIMULATED_GPU=1), as a DLPack CUDA array, the way a torch.cuda tensor arrives. Host
/// code may not touch it: fill and read it with device_copy. Freed when the array goes.
nb::ndarray<nb::array_api> device_empty(const std::vector<std::size_t>& shape, const std::string& dtype_name, int index) {
  auto dtype = dtype_from_name(dtype_name);
  auto code = dtype ? dlpack_of(*dtype) : std::nullopt;
  if (!code) throw nb::type_error(("device_empty: dtype '" + dtype_name + "' has no DLPack code").c_str());
  const DeviceInfo& info = device_info();
  if (index < 0 || index >= info.gpu_count) {
    throw Error("device " + std::to_string(index) + " does not exist: " + std::to_string(info.gpu_count) +
                " GPU(s) visible" + (info.reason.empty() ? "" : " (" + info.reason + ")") +
                "; STAGEHAND_SIMULATED_GPU=1 simulates one");
  }
  std::size_t bytes = dtype_size(*dtype);
  for (std::size_t d : shape) {
    if (d != 0 && bytes > std::numeric_limits<std::size_t>::max() / d) throw nb::value_error("device_empty: too many bytes");
    bytes *= d;
  }
  const Device device = Device::cuda(index);
  void* ptr = device_alloc(device, bytes == 0 ? 1 : bytes);
  if (ptr == nullptr) throw Error("device_empty: cannot allocate " + std::to_string(bytes) + " bytes on " + device.to_string());
  nb::capsule owner(ptr, [](void* p) noexcept {
    // The index is not kept: the simulated device has one, and cudaFree needs none.
    device_free(Device::cuda(0), p);
  });
  return nb::ndarray<nb::array_api>(ptr, shape.size(), shape.data(), owner, nullptr, *code, nb::device::cuda::value, index);
}

/// Copies all of `src` into `dst` (equal sizes in bytes), one on the device, one in host memory,
/// with a blocking copy of the process's copy engine; the GIL released.
void device_copy(nb::ndarray<nb::c_contig> dst, nb::ndarray<nb::ro, nb::c_contig> src) {
  if (dst.nbytes() != src.nbytes()) {
    throw nb::value_error(("device_copy: " + std::to_string(src.nbytes()) + " bytes into " +
                           std::to_string(dst.nbytes()))
                              .c_str());
  }
  const bool to_device = dst.device_type() == nb::device::cuda::value && src.device_type() == nb::device::cpu::value;
  const bool to_host = dst.device_type() == nb::device::cpu::value && src.device_type() == nb::device::cuda::value;
  if (!to_device && !to_host) throw nb::value_error("device_copy: one array on a CUDA device and one in host memory");
  bool ok = false;
  {
    nb::gil_scoped_release release;
    ok = to_device ? copy_from_host(Device::cuda(dst.device_id()), src.data(), dst.data(), dst.nbytes())
                   : copy_to_host(Device::cuda(src.device_id()), src.data(), dst.data(), dst.nbytes());
  }
  if (!ok) throw Error("device_copy: the copy failed");
}

/// Polls `over` (with the GIL released) every 20 ms until it says so; Ctrl-C in between raises
/// KeyboardInterrupt (nb::python_error).
/// @return whether it had to wait.
template <class Over>
bool wait_interruptibly(Over over, std::optional<std::chrono::milliseconds> limit = std::nullopt,
                        const std::string& past_limit = "") {
  const auto start = std::chrono::steady_clock::now();
  for (bool waited = false;; waited = true) {
    bool done = false;
    {
      nb::gil_scoped_release release;
      done = over();
      if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (done) return waited;
    if (PyErr_CheckSignals() != 0) throw nb::python_error();
    if (limit && std::chrono::steady_clock::now() - start >= *limit) {
      std::ostringstream seconds;
      seconds << static_cast<double>(limit->count()) / 1000.0;
      throw Error("timeout: " + past_limit + " within " + seconds.str() +
                  " s (timeout): a save still reads the tensors (its staging waits for writes that do not end); "
                  "do not modify them before it is staged");
    }
  }
}

}  // namespace

NB_MODULE(_stagehand, m) {
  m.doc() = "Stagehand's Checkpointer (C++), for the stagehand package";
  nb::exception<Error>(m, "Error", PyExc_RuntimeError);

  // A call's tensors, added one by one as the Python layer walks its state (_Bound).
  nb::class_<BoundTensors>(m, "_Tensors")
      .def(nb::init<>())
      // noconvert: never a converted copy (a load would fill the copy).
      .def("add", &add_array<ReadArray>, nb::arg("name"), nb::arg("array").noconvert(), nb::arg("dtype"),
           nb::arg("global_shape"), nb::arg("offsets"), nb::arg("replica_id"))
      .def("add_writable", &add_array<WriteArray>, nb::arg("name"), nb::arg("array").noconvert(), nb::arg("dtype"),
           nb::arg("global_shape"), nb::arg("offsets"), nb::arg("replica_id"))
      .def("add_host", &add_host, nb::arg("name"), nb::arg("data_ptr"), nb::arg("shape"), nb::arg("dtype"),
           nb::arg("global_shape"), nb::arg("offsets"), nb::arg("replica_id"))
      .def("__len__", [](const BoundTensors& b) { return b.state.tensors.size(); })
      // The first name (in name order) that two tensors, or a tensor and one of `objects`, share;
      // None when there is none. Checked here, once, instead of in a Python set of every name
      // (~13 MB with 100,000 tensors for as long as the call runs).
      .def("first_duplicate",
           [](const BoundTensors& b, const std::vector<std::string>& objects) -> std::optional<std::string> {
             std::vector<std::string_view> names;
             names.reserve(b.state.tensors.size() + objects.size());
             for (const ShardedTensor& t : b.state.tensors) names.emplace_back(t.desc.name);
             for (const std::string& o : objects) names.emplace_back(o);
             std::sort(names.begin(), names.end());
             auto twice = std::adjacent_find(names.begin(), names.end());
             if (twice == names.end()) return std::nullopt;
             return std::string(*twice);
           },
           nb::arg("objects"))
      // (name, dtype, data pointer) of each: where the saved bytes are read from, the array's own
      // memory (no copy was made).
      .def("describe", [](const BoundTensors& b) {
        std::vector<std::tuple<std::string, std::string, std::uintptr_t>> out;
        for (const ShardedTensor& t : b.state.tensors) {
          out.emplace_back(t.desc.name, std::string(dtype_name(t.desc.dtype)),
                           reinterpret_cast<std::uintptr_t>(t.tensor.data()));
        }
        return out;
      });
  // stagehand-ckpt verify: a root (the step its tracker names) or one step folder.
  m.def("verify", [](const std::string& path, const std::string& progress) {
    ProgressMeter meter(progress_mode(progress));
    auto [dir, result] = read_resolved(path, [&meter](FileSystem& fs, const std::string& dir) {
      return verify_checkpoint(fs, dir, meter.reporter());
    });
    meter.finish();
    nb::dict out;
    out["checkpoint"] = dir;
    out["ok"] = result.ok();
    out["problems"] = result.problems;
    out["files_checked"] = result.files_checked;
    out["chunks_checked"] = result.chunks_checked;
    out["bytes_checked"] = result.bytes_checked;
    return out;
  }, nb::arg("path"), nb::arg("progress") = "never");
  // stagehand-ckpt inspect: the metadata of a root's tracked step or one step folder.
  m.def("inspect", [](const std::string& path) {
    struct Read {
      CheckpointMetadata metadata;
      std::optional<std::string> trainer_state;
    };
    auto [dir, read] = read_resolved(path, [](FileSystem& fs, const std::string& dir) -> Result<Read> {
      SH_ASSIGN_OR_RETURN(CheckpointMetadata metadata, read_checkpoint_metadata(fs, dir));
      Read out{std::move(metadata), std::nullopt};
      if (out.metadata.trainer_state) {
        SH_ASSIGN_OR_RETURN(out.trainer_state, read_trainer_state_text(fs, dir, out.metadata));
      }
      return out;
    });
    const CheckpointMetadata& metadata = read.metadata;
    auto dims = [](const Shape& shape) { return std::vector<std::int64_t>(shape.dims().begin(), shape.dims().end()); };
    nb::dict tensors;
    for (const auto& [name, t] : metadata.tensors) {
      std::uint64_t bytes = 0;
      nb::list chunks;
      for (const auto& c : t.chunks) {
        bytes += c.end - c.begin;
        nb::dict chunk;
        chunk["offsets"] = dims(c.offsets);
        chunk["shape"] = dims(c.shape);
        chunk["file"] = c.file;
        chunk["bytes"] = c.end - c.begin;
        chunk["xxh3"] = xxh3_hex(c.xxh3);
        chunks.append(chunk);
      }
      nb::dict entry;
      entry["dtype"] = std::string(dtype_name(t.dtype));
      entry["global_shape"] = dims(t.global_shape);
      entry["bytes"] = bytes;
      entry["chunks"] = chunks;
      tensors[name.c_str()] = entry;
    }
    nb::dict files;
    for (const auto& [name, f] : metadata.files) {
      nb::dict file;
      file["size"] = f.size;
      file["xxh3"] = xxh3_hex(f.xxh3);
      files[name.c_str()] = file;
    }
    nb::dict out;
    out["checkpoint"] = dir;
    out["step"] = metadata.step;
    out["tensors"] = tensors;
    out["files"] = files;
    out["objects"] = metadata.objects;
    out["trainer_state"] = read.trainer_state;
    return out;
  }, nb::arg("path"));
  // stagehand-ckpt export: consolidated tensors in the Hugging Face layout.
  m.def("export", [](const std::string& checkpoint, const std::string& out, const std::string& what,
                     const std::string& dtype, const std::string& max_shard_size, int threads,
                     const std::string& progress) {
    ExportOptions options;
    ProgressMeter meter(progress_mode(progress));
    options.progress = meter.reporter();
    if (what == "all") {
      options.what = ExportOptions::What::all;
    } else if (what != "model") {
      throw nb::value_error(("what: '" + what + "' is neither 'model' nor 'all'").c_str());
    }
    if (dtype == "bf16") {
      options.dtype = DType::bf16;
    } else if (dtype == "fp32") {
      options.dtype = DType::f32;
    } else if (dtype != "as-saved") {
      throw nb::value_error(("dtype: '" + dtype + "' is none of 'as-saved', 'bf16', 'fp32'").c_str());
    }
    if (threads < 1 || threads > 256) {
      throw nb::value_error(("threads: " + std::to_string(threads) + " is outside 1 to 256").c_str());
    }
    options.thread_count = threads;
    auto max_bytes = parse_byte_size(max_shard_size);
    if (!max_bytes.is_ok()) throw nb::value_error(("max_shard_size: " + max_bytes.status().message()).c_str());
    options.max_shard_bytes = *max_bytes;
    ExportReport report;
    Status status;
    {
      nb::gil_scoped_release release;
      auto fs = default_file_system(ObjectStoreOptions::from_environment());
      status = export_checkpoint(*fs, checkpoint, out, options, &report);
    }
    meter.finish();
    check(status);
    nb::dict result;
    result["tensors"] = report.tensors;
    result["bytes"] = report.bytes;
    result["files"] = report.files_written;
    result["largest_tensor_bytes"] = report.largest_tensor_bytes;
    result["buffer_peak_bytes"] = report.buffer_peak_bytes;
    result["total_s"] = report.total_s;
    return result;
  }, nb::arg("checkpoint"), nb::arg("out"), nb::arg("what"), nb::arg("dtype"), nb::arg("max_shard_size"),
     nb::arg("threads"), nb::arg("progress") = "never");
  // Device arrays for tests and device checks (tests/python, scripts/device-check.sh).
  m.def("_device_empty", &device_empty, nb::arg("shape"), nb::arg("dtype"), nb::arg("index") = 0);
  m.def("_device_copy", &device_copy, nb::arg("dst").noconvert(), nb::arg("src").noconvert());
  // The process's copy engine: its name ("cuda", "simulated", "host"), the misuse it found (a
  // read before a copy's event, a free under a copy) and the bytes each way of the copies it logged.
  m.def("_copy_engine", []() {
    CopyEngine& engine = copy_engine();
    nb::dict result;
    result["name"] = engine.name();
    result["misuse"] = engine.misuse_count();
    std::uint64_t to_host = 0, to_device = 0;
    for (const CopyRecord& r : engine.copy_log()) {
      (r.kind == CopyKind::device_to_host ? to_host : to_device) += r.bytes;
    }
    result["device_to_host_bytes"] = to_host;
    result["host_to_device_bytes"] = to_device;
    return result;
  });

  nb::class_<PendingSave>(m, "PendingSave")
      .def("wait",
           [](PendingSave& p) {
             // Ctrl-C interrupts the wait (KeyboardInterrupt), not the save: it goes on, and the
             // next call or close() finishes it.
             wait_interruptibly([&] { return p.done(); });
             Status st;
             {
               nb::gil_scoped_release release;
               st = p.wait();
             }
             check(st);
           })
      .def("wait_staged",
           [](PendingSave& p) {
             // As wait(): Ctrl-C interrupts the wait, not the staging.
             const auto start = std::chrono::steady_clock::now();
             const bool waited_here = wait_interruptibly([&] { return p.staged(); }, p.timeout(),
                                                         "step " + std::to_string(p.step()) + " was not staged");
             Result<double> waited = 0.0;
             {
               nb::gil_scoped_release release;
               waited = p.wait_staged();
             }
             check(waited.status());
             return waited_here ? std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()
                                : *waited;
           })
      .def("done", &PendingSave::done, nb::call_guard<nb::gil_scoped_release>())
      .def("staged", &PendingSave::staged, nb::call_guard<nb::gil_scoped_release>())
      .def_prop_ro("step", &PendingSave::step)
      .def_prop_ro("stall_s", &PendingSave::stall_s);

  nb::class_<PyCheckpointer>(m, "Checkpointer")
      .def(
          "__init__",
          [](PyCheckpointer* self, const std::string& root, std::optional<int> rank, std::optional<int> world_size,
             std::optional<std::string> master_addr, std::optional<int> port, int thread_count, int load_thread_count,
             int staging_buckets, double timeout_s, double join_timeout_s, std::optional<std::string> local_work_dir,
             double write_rate_limit_mib_s, int max_to_keep, bool reuse_files, bool uncached_writes) {
            CheckpointerOptions options;
            if (!rank && !world_size) {
              auto from_env = CheckpointerOptions::from_environment(root);
              check(from_env.status());
              options = std::move(*from_env);
            } else {
              options.root = root;
              options.rank = rank.value_or(0);
              options.world_size = world_size.value_or(1);
              options.local_ranks = options.world_size > 1 ? 1 : 0;
            }
            if (master_addr) options.master_addr = *master_addr;
            if (port) options.port = *port;
            options.thread_count = thread_count;
            options.load_thread_count = load_thread_count;
            options.staging_buckets = staging_buckets;
            options.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1000));
            options.join_timeout = std::chrono::milliseconds(static_cast<std::int64_t>(join_timeout_s * 1000));
            if (local_work_dir) options.local_work_dir = *local_work_dir;
            options.write_rate_limit_mib_s = write_rate_limit_mib_s;
            options.max_to_keep = max_to_keep;
            options.reuse_files = reuse_files;
            options.uncached_writes = uncached_writes;
            const int first = options.rank;
            const int world = options.world_size;
            const auto timeout = options.timeout;
            new (self) PyCheckpointer{std::make_unique<Checkpointer>(std::move(options)), first, world, timeout};
          },
          nb::arg("root"), nb::arg("rank").none() = nb::none(), nb::arg("world_size").none() = nb::none(),
          nb::arg("master_addr").none() = nb::none(), nb::arg("port").none() = nb::none(), nb::arg("thread_count") = 2,
          nb::arg("load_thread_count") = 4, nb::arg("staging_buckets") = 0, nb::arg("timeout_s") = 600.0,
          nb::arg("join_timeout_s") = 60.0, nb::arg("local_work_dir").none() = nb::none(),
          nb::arg("write_rate_limit_mib_s") = 0.0, nb::arg("max_to_keep") = 0, nb::arg("reuse_files") = true,
          nb::arg("uncached_writes") = true)
      .def(
          "prepare",
          [](PyCheckpointer& self, BoundTensors& entries,
             const std::map<std::string, std::string>& objects,
             bool async) { check(self.get().prepare(take_state(entries, objects), async)); },
          nb::call_guard<nb::gil_scoped_release>())
      .def(
          "prepare_in_background",
          [](PyCheckpointer& self, BoundTensors& entries,
             const std::map<std::string, std::string>& objects) {
            check(self.get().prepare_in_background(take_state(entries, objects)));
          },
          nb::call_guard<nb::gil_scoped_release>())
      .def(
          "save",
          [](PyCheckpointer& self, std::int64_t step, BoundTensors& entries,
             const std::map<std::string, std::string>& objects) { check(self.get().save(step, take_state(entries, objects))); },
          nb::call_guard<nb::gil_scoped_release>())
      .def(
          "async_save",
          [](PyCheckpointer& self, std::int64_t step, BoundTensors& entries,
             const std::map<std::string, std::string>& objects) {
            auto pending = self.get().async_save(step, take_state(entries, objects));
            check(pending.status());
            return std::move(*pending);
          },
          nb::call_guard<nb::gil_scoped_release>())
      .def(
          "load",
          [](PyCheckpointer& self, BoundTensors& entries,
             const std::map<std::string, std::string>& objects, const std::string& path) {
            // The objects named are the ones loaded (their values here are replaced).
            StateDict state = take_state(entries, objects);
            check(self.get().load(state, path));
            return state.objects;
          },
          nb::call_guard<nb::gil_scoped_release>())
      .def("fence",
           [](PyCheckpointer& self) {
             // As PendingSave.wait_staged(): Ctrl-C interrupts the wait, not the staging. A
             // signal handler run between polls may close the Checkpointer (its close finishes
             // every save): the wait then ends, and nothing touches the closed one.
             self.get();
             const auto start = std::chrono::steady_clock::now();
             const bool waited_here = wait_interruptibly([&] { return !self.impl || self.impl->staged(); },
                                                         self.timeout, "the fence did not open");
             const double here = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
             if (!self.impl) return here;
             Result<double> waited = 0.0;
             {
               nb::gil_scoped_release release;
               waited = self.impl->fence();
             }
             check(waited.status());
             return waited_here ? here : *waited;
           })
      .def("finalize", [](PyCheckpointer& self) { check(self.get().finalize()); },
           nb::call_guard<nb::gil_scoped_release>())
      .def("close", [](PyCheckpointer& self) { self.impl.reset(); }, nb::call_guard<nb::gil_scoped_release>())
      .def_prop_ro("closed", [](const PyCheckpointer& self) { return !self.impl; })
      .def_prop_ro("rank", [](const PyCheckpointer& self) { return self.rank; })
      .def_prop_ro("world_size", [](const PyCheckpointer& self) { return self.world_size; });

  bind_weight_sync(m);
}
