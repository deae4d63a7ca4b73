// trnsim's C++ door: the PrivateUse1 kernel of every op the Python door serves.
//
// Python's kernels (client/door/kernel.py, reached through client/api/backend.py) are
// registered under PrivateUse2, a key no tensor carries; this door is registered under
// PrivateUse1 for the same ops and hands each call on to them (a redispatch), except a warm
// eager call it has been shown once: an op returning new tensors (one, or several as
// layer_norm), an op writing its first argument, or a view op; and `empty` and copies
// between neuron tensors, by rules of their own. Such a call is served here from a table
// keyed by its signature (the op, each tensor's sizes, strides, dtype and device, in lists
// too, which arguments are the same tensor, and every other argument's value), without
// converting it to Python objects: the CPU's kernel runs over host aliases of the inputs'
// memory, and each result becomes a neuron tensor over its memory. Python keeps the
// counters, the HBM blocks and the adoption that frees a block, in one short call, which
// may still refuse the call (a recording wants it); the launch goes on the runtime's
// simulated timeline from here, through the same C++ objects Python launches on
// (simulator/accounting.h), unless Python makes it (a profiler wants its source line). So
// simulated time and memory are what the Python door gives. Python decides which
// signatures may be served here (client/door/fast.py: offer).
#include <torch/extension.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/library.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "accounting.h"

namespace py = pybind11;
using torch::jit::Stack;

namespace {

const c10::DispatchKeySet kPythonDoor(c10::DispatchKey::PrivateUse2);
const c10::DispatchKeySet kMeta(c10::DispatchKey::Meta);
const c10::Device kNeuron(c10::DeviceType::PrivateUse1, 0);

// An output's declared layout (the Meta kernel's), which the CPU's result is conformed to.
struct Layout {
  std::vector<int64_t> sizes, strides;
  bool none = false;  // an optional output the op does not make (an output_mask's False)
};

// Where a served call's launch goes: its runtime's timeline (simulator/accounting.h), the
// executable's cost and the host's modelled dispatch time (Runtime.launch's, when nothing
// profiles). The objects are held so that the pointers stay valid.
struct Launch {
  py::object timeline_object, cost_object;
  py::object release;  // the runtime's DeviceMemory._release: its records of memory back
  trnsim::Timeline* timeline = nullptr;
  const trnsim::Cost* cost = nullptr;
  int64_t dispatch_ns = 0;
};

// What Python's accounting callbacks answer (fast.py): the call is refused (Python's door
// takes it), launched already (by Python), or to be launched here on that stream (>= 0).
constexpr int64_t kRefused = -2;
constexpr int64_t kLaunched = -1;

// A signature Python offered: its token (what the callbacks account), the layout of each new
// tensor it returns (one, or several: layer_norm's output, mean and rstd) and its launch.
struct Fast {
  py::object token;
  std::vector<Layout> outputs;
  bool writes = false;  // an in-place op: it writes its first argument and returns it
  Launch launch;
};

// The launch Python left to the door (`stream` >= 0), as Runtime.launch makes it.
void launch_on(const Fast& fast, int64_t stream) {
  if (stream >= 0) fast.launch.timeline->launch(*fast.launch.cost, stream, fast.launch.dispatch_ns);
}

struct State {
  // (shared: a call being served keeps its entry while its kernel runs without the GIL,
  // whatever clear() does meanwhile)
  std::unordered_map<std::string, std::shared_ptr<const Fast>> table;
  std::unordered_set<const c10::FunctionSchema*> views;  // ops served as views
  // Python's callbacks (fast.py)
  py::object served_cb, served_many_cb, may_write_cb, wrote_cb, failed_cb, view, made_cb;
  // The allocations (empty, empty_strided) and the copy between two neuron tensors
  // (_copy_from, which Python runs as copy_), served here with their own rules.
  const c10::FunctionSchema* empty = nullptr;
  const c10::FunctionSchema* empty_strided = nullptr;
  const c10::FunctionSchema* copy_from = nullptr;
  std::optional<c10::OperatorHandle> copy;
  std::atomic<bool> on{false};
  std::vector<std::unique_ptr<torch::Library>> libraries;
  // served calls, and calls handed on to Python, since the last reset
  std::atomic<int64_t> served{0}, handed_on{0};
};

State& state() {
  static State* s = new State();  // (never destroyed: interpreter exit runs no kernel)
  return *s;
}

// What Python offers for the call it is running now: a signature's token, or a view.
struct Offer {
  const c10::OperatorHandle* op = nullptr;  // the call handed on
  py::object token;
  std::vector<Layout> outputs;
  bool writes = false;
  bool view = false;
  bool made = false;
  Launch launch;
};
thread_local Offer* current_offer = nullptr;

constexpr int64_t kMostTensors = 64;  // tensors in one served call, lists included

bool is_neuron(const c10::IValue& v) {
  return v.isTensor() && v.toTensor().defined() &&
         v.toTensor().device().type() == c10::DeviceType::PrivateUse1;
}

// A device argument this door serves: neuron:0, or neuron without an index.
bool neuron0(const c10::Device& device) {
  return device.type() == c10::DeviceType::PrivateUse1 &&
         (!device.has_index() || device.index() == 0);
}

void put(std::string& key, int64_t v) {
  key.append(reinterpret_cast<const char*>(&v), sizeof v);
}

// A tensor's part of a signature: where it is, its dtype, sizes and strides, and which
// earlier tensor of the call it is (-1: none). False for one this door does not serve.
struct Seen {
  const c10::TensorImpl* impls[kMostTensors];
  int64_t n = 0;
};

bool put_tensor(std::string& key, const at::Tensor& t, Seen& seen) {
  if (!t.defined()) {
    put(key, 1);
    return true;
  }
  if (t.layout() != c10::kStrided || t.is_neg() || t.is_conj() || t.is_quantized() ||
      t.is_nested() || t._is_zerotensor() || seen.n == kMostTensors) {
    return false;
  }
  const auto device = t.device().type();
  if (device != c10::DeviceType::PrivateUse1 && device != c10::DeviceType::CPU) return false;
  put(key, device == c10::DeviceType::CPU ? 2 : 3);
  put(key, static_cast<int64_t>(t.scalar_type()));
  put(key, t.dim());
  for (auto s : t.sizes()) put(key, s);
  for (auto s : t.strides()) put(key, s);
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  int64_t same = -1;
  for (int64_t j = 0; j < seen.n; ++j) {
    if (seen.impls[j] == impl) same = j;
  }
  put(key, same);
  seen.impls[seen.n++] = impl;
  return true;
}

// The call's signature, or false when some argument is outside what this door serves.
bool signature(const c10::OperatorHandle& op, const c10::IValue* args, size_t n,
               std::string& key) {
  const auto& schema = op.schema();
  key.reserve(256);
  put(key, reinterpret_cast<int64_t>(&schema));
  Seen seen;
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue& v = args[i];
    if (v.isTensor()) {
      if (!put_tensor(key, v.toTensor(), seen)) return false;
    } else if (v.isDouble()) {
      // (a float is a runtime value; whether it is the schema's default changes the call)
      const auto& dflt = schema.arguments()[i].default_value();
      put(key, 4);
      put(key, dflt.has_value() && *dflt == v ? 1 : 0);
    } else if (v.isInt()) {
      put(key, 5);
      put(key, v.toInt());
    } else if (v.isBool()) {
      put(key, 6);
      put(key, v.toBool() ? 1 : 0);
    } else if (v.isNone()) {
      put(key, 7);
    } else if (v.isIntList()) {
      put(key, 8);
      auto list = v.toIntList();
      put(key, static_cast<int64_t>(list.size()));
      for (int64_t x : list) put(key, x);
    } else if (v.isTensorList()) {  // (cat, stack)
      put(key, 9);
      auto list = v.toTensorList();
      put(key, static_cast<int64_t>(list.size()));
      for (const at::Tensor& t : list) {
        if (!put_tensor(key, t, seen)) return false;
      }
    } else if (v.isOptionalTensorList()) {  // (index's indices)
      put(key, 10);
      auto list = v.toOptionalTensorList();
      put(key, static_cast<int64_t>(list.size()));
      for (const std::optional<at::Tensor>& t : list) {
        if (!put_tensor(key, t.has_value() ? *t : at::Tensor(), seen)) return false;
      }
    } else if (v.isBoolList()) {  // (an output_mask)
      put(key, 13);
      auto list = v.toBoolList();
      put(key, static_cast<int64_t>(list.size()));
      for (bool x : list) put(key, x ? 1 : 0);
    } else if (v.isString()) {  // (gelu's approximate, div's rounding_mode)
      const std::string& text = v.toStringRef();
      put(key, 12);
      put(key, static_cast<int64_t>(text.size()));
      key.append(text);
    } else if (v.isDevice()) {  // (a factory's device: the CPU's kernel is given the CPU)
      const c10::Device device = v.toDevice();
      if (!neuron0(device)) return false;
      put(key, 11);
      put(key, device.has_index() ? device.index() : -1);  // ('neuron' and 'neuron:0' differ)
    } else {
      return false;
    }
  }
  return true;
}

// A CPU storage over a neuron storage's memory (trnsim's device memory is host memory),
// holding the neuron storage alive while the kernel runs without the GIL.
c10::Storage host_storage(const c10::Storage& storage) {
  auto* keep = new c10::Storage(storage);
  c10::DataPtr data(storage.mutable_data(), keep,
                    [](void* ctx) { delete static_cast<c10::Storage*>(ctx); },
                    c10::Device(c10::DeviceType::CPU));
  return c10::Storage(c10::Storage::use_byte_size_t(), storage.nbytes(), std::move(data),
                      nullptr, false);
}

// The CPU tensors of one call over its neuron tensors' memory: the same storage offset,
// sizes and strides (an op taking a storage_offset reads what Python's alias reads), and
// one CPU storage per neuron storage, so the CPU's kernel sees which arguments overlap
// (x[1:].copy_(x[:-1]) is refused as PyTorch refuses it).
struct HostAliases {
  const c10::StorageImpl* devices[kMostTensors];
  c10::Storage hosts[kMostTensors];
  int n = 0;

  at::Tensor of(const at::Tensor& t) {
    const c10::StorageImpl* device = t.storage().unsafeGetStorageImpl();
    int k = 0;
    while (k < n && devices[k] != device) ++k;
    if (k == n) {  // (the signature let at most kMostTensors tensors through)
      devices[n] = device;
      hosts[n++] = host_storage(t.storage());
    }
    auto impl = c10::make_intrusive<c10::TensorImpl>(
        c10::Storage(hosts[k]), c10::DispatchKeySet(c10::DispatchKey::CPU), t.dtype());
    impl->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
    return at::Tensor(std::move(impl));
  }

  bool over(const at::Tensor& t) const {  // (an output over an input's memory)
    const c10::StorageImpl* memory = t.storage().unsafeGetStorageImpl();
    for (int k = 0; k < n; ++k) {
      if (hosts[k].unsafeGetStorageImpl() == memory) return true;
    }
    return false;
  }
};

// What a neuron storage made here holds: the CPU storage whose memory it is and, once
// Python has adopted it (DeviceMemory.adopted: its HBM block, its host alias), Python's
// record of it, which the storage's death hands back to Python's release (the block freed),
// as a Python-made storage's weak reference does.
struct Adopted {
  c10::Storage host;
  PyObject* release = nullptr;  // (owned references, once adopted)
  PyObject* record = nullptr;

  void adopt(const py::object& release_fn, const py::handle& adopted) {
    release = release_fn.inc_ref().ptr();
    record = adopted.inc_ref().ptr();
  }
};

void drop(void* context) {
  auto* adopted = static_cast<Adopted*>(context);
  // (not once the interpreter is going away: nothing is left to account)
#if PY_VERSION_HEX >= 0x030D0000
  const bool finalizing = Py_IsFinalizing();
#else
  const bool finalizing = _Py_IsFinalizing();
#endif
  if (adopted->record != nullptr && Py_IsInitialized() && !finalizing) {
    PyGILState_STATE gil = PyGILState_Ensure();  // (a storage may die on any thread)
    PyObject *type, *value, *traceback;  // (it may die while an error is being raised)
    PyErr_Fetch(&type, &value, &traceback);
    PyObject* done = PyObject_CallOneArg(adopted->release, adopted->record);
    if (done == nullptr) {
      PyErr_WriteUnraisable(adopted->release);
    } else {
      Py_DECREF(done);
    }
    Py_DECREF(adopted->record);
    Py_DECREF(adopted->release);
    PyErr_Restore(type, value, traceback);
    PyGILState_Release(gil);
  }
  delete adopted;
}

// A neuron tensor over a CPU tensor's memory, holding its storage alive (`adopted`: where
// Python's record of it goes).
at::Tensor to_device(const at::Tensor& cpu, Adopted** adopted) {
  auto* context = new Adopted{cpu.storage()};
  *adopted = context;
  return at::for_blob(cpu.data_ptr(), cpu.sizes())
      .strides(cpu.strides())
      .context(context, &drop)
      .options(cpu.options().device(kNeuron))
      .target_device(kNeuron)
      .make_tensor();
}

// A neuron storage's key in Python's table of adopted memory (DeviceMemory.hosts): its
// address, or 0 when it has no bytes.
int64_t memory_key(const at::Tensor& t) {
  const c10::Storage& storage = t.storage();
  return storage.nbytes() ? reinterpret_cast<int64_t>(storage.data()) : 0;
}

py::object wrap(const at::Tensor& t) {
  return py::reinterpret_steal<py::object>(THPVariable_Wrap(t));
}

// The CPU's result conformed to the layout the graph declares, as Python's executor
// conforms it.
at::Tensor conformed(at::Tensor result, const Layout& declared) {
  if (result.sizes().vec() == declared.sizes && result.strides().vec() != declared.strides) {
    return at::empty_strided(declared.sizes, declared.strides, result.options()).copy_(result);
  }
  return result;
}

// What a served kernel raised, as Python would see it: its exception type's name and its
// message (fast._failed raises it as the Python door would).
std::pair<const char*, std::string> python_error(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  std::string message = c10_error ? c10_error->what_without_backtrace() : e.what();
  const char* kind = "RuntimeError";
  if (dynamic_cast<const c10::IndexError*>(&e)) {
    kind = "IndexError";
  } else if (dynamic_cast<const c10::ValueError*>(&e)) {
    kind = "ValueError";
  } else if (dynamic_cast<const c10::TypeError*>(&e)) {
    kind = "TypeError";
  } else if (dynamic_cast<const c10::NotImplementedError*>(&e)) {
    kind = "NotImplementedError";
  } else if (dynamic_cast<const c10::OutOfMemoryError*>(&e)) {
    kind = "OutOfMemoryError";
  }
  return {kind, std::move(message)};
}

// A warm call of an op returning new tensors, or writing its first argument (the GIL held;
// released while the kernel runs). An op returning new tensors runs first and is accounted
// after (Python may still refuse it: its door then runs it again, which only repeats the
// work). An op writing its first argument is accounted first (fast._may_write: a write
// cannot be taken back once made), its launch after; if its kernel fails, Python raises
// the error its door would (fast._failed), since running it again would write twice.
bool serve(State& s, const Fast& fast, const c10::OperatorHandle& op, Stack* stack, size_t n) {
  const c10::IValue* args = stack->data() + stack->size() - n;
  int64_t stream = kRefused;  // (an in-place op's launch, as _may_write answers)
  if (fast.writes) {
    if (n == 0 || !is_neuron(args[0])) return false;
    stream = s.may_write_cb(fast.token).cast<int64_t>();
    if (stream == kRefused) return false;
  }
  HostAliases aliases;
  Stack cpu;
  try {
    cpu.reserve(n);
    auto alias_of = [&](const at::Tensor& t) -> at::Tensor {
      return is_neuron(t) ? aliases.of(t) : t;
    };
    for (size_t i = 0; i < n; ++i) {
      const c10::IValue& v = args[i];
      if (v.isTensor()) {
        cpu.emplace_back(alias_of(v.toTensor()));
      } else if (v.isTensorList()) {
        c10::List<at::Tensor> list;
        for (const at::Tensor& t : v.toTensorList()) list.push_back(alias_of(t));
        cpu.emplace_back(std::move(list));
      } else if (v.isOptionalTensorList()) {
        c10::List<std::optional<at::Tensor>> list;
        for (const std::optional<at::Tensor>& t : v.toOptionalTensorList()) {
          list.push_back(t.has_value() ? std::optional<at::Tensor>(alias_of(*t)) : std::nullopt);
        }
        cpu.emplace_back(std::move(list));
      } else if (v.isDevice()) {  // (device memory is host memory: factories build on the CPU)
        cpu.emplace_back(c10::Device(c10::DeviceType::CPU));
      } else {
        cpu.push_back(v);
      }
    }
    {
      py::gil_scoped_release nogil;  // (as PyTorch's kernels run)
      op.callBoxed(&cpu);
    }
    if (fast.writes && (cpu.size() != 1 || !cpu[0].isTensor() ||
                        cpu[0].toTensor().storage().unsafeGetStorageImpl() !=
                            aliases.hosts[0].unsafeGetStorageImpl())) {
      throw std::runtime_error("an in-place op returned another tensor than its first argument");
    }
  } catch (const std::exception& e) {
    if (!fast.writes) return false;  // (Python's door runs it again, and raises its error)
    auto [kind, message] = python_error(e);
    s.failed_cb(fast.token, kind, message);  // (raises: py::error_already_set)
    throw;
  }
  if (fast.writes) {  // (it returns its first argument, written: the neuron tensor)
    if (stream == kLaunched) {
      s.wrote_cb(fast.token);
    } else {
      launch_on(fast, stream);
    }
    at::Tensor self = args[0].toTensor();
    torch::jit::drop(*stack, n);
    stack->emplace_back(std::move(self));
    return true;
  }
  c10::SmallVector<at::Tensor, 4> results;
  try {
    if (cpu.size() != fast.outputs.size()) return false;
    results.reserve(cpu.size());
    for (size_t k = 0; k < cpu.size(); ++k) {
      const bool made = cpu[k].isTensor() && cpu[k].toTensor().defined();
      if (fast.outputs[k].none) {  // (an output it does not make: none, as in Python)
        if (made || !(cpu[k].isNone() || cpu[k].isTensor())) return false;
        results.emplace_back();
        continue;
      }
      if (!made) return false;
      const at::Tensor& result = cpu[k].toTensor();
      // (an output over an input's memory, or over another output's, is no new tensor)
      if (aliases.over(result)) return false;
      for (const auto& other : results) {
        if (other.defined() &&
            result.storage().unsafeGetStorageImpl() == other.storage().unsafeGetStorageImpl()) {
          return false;
        }
      }
      results.push_back(conformed(result, fast.outputs[k]));
    }
  } catch (const std::exception&) {
    return false;
  }
  // Python's accounting: None if its door must take the call now (a recording, say), else
  // the launch's stream and its record of each output's memory; its errors (out of memory)
  // are the call's
  c10::SmallVector<at::Tensor, 4> outs;
  c10::SmallVector<Adopted*, 4> adopted(results.size(), nullptr);
  outs.reserve(results.size());
  for (size_t k = 0; k < results.size(); ++k) {
    outs.push_back(results[k].defined() ? to_device(results[k], &adopted[k]) : at::Tensor());
  }
  py::object answer;
  if (outs.size() == 1) {
    answer = s.served_cb(fast.token, wrap(results[0]), memory_key(outs[0]));
  } else {
    py::tuple hosts(results.size()), keys(outs.size());
    for (size_t k = 0; k < outs.size(); ++k) {
      hosts[k] = results[k].defined() ? wrap(results[k]) : py::object(py::none());
      keys[k] = outs[k].defined() ? py::object(py::int_(memory_key(outs[k]))) : py::object(py::none());
    }
    answer = s.served_many_cb(fast.token, hosts, keys);
  }
  if (answer.is_none()) return false;
  const auto accounted = answer.cast<py::tuple>();
  if (outs.size() == 1) {
    if (adopted[0] != nullptr) adopted[0]->adopt(fast.launch.release, accounted[1]);
  } else {
    const auto records = accounted[1].cast<py::tuple>();
    for (size_t k = 0; k < outs.size(); ++k) {
      if (adopted[k] != nullptr) adopted[k]->adopt(fast.launch.release, records[k]);
    }
  }
  launch_on(fast, accounted[0].cast<int64_t>());
  torch::jit::drop(*stack, n);
  for (auto& out : outs) stack->emplace_back(std::move(out));
  return true;
}

// Larger allocations go to Python, which takes the simulated HBM before the host memory (a
// tensor the device cannot hold is its OutOfMemoryError, not the host's).
constexpr int64_t kLargestServedEmpty = int64_t(64) << 20;

// empty.memory_format(size, *, dtype, layout, device, pin_memory, memory_format) or
// empty_strided(size, stride, *, dtype, layout, device, pin_memory) of a strided tensor on
// neuron:0, contiguous unless strides are given: the host memory made here (as Python's
// door makes it: the CPU's empty_strided, NaN-filled under deterministic algorithms), the
// HBM block and its adoption in Python (fast._made). False: Python's door makes it.
bool serve_empty(State& s, Stack* stack, bool strided) {
  const c10::IValue* a = stack->data() + stack->size() - 6;
  if (!a[0].isIntList() || (strided && !a[1].isIntList())) return false;
  const c10::IValue* opts = a + (strided ? 2 : 1);  // dtype, layout, device, pin_memory...
  if (!opts[0].isNone() && !opts[0].isInt()) return false;
  if (!opts[1].isNone() && opts[1].toLayout() != c10::kStrided) return false;
  if (!opts[2].isNone() && !(opts[2].isDevice() && neuron0(opts[2].toDevice()))) return false;
  if (!opts[3].isNone() && opts[3].toBool()) return false;
  if (!strided && !opts[4].isNone() &&
      opts[4].toMemoryFormat() != c10::MemoryFormat::Contiguous &&
      opts[4].toMemoryFormat() != c10::MemoryFormat::Preserve) {
    return false;
  }
  const std::vector<int64_t> sizes = a[0].toIntVector();
  std::vector<int64_t> strides;
  if (strided) {
    strides = a[1].toIntVector();
    if (strides.size() != sizes.size()) return false;
  } else {
    const auto contiguous = c10::contiguous_strides(sizes);
    strides.assign(contiguous.begin(), contiguous.end());
  }
  const at::ScalarType dtype = opts[0].isNone() ? c10::typeMetaToScalarType(at::get_default_dtype())
                                                : opts[0].toScalarType();
  int64_t span = 1;  // (the elements it addresses; none when a dimension is 0)
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] < 0 || strides[d] < 0) return false;
    if (sizes[d] == 0) span = 0;
  }
  int64_t nbytes = 0;
  if (span) {
    for (size_t d = 0; d < sizes.size(); ++d) {
      int64_t reach = 0;
      if (__builtin_mul_overflow(sizes[d] - 1, strides[d], &reach) ||
          __builtin_add_overflow(span, reach, &span)) {
        return false;  // (Python's door says what is wrong with it)
      }
    }
    if (__builtin_mul_overflow(span, static_cast<int64_t>(c10::elementSize(dtype)), &nbytes)) {
      return false;
    }
  }
  if (nbytes > kLargestServedEmpty) return false;
  at::Tensor host, out;
  Adopted* adopted = nullptr;
  try {
    host = at::empty_strided(sizes, strides, at::TensorOptions().dtype(dtype));
    out = to_device(host, &adopted);
  } catch (const std::exception&) {
    return false;  // (Python's door makes it, and raises its own error)
  }
  // Python's accounting: None, or its release and its record of the memory (its errors,
  // out of memory, are the call's)
  py::object answer = s.made_cb(wrap(host), memory_key(out), nbytes);
  if (answer.is_none()) return false;
  const auto accounted = answer.cast<py::tuple>();
  adopted->adopt(accounted[0], accounted[1]);
  torch::jit::drop(*stack, 6);
  stack->emplace_back(std::move(out));
  return true;
}

// The boxed kernel registered under PrivateUse1.
void door(const c10::OperatorHandle& op, c10::DispatchKeySet, Stack* stack) {
  State& s = state();
  if (!s.on) {
    op.redispatchBoxed(kPythonDoor, stack);
    return;
  }
  const c10::FunctionSchema* schema = &op.schema();
  const size_t n = schema->arguments().size();
  const c10::IValue* args = stack->data() + stack->size() - n;
  std::string key;
  bool keyed = false;
  bool view = false;
  // The call as it is keyed, served and offered: itself, or for _copy_from(src, dst,
  // non_blocking) between two neuron tensors, copy_(dst, src, non_blocking), which is what
  // Python's door runs for it (any other _copy_from is a host-device copy: Python's).
  const c10::OperatorHandle* as = &op;
  Stack copy;
  Stack* call = stack;
  size_t call_n = n;
  {
    py::gil_scoped_acquire gil;
    if (schema == s.empty || schema == s.empty_strided) {
      if (serve_empty(s, stack, schema == s.empty_strided)) {
        ++s.served;
        return;
      }
    } else if (s.views.count(schema)) {
      // a view op: Python agrees (no recording wants it; it counts the call)
      view = s.view().cast<bool>();
    } else if (schema != s.copy_from ||
               (is_neuron(args[0]) && is_neuron(args[1]) && args[2].isBool())) {
      if (schema == s.copy_from) {
        copy = {args[1], args[0], args[2]};
        as = &*s.copy;
        call = &copy;
        call_n = 3;
      }
      keyed = signature(*as, call->data() + call->size() - call_n, call_n, key);
      auto found = keyed ? s.table.find(key) : s.table.end();
      std::shared_ptr<const Fast> fast;
      if (found != s.table.end()) fast = found->second;
      if (fast && serve(s, *fast, *as, call, call_n)) {
        if (call != stack) {  // (_copy_from returns what copy_ wrote: dst)
          at::Tensor written = copy.back().toTensor();
          torch::jit::drop(*stack, n);
          stack->emplace_back(std::move(written));
        }
        ++s.served;
        return;
      }
    }
  }
  if (view) {  // the Meta kernel makes the view over the same storage
    op.redispatchBoxed(kMeta, stack);
    ++s.served;
    return;
  }
  ++s.handed_on;
  Offer offer;
  offer.op = as;
  Offer* outer = current_offer;
  current_offer = &offer;
  try {
    op.redispatchBoxed(kPythonDoor, stack);
  } catch (...) {
    current_offer = outer;
    if (offer.made) {
      py::gil_scoped_acquire gil;
      offer.token = py::object();
      offer.launch = Launch();
    }
    throw;
  }
  current_offer = outer;
  if (!offer.made) return;
  py::gil_scoped_acquire gil;
  if (offer.view) {
    s.views.insert(&op.schema());
  } else if (keyed) {
    s.table[key] = std::make_shared<const Fast>(Fast{std::move(offer.token),
                                                     std::move(offer.outputs), offer.writes,
                                                     std::move(offer.launch)});
  }
  offer.token = py::object();
  offer.launch = Launch();
}

// The device guard of PrivateUse1: PyTorch's guard for a Python backend
// (torch._C._acc.DeviceGuard) with its type in C++. Every one of its answers is a constant
// (one device, index 0; the default stream; events that are always done), but each asks
// Python for the device type first: about a microsecond, twice per autograd node made and
// several times per node run backward.
struct Guard final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return c10::DeviceType::PrivateUse1; }
  c10::Device exchangeDevice(c10::Device) const override { return getDevice(); }
  c10::Device getDevice() const override { return kNeuron; }
  void setDevice(c10::Device) const override {}
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, kNeuron);
  }
  c10::Stream getNewStream(c10::Device, int) const override {
    return c10::Stream(c10::Stream::DEFAULT, kNeuron);
  }
  c10::Stream exchangeStream(c10::Stream) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, kNeuron);
  }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }
  void record(void**, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag)
      const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
};

}  // namespace

// -- what Python calls (client/door/fast.py) ------------------------------------------------
void install(py::object served, py::object served_many, py::object may_write, py::object wrote,
             py::object failed, py::object view, py::object made) {
  State& s = state();
  s.served_cb = std::move(served);
  s.served_many_cb = std::move(served_many);
  s.may_write_cb = std::move(may_write);
  s.failed_cb = std::move(failed);
  s.made_cb = std::move(made);
  auto& dispatcher = c10::Dispatcher::singleton();
  s.empty = &dispatcher.findSchemaOrThrow("aten::empty", "memory_format").schema();
  s.empty_strided = &dispatcher.findSchemaOrThrow("aten::empty_strided", "").schema();
  s.copy_from = &dispatcher.findSchemaOrThrow("aten::_copy_from", "").schema();
  s.copy = dispatcher.findSchemaOrThrow("aten::copy_", "");
  s.wrote_cb = std::move(wrote);
  s.view = std::move(view);
}

// Registers the door under PrivateUse1: for the named ops, or as the fallback of every op.
void register_door(const std::vector<std::string>& names, bool fallback) {
  auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, fallback ? "_" : "aten",
                                              c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  if (fallback) {
    lib->fallback(torch::CppFunction::makeFromBoxedFunction<&door>());
  } else {
    for (const auto& name : names) {
      lib->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&door>());
    }
  }
  state().libraries.push_back(std::move(lib));
}

void set_on(bool on) { state().on = on; }

// Replaces the Python backend's device guard with the same answers given in C++.
void install_guard() {
  static Guard* guard = new Guard();  // (never destroyed: guards outlive every tensor)
  c10::impl::registerDeviceGuard(c10::DeviceType::PrivateUse1, guard);
}

// Called by Python's door while it runs a call this door handed on: serve its signature here
// from now on (token: what the callbacks receive; each new output's declared sizes and
// strides, none for an in-place op; the runtime's timeline, the executable's cost and the
// modelled dispatch time its launches take).
// (`name`: the op Python ran, which must be the call this door handed on: a Python kernel
// reached another way, a custom op's, offers nothing)
bool offered_for(const Offer* o, const std::string& name) {
  if (o == nullptr) return false;
  const c10::OperatorName& op = o->op->operator_name();
  return name == op.name + "." + (op.overload_name.empty() ? "default" : op.overload_name);
}

void offer(
    const std::string& name, py::object token,
    const std::vector<std::tuple<std::vector<int64_t>, std::vector<int64_t>, bool>>& outputs,
    bool writes, py::object timeline, py::object cost, int64_t dispatch_ns, py::object release) {
  Offer* o = current_offer;
  if (!offered_for(o, name) || (outputs.empty() != writes)) return;
  o->writes = writes;
  o->token = std::move(token);
  o->launch.timeline = reinterpret_cast<trnsim::Timeline*>(timeline.attr("address")().cast<uintptr_t>());
  o->launch.cost = reinterpret_cast<const trnsim::Cost*>(cost.attr("address")().cast<uintptr_t>());
  o->launch.timeline_object = std::move(timeline);
  o->launch.cost_object = std::move(cost);
  o->launch.dispatch_ns = dispatch_ns;
  o->launch.release = std::move(release);
  o->outputs.clear();
  for (const auto& [sizes, strides, none] : outputs) {
    o->outputs.push_back(Layout{sizes, strides, none});
  }
  o->made = true;
}

void offer_view(const std::string& name) {
  Offer* o = current_offer;
  if (!offered_for(o, name)) return;
  o->view = true;
  o->made = true;
}

// A neuron tensor over a CPU tensor's memory, made as the door makes its outputs (Python's
// door makes its own with it: client/core/memory.py), or None for one it cannot alias
// plainly (conjugate or negative views, non-strided layouts): DLPack's answer, then.
py::object device_of(const at::Tensor& cpu) {
  if (cpu.layout() != c10::kStrided || cpu.is_conj() || cpu.is_neg() || !cpu.is_cpu()) {
    return py::none();
  }
  Adopted* adopted = nullptr;
  return wrap(to_device(cpu, &adopted));
}

// Adopts a neuron tensor's memory made by device_of (or by this door): its storage's death
// calls release(record). Its key in Python's table (memory_key), or -1 for memory made
// another way, or adopted already.
int64_t adopt(const at::Tensor& device, py::object release, py::object record) {
  const c10::DataPtr& memory = device.storage().data_ptr();
  if (memory.get_deleter() != &drop) return -1;
  auto* adopted = static_cast<Adopted*>(memory.get_context());
  if (adopted->record != nullptr) return -1;
  adopted->adopt(release, record);
  return memory_key(device);
}

void clear() {
  State& s = state();
  s.table.clear();
  s.views.clear();
}

py::dict stats() {
  State& s = state();
  py::dict d;
  d["served"] = s.served.load();
  d["handed_on"] = s.handed_on.load();
  d["signatures"] = s.table.size();
  d["view_ops"] = s.views.size();
  return d;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "trnsim's C++ door (client/door/fast.py)";
  m.def("install", &install);
  m.def("register_door", &register_door);
  m.def("set_on", &set_on);
  m.def("install_guard", &install_guard);
  m.def("offer", &offer);
  m.def("offer_view", &offer_view);
  m.def("clear", &clear);
  m.def("device_of", &device_of);
  m.def("adopt", &adopt);
  m.def("stats", &stats);
}
