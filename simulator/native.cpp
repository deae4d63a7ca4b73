// Python's view of the simulated core's accounting (accounting.h): the HBM allocator and the
// timeline, bound with pybind11 as the module simulator/native.py builds and loads.
// simulator/memory.py and simulator/device.py give them their Python names and errors.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>

#include "accounting.h"

namespace py = pybind11;
using trnsim::Allocator;
using trnsim::Block;
using trnsim::Cost;
using trnsim::Timeline;

namespace {

// A Python dict {engine: ns} as (engine_index, ns) pairs.
std::vector<std::pair<int, int64_t>> engines_of(const py::dict& engine_ns) {
  std::vector<std::pair<int, int64_t>> out;
  out.reserve(engine_ns.size());
  for (auto item : engine_ns) {
    out.emplace_back(trnsim::engine_index(item.first.cast<std::string>()),
                     item.second.cast<int64_t>());
  }
  return out;
}

py::object out_of_memory_error() {
  return py::module_::import("trnsim.simulator.memory").attr("OutOfMemoryError");
}

}  // namespace

PYBIND11_MODULE(trnsim_native, m) {
  m.doc() = "the simulated core's allocator and timeline in C++ (simulator/native.py)";

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const trnsim::OutOfMemory& e) {
      py::object error = out_of_memory_error()(e.requested, e.allocated, e.reserved,
                                               e.capacity, e.limit);
      PyErr_SetObject(error.get_type().ptr(), error.ptr());
    }
  });

  py::class_<Block, std::shared_ptr<Block>>(m, "Block")
      .def_property_readonly("offset", [](const Block& b) { return b.offset; })
      .def_property_readonly("size", [](const Block& b) { return b.size; })
      .def_property_readonly("requested", [](const Block& b) { return b.requested; })
      .def_property_readonly("allocated", [](const Block& b) { return b.allocated; })
      .def_property_readonly("segment_offset", [](const Block& b) { return b.segment_offset; })
      .def("__repr__", [](const Block& b) {
        return "Block(offset=" + std::to_string(b.offset) + ", size=" + std::to_string(b.size) +
               (b.allocated ? ", allocated)" : ")");
      });

  py::class_<Allocator>(m, "Allocator")
      .def(py::init<int64_t>(), py::arg("capacity"))
      .def_readonly("capacity", &Allocator::capacity)
      .def_readwrite("limit", &Allocator::limit)
      .def("malloc", [](Allocator& a, int64_t size) {
        if (size < 0) {
          throw py::value_error("cannot allocate a negative size (" + std::to_string(size) +
                                " bytes)");
        }
        return a.malloc(size);
      }, py::arg("size"))
      .def("free", [](Allocator& a, Block& block) {
        if (!a.free(&block)) {
          throw py::value_error("double free of the block at offset " +
                                std::to_string(block.offset));
        }
      })
      .def("take", [](Allocator& a, int64_t size) {
        if (size < 0) {
          throw py::value_error("cannot allocate a negative size (" + std::to_string(size) +
                                " bytes)");
        }
        return a.take(size);
      }, py::arg("size"))
      .def("give", [](Allocator& a, int64_t id) {
        if (!a.give(id)) {
          throw py::value_error("double free of the block handle " + std::to_string(id));
        }
      }, py::arg("handle"))
      .def("holds", [](const Allocator& a, int64_t id) { return a.find(id) != nullptr; },
           py::arg("handle"))
      .def("requested", [](const Allocator& a, int64_t id) {
        const Block* b = a.find(id);
        if (b == nullptr) throw py::key_error("no allocated block has handle " + std::to_string(id));
        return b->requested;
      }, py::arg("handle"))
      .def("empty_cache", &Allocator::empty_cache)
      .def("reset_peak_stats", &Allocator::reset_peak_stats)
      .def("reset_accumulated_stats", &Allocator::reset_accumulated_stats)
      .def_property_readonly("allocated_bytes", [](const Allocator& a) { return a.c.allocated_bytes; })
      .def_property_readonly("reserved_bytes", [](const Allocator& a) { return a.c.reserved_bytes; })
      .def_property_readonly("peak_allocated_bytes",
                             [](const Allocator& a) { return a.c.peak_allocated_bytes; })
      .def("stats", [](Allocator& a) {
        const auto& c = a.c;
        const auto [cached, inactive_split] = a.cached_bytes();
        py::dict d;
        d["allocated_bytes"] = c.allocated_bytes;
        d["requested_bytes"] = c.requested_bytes;
        d["reserved_bytes"] = c.reserved_bytes;
        d["peak_allocated_bytes"] = c.peak_allocated_bytes;
        d["peak_reserved_bytes"] = c.peak_reserved_bytes;
        d["num_allocs"] = c.num_allocs;
        d["num_frees"] = c.num_frees;
        d["num_segment_allocs"] = c.num_segment_allocs;
        d["num_segment_frees"] = c.num_segment_frees;
        d["num_ooms"] = c.num_ooms;
        d["num_cache_flushes"] = c.num_cache_flushes;
        d["cached_bytes"] = cached;
        d["inactive_split_bytes"] = inactive_split;
        d["segments"] = a.segments();
        d["largest_free_range_bytes"] = a.largest_free_range();
        d["capacity_bytes"] = a.capacity;
        return d;
      })
      .def("snapshot", [](Allocator& a) {
        py::list out;
        for (const trnsim::Segment* seg : a.segments_by_address()) {
          int64_t allocated = 0, requested = 0;
          py::list blocks;
          for (const Block* b = seg->head.get(); b != nullptr; b = b->next.get()) {
            if (b->allocated) {
              allocated += b->size;
              requested += b->requested;
            }
            py::dict block;
            block["address"] = b->offset;
            block["size"] = b->size;
            block["requested_size"] = b->requested;
            block["state"] = b->allocated ? "active_allocated" : "inactive";
            blocks.append(block);
          }
          py::dict d;
          d["address"] = seg->offset;
          d["total_size"] = seg->size;
          d["stream"] = 0;
          d["segment_type"] = seg->small ? "small" : "large";
          d["allocated_size"] = allocated;
          d["active_size"] = allocated;
          d["requested_size"] = requested;
          d["blocks"] = blocks;
          out.append(d);
        }
        return out;
      });

  py::class_<Cost, std::shared_ptr<Cost>>(m, "Cost")
      .def(py::init([](int64_t modelled_ns, int64_t hbm_bytes, const py::dict& engine_ns) {
             auto cost = std::make_shared<Cost>();
             cost->modelled_ns = modelled_ns;
             cost->hbm_bytes = hbm_bytes;
             cost->engines = engines_of(engine_ns);
             return cost;
           }),
           py::arg("modelled_ns"), py::arg("hbm_bytes"), py::arg("engine_ns"))
      .def_readonly("modelled_ns", &Cost::modelled_ns)
      .def_readonly("hbm_bytes", &Cost::hbm_bytes)
      .def("address", [](const Cost& c) { return reinterpret_cast<uintptr_t>(&c); });

  py::class_<Timeline>(m, "Timeline", py::dynamic_attr())
      .def(py::init<int64_t>(), py::arg("launch_overhead_ns"))
      .def_readonly("launch_overhead_ns", &Timeline::launch_overhead_ns)
      .def_readonly("host_ns", &Timeline::host_ns)
      .def_readonly("host_busy_ns", &Timeline::host_busy_ns)
      .def_readonly("sync_waits", &Timeline::sync_waits)
      .def_readonly("sync_wait_ns", &Timeline::sync_wait_ns)
      .def_readonly("launches", &Timeline::launches)
      .def_readonly("collective_overlap_ns", &Timeline::collective_overlap_ns)
      .def_readonly("hbm_bytes", &Timeline::hbm_bytes)
      .def("address", [](const Timeline& t) { return reinterpret_cast<uintptr_t>(&t); })
      .def("host_work", &Timeline::host_work, py::arg("ns"))
      .def(
          "enqueue",
          [](Timeline& t, int64_t duration_ns, int64_t stream, const py::dict& engine_ns,
             int64_t overhead_ns, int64_t host_ns, int64_t hbm_bytes) {
            return t.enqueue(duration_ns, stream, engines_of(engine_ns), overhead_ns, host_ns,
                             hbm_bytes);
          },
          py::arg("duration_ns"), py::arg("stream"), py::arg("engine_ns"),
          py::arg("overhead_ns") = -1, py::arg("host_ns") = 0, py::arg("hbm_bytes") = 0)
      .def("launch_cost", &Timeline::launch, py::arg("cost"), py::arg("stream"),
           py::arg("host_ns"))
      .def("ready_ns", &Timeline::ready_ns, py::arg("stream"))
      .def(
          "occupy",
          [](Timeline& t, int64_t stream, int64_t start_ns, int64_t duration_ns,
             const std::string& engine) {
            if (!t.occupy(stream, start_ns, duration_ns, trnsim::engine_index(engine))) {
              throw py::value_error("work on stream " + std::to_string(stream) +
                                    " cannot start at " + std::to_string(start_ns) +
                                    " ns, before it is ready");
            }
          },
          py::arg("stream"), py::arg("start_ns"), py::arg("duration_ns"), py::arg("engine"))
      .def(
          "queue_depth",
          [](Timeline& t, std::optional<int64_t> stream) { return t.queue_depth(stream.value_or(-1)); },
          py::arg("stream") = py::none())
      .def("stream_end_ns", &Timeline::stream_end_ns, py::arg("stream") = 0)
      .def(
          "device_busy_ns",
          [](const Timeline& t, std::optional<int64_t> stream) {
            return t.device_busy_ns(stream.value_or(-1));
          },
          py::arg("stream") = py::none())
      .def(
          "synchronize",
          [](Timeline& t, std::optional<int64_t> stream) { return t.synchronize(stream.value_or(-1)); },
          py::arg("stream") = py::none())
      .def("wait_until", &Timeline::wait_until, py::arg("time_ns"))
      .def("stream_wait", &Timeline::stream_wait, py::arg("stream"), py::arg("time_ns"))
      .def("reset_counters", &Timeline::reset_counters)
      .def("now_ns", &Timeline::now_ns)
      .def(
          "engine_busy_ns",
          [](const Timeline& t, const std::string& engine) {
            return t.engine_busy(trnsim::engine_index(engine));
          },
          py::arg("engine"));
}
