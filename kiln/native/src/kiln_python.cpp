// kiln's door from Python into C++ wrappers (kiln/native/python_door.py): a CPython extension, so
// a graph call turns Python tensors into wrapper handles and back without ctypes or capsules.
//
//   GraphCall(entry, error, num_outputs, share=0, release=0)(*tensors) -> tuple of num_outputs tensors
//       entry: the address of a wrapper's `int kiln_graph_call(kiln_tensor* inputs, kiln_tensor* outputs)`,
//       error: of `const char* kiln_error(void)`. A status of 2 raises IndexError, any other RuntimeError.
//       share, release: the runtime's kiln_share and kiln_release, which make and release the
//       handles from the blocks it keeps (0: operator new and delete, as torch's handles are made).
//       The GIL is released while the wrapper runs when its inputs add up to kReleaseGilBytes or more:
//       taking it back costs ~0.3 us, a fair share of a call over a few kilobytes.
//   GraphCall.bind(tensors) -> GraphCall
//       the same entry, `tensors` appended to every call's inputs: a frozen graph's constants (a
//       decode step's ~500) bound once, not passed through Python and converted on every call.
//   TensorCheck(type, dtype, device, dim, sizes, strides, requires_grad, storage_offset=None)(value) -> bool
//       a guard's tensor match in one C call: type(value) is type (exactly), and its dtype,
//       device, dimensions, sizes and strides (None: any; an item None: that one any) and
//       requires_grad are these, and its storage offset where one is given. A dynamic input's
//       check takes its static sizes, strides and offset (its shape guards' `x.size()[0] == 1`:
//       a decode step's KV cache has ~500 of them, ~0.15 us each in Python).
//   DirectOp(op, call, error, num_outputs, names, defaults)(*args, **kwargs) -> Tensor or tuple
//       one of kiln's C++ operators (kiln::mm, kiln::conv, ...; kiln_runtime.cpp KILN_OPERATOR)
//       as a C++ wrapper calls it: `op` from the runtime's kiln_find_op, `call` the address of its
//       kiln_call_op; the arguments bound to the schema's `names` (the last ones may take
//       `defaults`), tensors handed over borrowed. Compiled graphs' Python wrappers and the
//       autotuner call kiln's operators through it: ~0.5 us, against ~5 us through the dispatcher.
//   stamp(tensors, expected=None) -> bytes, or bool
//       each tensor's identity (its TensorImpl), version counter and data pointer: two stamps are
//       equal when no tensor was replaced, written in place or rebound to other memory. With
//       `expected` (a stamp): whether the tensors' stamp is it, the stamp itself never made.
//   alias_pattern(values, by_storage, expected=None) -> tuple of ints, or bool
//       kiln/capture/guards.py `alias_pattern` in one C loop: for each value the index of the first
//       that is the same object; with `by_storage` (tensors only) then, for each, the index of the
//       first on the same device whose storage has the same data pointer and whose span of bytes
//       (first element to last) overlaps its own (an empty tensor: its own).
//       An aliasing guard checks it on every call of a graph that writes its inputs (a decode
//       step's KV cache: ~40 tensors, ~25 us in Python when the step's weights left the caches cold).
//       With `expected` (a tuple): whether the pattern is it, the pattern itself never made.
//   greedy_tokens(logits) -> Tensor or None
//       torch.argmax(logits, -1) of a CPU float32 (batch, vocabulary) tensor whose rows are
//       contiguous, as int64: the first index of each row's largest value, or of its first NaN;
//       of a (batch, positions, vocabulary) tensor, its last position's (logits[:, -1]).
//       Two vectorized passes over the row (its largest value, then where it first is); ATen's
//       argmax keeps an index beside every compared value, ~130 us over Qwen2's 151936 logits on
//       2 cores of an AMD EPYC where a sum takes 8. None for any other tensor (the caller asks ATen).
//       `column` true: the tokens as a (batch, 1) column, the shape a decoding loop appends.
//   successor(t) -> Tensor or None
//       t + 1 of a CPU int64 tensor of unit-stride rows and at most 64 elements (a decode step's
//       next position ids), a new contiguous tensor made without the dispatcher; None for any other.
//   views_of(bases, size, stride, offset) -> list of tensors, or None
//       [base.as_strided(size, stride, offset) for base in bases] in one C loop, where every base
//       is a torch.Tensor (not a subclass, whose as_strided may be its own: None then). A decode
//       step hands its KV cache back as two views per layer (kiln/aot/call_wrappers.py
//       AliasRestorer): ~5 us a view through Python when the step's weights left the caches cold.
//   swap_storage_memory(a, b) -> None
//       two torch.UntypedStorage exchange their memory (data pointer, deleter, size): what
//       torch's `UntypedStorage._swap_data_ptr_` does where torch has it (2.11 has not); a CUDA
//       graph's outputs the caller still holds move off the recording's memory with it
//       (kiln/runtime/replay_outputs.py).
//   Watch()() -> bool
//       whether the dicts, instance dicts and closure cells handed to its last `record(dicts,
//       owners, cells)` are unchanged since (each dict's version, each (owner, dict) pair's
//       `owner.__dict__ is dict` with the same keys and values, each cell's contents, by
//       identity), once `arm()` followed the record. Guards whose truth these contents decide are skipped while it holds
//       (kiln/capture/guards.py); `dict_versions` is False where dicts' changes cannot be followed.
//
// Built once per machine, compiler, Python and torch, against the wheel's headers and
// libtorch_python (kiln/native/python_door.py).

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/Storage.h>
#include <ATen/ops/empty.h>  // (torch 2.11's headers above do not bring at::empty)

#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

typedef int (*EntryFn)(void**, void**);
typedef const char* (*ErrorFn)(void);
typedef void* (*ShareFn)(void*);
typedef void (*ReleaseFn)(void*);

void* share_by_new(void* tensor) { return new at::Tensor(*static_cast<const at::Tensor*>(tensor)); }
void release_by_delete(void* handle) { delete static_cast<at::Tensor*>(handle); }

struct GraphCall {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  EntryFn entry;
  ErrorFn error;
  Py_ssize_t num_outputs;
  ShareFn share;  // another handle to a tensor (its argument a borrowed one: an at::Tensor*)
  ReleaseFn release;
  // The trailing inputs `bind` fixed (a frozen graph's constants), held from C++ so that a call
  // neither passes them through Python nor moves their Python objects' counts; null when none.
  std::vector<at::Tensor>* tail;
  int64_t tail_bytes;
};

// A call whose inputs (weights included) add up to less runs with the GIL held: it takes
// microseconds, and releasing and re-taking the GIL would add ~0.3 us to it.
constexpr int64_t kReleaseGilBytes = 64 << 10;

// Handles live on the stack for graphs of up to this many inputs and outputs (a BERT-base graph
// has ~200 inputs with its weights); larger ones in a block the thread keeps for its next call (a
// decode step's ~560 inputs: from malloc, 4.5 KB a call that had glibc consolidate the small
// chunks freed since first), or, where a call further up the thread's stack holds that block (an
// operator calling back into a compiled graph), from the heap.
constexpr Py_ssize_t kStackHandles = 256;

struct KeptHandles {
  std::unique_ptr<void*[]> block;
  Py_ssize_t size = 0;
  bool busy = false;
};
thread_local KeptHandles kept_handles;

struct Handles {
  void* stack[kStackHandles];
  void** data;
  bool kept = false;
  explicit Handles(Py_ssize_t n) : data(stack) {
    if (n <= kStackHandles) return;
    if (kept_handles.busy) {
      data = new (std::nothrow) void*[n];
      return;
    }
    if (kept_handles.size < n) {
      kept_handles.block.reset(new (std::nothrow) void*[n]);
      kept_handles.size = kept_handles.block ? n : 0;
    }
    data = kept_handles.block.get();
    kept = kept_handles.busy = data != nullptr;
  }
  ~Handles() {
    if (kept) kept_handles.busy = false;
    else if (data != stack) delete[] data;
  }
};

// While a wrapper runs without the GIL, one more reference to each input's TensorImpl, dropped
// after it with the GIL held. A Python tensor's TensorImpl keeps its Python object alive while
// C++ holds it too (torch's intrusive_ptr: a count going 2 -> 1 decrefs the object, taking the
// GIL): the wrapper releases each input where it is done with it, and without this each of a
// decode step's ~600 inputs (weights, KV cache) took the GIL back once in the middle of the
// graph. The caller's arguments keep the inputs alive to the call's end anyway, so holding them
// frees nothing later.
struct HeldInputs {
  at::Tensor stack[kStackHandles];
  at::Tensor* data;
  explicit HeldInputs(Py_ssize_t n) : data(n <= kStackHandles ? stack : new (std::nothrow) at::Tensor[n]) {}
  ~HeldInputs() { if (data != stack) delete[] data; }
};

PyObject* graph_call_vectorcall(PyObject* callable, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* self = reinterpret_cast<GraphCall*>(callable);
  if (kwnames != nullptr && PyTuple_GET_SIZE(kwnames) != 0) {
    PyErr_SetString(PyExc_TypeError, "a kiln graph call takes its tensors by position");
    return nullptr;
  }
  Py_ssize_t n = PyVectorcall_NARGS(nargsf);
  const Py_ssize_t tail = self->tail != nullptr ? static_cast<Py_ssize_t>(self->tail->size()) : 0;
  Handles inputs(n + tail), outputs(self->num_outputs);
  if (inputs.data == nullptr || outputs.data == nullptr) return PyErr_NoMemory();
  int64_t input_bytes = self->tail_bytes;
  for (Py_ssize_t k = 0; k < n; ++k) {
    if (!THPVariable_Check(args[k])) {
      for (Py_ssize_t j = 0; j < k; ++j) self->release(inputs.data[j]);
      PyErr_Format(PyExc_TypeError, "a kiln graph call takes tensors; input %zd is %s", k, Py_TYPE(args[k])->tp_name);
      return nullptr;
    }
    // A new owned handle per input: the wrapper releases its inputs when it is done with them.
    const at::Tensor& tensor = THPVariable_Unpack(args[k]);
    input_bytes += tensor.has_storage() ? static_cast<int64_t>(tensor.nbytes()) : 0;
    inputs.data[k] = self->share(const_cast<at::Tensor*>(&tensor));
  }
  for (Py_ssize_t j = 0; j < tail; ++j) inputs.data[n + j] = self->share(&(*self->tail)[j]);
  for (Py_ssize_t k = 0; k < self->num_outputs; ++k) outputs.data[k] = nullptr;
  int status;
  if (input_bytes >= kReleaseGilBytes) {
    HeldInputs held(n);
    if (held.data == nullptr) {
      for (Py_ssize_t k = 0; k < n + tail; ++k) self->release(inputs.data[k]);
      return PyErr_NoMemory();
    }
    for (Py_ssize_t k = 0; k < n; ++k) held.data[k] = *static_cast<at::Tensor*>(inputs.data[k]);
    Py_BEGIN_ALLOW_THREADS
    status = self->entry(inputs.data, outputs.data);
    Py_END_ALLOW_THREADS
  } else {
    status = self->entry(inputs.data, outputs.data);
  }
  if (status != 0) {
    PyErr_SetString(status == 2 ? PyExc_IndexError : PyExc_RuntimeError, self->error());
    return nullptr;
  }
  PyObject* result = PyTuple_New(self->num_outputs);
  for (Py_ssize_t k = 0; k < self->num_outputs; ++k) {
    auto* tensor = static_cast<at::Tensor*>(outputs.data[k]);
    PyObject* wrapped = result != nullptr ? THPVariable_Wrap(std::move(*tensor)) : nullptr;
    self->release(tensor);
    if (result != nullptr) {
      if (wrapped == nullptr) Py_CLEAR(result);
      else PyTuple_SET_ITEM(result, k, wrapped);
    }
  }
  return result;
}

PyObject* graph_call_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  unsigned long long entry = 0, error = 0, share = 0, release = 0;
  Py_ssize_t num_outputs = 0;
  static const char* names[] = {"entry", "error", "num_outputs", "share", "release", nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "KKn|KK", const_cast<char**>(names), &entry, &error, &num_outputs,
                                   &share, &release))
    return nullptr;
  if ((share == 0) != (release == 0)) {
    PyErr_SetString(PyExc_ValueError, "GraphCall: share and release are given together (or neither)");
    return nullptr;
  }
  if (entry == 0 || error == 0 || num_outputs < 0) {
    PyErr_SetString(PyExc_ValueError, "GraphCall: entry and error must be function addresses, num_outputs >= 0");
    return nullptr;
  }
  auto* self = reinterpret_cast<GraphCall*>(type->tp_alloc(type, 0));
  if (self == nullptr) return nullptr;
  self->vectorcall = graph_call_vectorcall;
  self->entry = reinterpret_cast<EntryFn>(static_cast<uintptr_t>(entry));
  self->error = reinterpret_cast<ErrorFn>(static_cast<uintptr_t>(error));
  self->num_outputs = num_outputs;
  self->share = share != 0 ? reinterpret_cast<ShareFn>(static_cast<uintptr_t>(share)) : share_by_new;
  self->release = release != 0 ? reinterpret_cast<ReleaseFn>(static_cast<uintptr_t>(release)) : release_by_delete;
  return reinterpret_cast<PyObject*>(self);
}

PyTypeObject GraphCallType = {PyVarObject_HEAD_INIT(nullptr, 0)};

void graph_call_dealloc(PyObject* object) {
  delete reinterpret_cast<GraphCall*>(object)->tail;
  Py_TYPE(object)->tp_free(object);
}

// GraphCall.bind(tensors): the same entry with `tensors` as its last inputs from now on.
PyObject* graph_call_bind(PyObject* object, PyObject* tensors) {
  auto* self = reinterpret_cast<GraphCall*>(object);
  PyObject* items = PySequence_Fast(tensors, "GraphCall.bind takes a sequence of tensors");
  if (items == nullptr) return nullptr;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(items);
  auto tail = std::make_unique<std::vector<at::Tensor>>();
  tail->reserve(self->tail != nullptr ? self->tail->size() + n : n);
  int64_t bytes = self->tail_bytes;
  for (Py_ssize_t k = 0; k < n; ++k) {
    PyObject* item = PySequence_Fast_GET_ITEM(items, k);
    if (!THPVariable_Check(item)) {
      PyErr_Format(PyExc_TypeError, "GraphCall.bind takes tensors; item %zd is %s", k, Py_TYPE(item)->tp_name);
      Py_DECREF(items);
      return nullptr;
    }
    const at::Tensor& tensor = THPVariable_Unpack(item);
    bytes += tensor.has_storage() ? static_cast<int64_t>(tensor.nbytes()) : 0;
    tail->push_back(tensor);
  }
  Py_DECREF(items);
  // (Bound again: `bind(b)` of a call bound to `a` calls it with b before a, as Python's
  // `lambda *head: call(*head, *b)` would.)
  if (self->tail != nullptr) tail->insert(tail->end(), self->tail->begin(), self->tail->end());
  auto* bound = reinterpret_cast<GraphCall*>(GraphCallType.tp_alloc(&GraphCallType, 0));
  if (bound == nullptr) return nullptr;
  bound->vectorcall = graph_call_vectorcall;
  bound->entry = self->entry;
  bound->error = self->error;
  bound->num_outputs = self->num_outputs;
  bound->share = self->share;
  bound->release = self->release;
  bound->tail = tail.release();
  bound->tail_bytes = bytes;
  return reinterpret_cast<PyObject*>(bound);
}

PyMethodDef graph_call_methods[] = {
    {"bind", graph_call_bind, METH_O, "The same entry with these tensors as its last inputs on every call."},
    {nullptr, nullptr, 0, nullptr},
};

// ---- DirectOp: one of kiln's C++ operators called from Python without the dispatcher ----------

typedef int (*CallOpFn)(void*, const kiln_arg*, int64_t, kiln_tensor*, int64_t);

struct DirectOp {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  void* op;  // the runtime's kiln_find_op of the operator
  CallOpFn call;
  ErrorFn error;
  Py_ssize_t num_outputs;
  PyObject* names;     // owned: the schema's argument names, a tuple of str
  PyObject* defaults;  // owned: the defaults of the last len(defaults) arguments
};

// Lists' elements live here for the length of one call.
using ListItems = std::vector<std::unique_ptr<kiln_arg[]>>;

// `object` as a kiln_arg: a tensor (borrowed: the Python object keeps it alive during the call),
// None, a bool, an int, a float, a str, or a list or tuple of these; false with an error set
// otherwise. `bytes` adds up the tensors' sizes.
bool to_arg(PyObject* object, kiln_arg& arg, ListItems& lists, int64_t& bytes) {
  arg = kiln_arg{};
  if (object == Py_None) {
    arg.kind = KILN_NONE;
  } else if (THPVariable_Check(object)) {
    const at::Tensor& tensor = THPVariable_Unpack(object);
    arg.kind = KILN_TENSOR;
    arg.p = &tensor;
    bytes += tensor.has_storage() ? static_cast<int64_t>(tensor.nbytes()) : 0;
  } else if (PyBool_Check(object)) {
    arg.kind = KILN_BOOL;
    arg.i = object == Py_True;
  } else if (PyLong_Check(object)) {
    arg.kind = KILN_INT;
    arg.i = PyLong_AsLongLong(object);
    if (arg.i == -1 && PyErr_Occurred()) return false;
  } else if (PyFloat_Check(object)) {
    arg.kind = KILN_DOUBLE;
    arg.d = PyFloat_AS_DOUBLE(object);
  } else if (PyUnicode_Check(object)) {
    arg.kind = KILN_STRING;
    arg.p = PyUnicode_AsUTF8(object);
    if (arg.p == nullptr) return false;
  } else if (PyList_Check(object) || PyTuple_Check(object)) {
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(object);
    PyObject** items = PySequence_Fast_ITEMS(object);
    lists.emplace_back(new kiln_arg[n > 0 ? n : 1]);
    kiln_arg* elements = lists.back().get();
    for (Py_ssize_t k = 0; k < n; ++k)
      if (!to_arg(items[k], elements[k], lists, bytes)) return false;
    arg.kind = KILN_LIST;
    arg.p = elements;
    arg.n = n;
  } else {
    PyErr_Format(PyExc_TypeError, "a kiln operator takes tensors, numbers, strings and lists of them, not %s",
                 Py_TYPE(object)->tp_name);
    return false;
  }
  return true;
}

// The schema's arguments in order: by position, by name, else their defaults.
bool bind_arguments(const DirectOp* self, PyObject* const* args, Py_ssize_t npositional, PyObject* kwnames,
                    std::vector<PyObject*>& bound) {
  const Py_ssize_t n = PyTuple_GET_SIZE(self->names), ndefaults = PyTuple_GET_SIZE(self->defaults);
  if (npositional > n) {
    PyErr_Format(PyExc_TypeError, "a kiln operator of %zd arguments given %zd", n, npositional);
    return false;
  }
  bound.assign(n, nullptr);
  for (Py_ssize_t k = 0; k < npositional; ++k) bound[k] = args[k];
  const Py_ssize_t nkw = kwnames != nullptr ? PyTuple_GET_SIZE(kwnames) : 0;
  for (Py_ssize_t j = 0; j < nkw; ++j) {
    PyObject* key = PyTuple_GET_ITEM(kwnames, j);
    Py_ssize_t k = 0;
    while (k < n && PyUnicode_Compare(PyTuple_GET_ITEM(self->names, k), key) != 0) ++k;
    if (k == n || bound[k] != nullptr) {
      PyErr_Format(PyExc_TypeError, "a kiln operator given %s argument %U", k == n ? "an unknown" : "a repeated", key);
      return false;
    }
    bound[k] = args[npositional + j];
  }
  for (Py_ssize_t k = 0; k < n; ++k) {
    if (bound[k] != nullptr) continue;
    if (k < n - ndefaults) {
      PyErr_Format(PyExc_TypeError, "a kiln operator's argument %U is missing", PyTuple_GET_ITEM(self->names, k));
      return false;
    }
    bound[k] = PyTuple_GET_ITEM(self->defaults, k - (n - ndefaults));
  }
  return true;
}

PyObject* direct_op_vectorcall(PyObject* callable, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* self = reinterpret_cast<DirectOp*>(callable);
  std::vector<PyObject*> bound;
  if (!bind_arguments(self, args, PyVectorcall_NARGS(nargsf), kwnames, bound)) return nullptr;
  std::vector<kiln_arg> arguments(bound.size());
  ListItems lists;
  int64_t bytes = 0;
  for (size_t k = 0; k < bound.size(); ++k)
    if (!to_arg(bound[k], arguments[k], lists, bytes)) return nullptr;
  Handles outputs(self->num_outputs);
  if (outputs.data == nullptr) return PyErr_NoMemory();
  int status;
  if (bytes >= kReleaseGilBytes) {
    Py_BEGIN_ALLOW_THREADS
    status = self->call(self->op, arguments.data(), static_cast<int64_t>(arguments.size()), outputs.data,
                        self->num_outputs);
    Py_END_ALLOW_THREADS
  } else {
    status = self->call(self->op, arguments.data(), static_cast<int64_t>(arguments.size()), outputs.data,
                        self->num_outputs);
  }
  if (status != 0) {
    PyErr_SetString(PyExc_RuntimeError, self->error());
    return nullptr;
  }
  auto wrap = [](void* handle) -> PyObject* {
    if (handle == nullptr) Py_RETURN_NONE;
    auto* tensor = static_cast<at::Tensor*>(handle);
    PyObject* wrapped = THPVariable_Wrap(std::move(*tensor));
    delete tensor;
    return wrapped;
  };
  if (self->num_outputs == 1) return wrap(outputs.data[0]);
  PyObject* result = PyTuple_New(self->num_outputs);
  for (Py_ssize_t k = 0; k < self->num_outputs; ++k) {
    PyObject* wrapped = wrap(outputs.data[k]);
    if (result == nullptr || wrapped == nullptr) {
      Py_XDECREF(wrapped);
      Py_CLEAR(result);
      continue;
    }
    PyTuple_SET_ITEM(result, k, wrapped);
  }
  return result;
}

PyObject* direct_op_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  unsigned long long op = 0, call = 0, error = 0;
  Py_ssize_t num_outputs = 0;
  PyObject *names, *defaults;
  static const char* keywords[] = {"op", "call", "error", "num_outputs", "names", "defaults", nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "KKKnO!O!", const_cast<char**>(keywords), &op, &call, &error,
                                   &num_outputs, &PyTuple_Type, &names, &PyTuple_Type, &defaults))
    return nullptr;
  if (op == 0 || call == 0 || error == 0 || num_outputs < 1 || PyTuple_GET_SIZE(defaults) > PyTuple_GET_SIZE(names)) {
    PyErr_SetString(PyExc_ValueError, "DirectOp: op, call and error must be addresses, num_outputs >= 1, "
                                      "no more defaults than names");
    return nullptr;
  }
  auto* self = reinterpret_cast<DirectOp*>(type->tp_alloc(type, 0));
  if (self == nullptr) return nullptr;
  self->vectorcall = direct_op_vectorcall;
  self->op = reinterpret_cast<void*>(static_cast<uintptr_t>(op));
  self->call = reinterpret_cast<CallOpFn>(static_cast<uintptr_t>(call));
  self->error = reinterpret_cast<ErrorFn>(static_cast<uintptr_t>(error));
  self->num_outputs = num_outputs;
  Py_INCREF(names);
  Py_INCREF(defaults);
  self->names = names;
  self->defaults = defaults;
  return reinterpret_cast<PyObject*>(self);
}

void direct_op_dealloc(PyObject* object) {
  auto* self = reinterpret_cast<DirectOp*>(object);
  Py_XDECREF(self->names);
  Py_XDECREF(self->defaults);
  Py_TYPE(object)->tp_free(object);
}

PyTypeObject DirectOpType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// A frozen graph's stamp of many tensors runs after its call's weights (a decode step's 100-500 MB)
// have passed through the caches: each tensor's Python object, TensorImpl, version counter and
// storage are then four dependent misses. Above this many tensors their records are asked for a
// level at a time over all of them first, so that each level's misses overlap (below it, and with
// the caches warm, the extra passes cost more than they save).
constexpr Py_ssize_t kStagedStamp = 128;

void prefetch_records(PyObject* const* items, Py_ssize_t n) {
  for (Py_ssize_t k = 0; k < n; ++k) __builtin_prefetch(items[k]);
  for (Py_ssize_t k = 0; k < n; ++k) {
    if (!THPVariable_Check(items[k])) continue;
    const char* impl = reinterpret_cast<const char*>(THPVariable_Unpack(items[k]).unsafeGetTensorImpl());
    for (size_t line = 0; line < sizeof(c10::TensorImpl); line += 64) __builtin_prefetch(impl + line);
  }
  for (Py_ssize_t k = 0; k < n; ++k) {
    if (!THPVariable_Check(items[k])) continue;
    const c10::TensorImpl* impl = THPVariable_Unpack(items[k]).unsafeGetTensorImpl();
    if (impl->has_storage()) __builtin_prefetch(impl->storage().unsafeGetStorageImpl());
    const void* counter;  // the pointer VariableVersion holds (read for a prefetch only, which never faults)
    std::memcpy(&counter, &impl->version_counter(), sizeof counter);
    __builtin_prefetch(counter);
  }
}

PyObject* stamp(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 1 && nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "stamp(tensors, expected=None) takes 1 or 2 arguments");
    return nullptr;
  }
  // With `expected` (bytes), whether the stamp is it, the stamp never made: a frozen graph's
  // check on every call (a decode step's ~290 weights: 7 KB of bytes a call, a malloc).
  PyObject* expected = nargs == 2 && args[1] != Py_None ? args[1] : nullptr;
  if (expected != nullptr && !PyBytes_Check(expected)) {
    PyErr_SetString(PyExc_TypeError, "stamp: expected must be bytes or None");
    return nullptr;
  }
  PyObject* seq = PySequence_Fast(args[0], "stamp takes a sequence of tensors");
  if (seq == nullptr) return nullptr;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  PyObject** items = PySequence_Fast_ITEMS(seq);
  const Py_ssize_t bytes = n * 3 * static_cast<Py_ssize_t>(sizeof(uint64_t));
  if (expected != nullptr && PyBytes_GET_SIZE(expected) != bytes) {
    Py_DECREF(seq);
    Py_RETURN_FALSE;
  }
  PyObject* result = expected != nullptr ? nullptr : PyBytes_FromStringAndSize(nullptr, bytes);
  if (expected == nullptr && result == nullptr) { Py_DECREF(seq); return nullptr; }
  const auto* want = expected != nullptr ? reinterpret_cast<const uint64_t*>(PyBytes_AS_STRING(expected)) : nullptr;
  auto* out = result != nullptr ? reinterpret_cast<uint64_t*>(PyBytes_AS_STRING(result)) : nullptr;
  if (n >= kStagedStamp) prefetch_records(items, n);
  bool same = true;
  for (Py_ssize_t k = 0; k < n; ++k) {
    if (!THPVariable_Check(items[k])) {
      Py_DECREF(seq); Py_XDECREF(result);
      PyErr_Format(PyExc_TypeError, "stamp takes tensors; item %zd is %s", k, Py_TYPE(items[k])->tp_name);
      return nullptr;
    }
    const at::Tensor& t = THPVariable_Unpack(items[k]);
    const uint64_t record[3] = {
        reinterpret_cast<uintptr_t>(t.unsafeGetTensorImpl()),
        // Inference tensors have no version counter (they cannot be written in place outside inference mode).
        t.is_inference() ? 0 : t.unsafeGetTensorImpl()->version_counter().current_version(),
        reinterpret_cast<uintptr_t>(t.has_storage() ? t.const_data_ptr() : nullptr)};
    if (want != nullptr) {
      same = same && std::memcmp(record, want + 3 * k, sizeof(record)) == 0;
    } else {
      std::memcpy(out + 3 * k, record, sizeof(record));
    }
  }
  Py_DECREF(seq);
  if (expected != nullptr) return PyBool_FromLong(same);
  return result;
}

// A tensor's memory as alias_pattern compares it: its storage and the span of bytes from its first
// element to its last (`shared`: false for an empty tensor, which shares none).
struct StorageKey {
  bool shared;
  int device_type, device_index;
  const void* data;
  int64_t begin, end;
  bool same_memory(const StorageKey& o) const {
    return shared && o.shared && device_type == o.device_type && device_index == o.device_index && data == o.data &&
           begin < o.end && o.begin < end;
  }
};

StorageKey storage_key(const at::Tensor& t) {
  if (t.numel() == 0) return {false, 0, 0, nullptr, 0, 0};
  const int64_t item = static_cast<int64_t>(t.element_size());
  int64_t extent = 0;
  for (int64_t d = 0; d < t.dim(); ++d) extent += (t.size(d) - 1) * t.stride(d);
  const int64_t begin = t.storage_offset() * item;
  return {true, int(t.device().type()), int(t.device().index()), t.storage().data(), begin, begin + (extent + 1) * item};
}

PyObject* alias_pattern(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2 && nargs != 3) {
    PyErr_SetString(PyExc_TypeError, "alias_pattern(values, by_storage, expected=None) takes 2 or 3 arguments");
    return nullptr;
  }
  const int by_storage = PyObject_IsTrue(args[1]);
  if (by_storage < 0) return nullptr;
  // With `expected` (a tuple), whether the pattern is it, without making the pattern: a guard's
  // check of a decode step's ~150 indices on every call (a tuple of them was a malloc that
  // consolidated glibc's small freed chunks first).
  PyObject* expected = nargs == 3 && args[2] != Py_None ? args[2] : nullptr;
  if (expected != nullptr && !PyTuple_Check(expected)) {
    PyErr_SetString(PyExc_TypeError, "alias_pattern: expected must be a tuple or None");
    return nullptr;
  }
  PyObject* seq = PySequence_Fast(args[0], "alias_pattern takes a sequence");
  if (seq == nullptr) return nullptr;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  PyObject** items = PySequence_Fast_ITEMS(seq);
  const Py_ssize_t total = by_storage ? 2 * n : n;
  if (expected != nullptr && PyTuple_GET_SIZE(expected) != total) {
    Py_DECREF(seq);
    Py_RETURN_FALSE;
  }
  PyObject* result = expected != nullptr ? nullptr : PyTuple_New(total);
  auto fail = [&]() -> PyObject* {  // (a tuple's unset items are NULL: released as such)
    Py_DECREF(seq);
    Py_XDECREF(result);
    return nullptr;
  };
  auto differs = [&]() -> PyObject* {
    Py_DECREF(seq);
    Py_RETURN_FALSE;
  };
  // 1: set (or as expected), 0: not as expected, -1: an error.
  auto set = [&](Py_ssize_t at, Py_ssize_t index) -> int {
    if (expected != nullptr) {
      PyObject* want = PyTuple_GET_ITEM(expected, at);
      if (!PyLong_CheckExact(want)) return 0;
      const Py_ssize_t value = PyLong_AsSsize_t(want);
      if (value == -1 && PyErr_Occurred()) {  // (too large for an index: not one)
        PyErr_Clear();
        return 0;
      }
      return value == index ? 1 : 0;
    }
    PyObject* value = PyLong_FromSsize_t(index);
    if (value == nullptr) return -1;
    PyTuple_SET_ITEM(result, at, value);
    return 1;
  };
  if (expected == nullptr && result == nullptr) return fail();
  // A few dozen values: a linear search beats a hash map's allocations.
  for (Py_ssize_t k = 0; k < n; ++k) {
    Py_ssize_t first = 0;
    while (items[first] != items[k]) ++first;
    const int done = set(k, first);
    if (done < 0) return fail();
    if (done == 0) return differs();
  }
  if (by_storage) {
    // (Kept for the next call: 150 keys of a decode step's cache are 4.8 KB, a malloc that had
    // glibc consolidate its freed small chunks first. Nothing below calls back into Python.)
    static thread_local std::vector<StorageKey> keys;
    keys.resize(static_cast<size_t>(n));
    for (Py_ssize_t k = 0; k < n; ++k) {
      if (!THPVariable_Check(items[k])) {
        PyErr_Format(PyExc_TypeError, "alias_pattern by storage takes tensors; item %zd is %s", k, Py_TYPE(items[k])->tp_name);
        return fail();
      }
      const at::Tensor& t = THPVariable_Unpack(items[k]);
      if (t.numel() != 0 && !t.has_storage()) {
        PyErr_Format(PyExc_RuntimeError, "alias_pattern: item %zd has no storage", k);
        return fail();
      }
      keys[k] = storage_key(t);
      Py_ssize_t first = 0;
      while (first < k && !keys[first].same_memory(keys[k])) ++first;
      const int done = set(n + k, first);
      if (done < 0) return fail();
      if (done == 0) return differs();
    }
  }
  Py_DECREF(seq);
  if (expected != nullptr) Py_RETURN_TRUE;
  return result;
}

struct TensorCheck {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  PyObject* type;  // owned
  c10::ScalarType dtype;
  c10::DeviceType device_type;
  c10::DeviceIndex device_index;
  int64_t dim;
  bool sized;  // sizes and strides checked (those not kAnyInt), else the dimension count only
  bool any_stride;  // a stride is checked
  bool offset_checked;
  bool requires_grad;
  int64_t storage_offset;
  std::vector<int64_t>* sizes;  // owned; [dim sizes..., dim strides...]
};

constexpr int64_t kAnyInt = INT64_MIN;  // a size or stride a TensorCheck does not check (None)

bool tensor_matches(const TensorCheck* self, PyObject* value) {
  if (reinterpret_cast<PyObject*>(Py_TYPE(value)) != self->type) return false;
  const at::Tensor& t = THPVariable_Unpack(value);
  if (t.scalar_type() != self->dtype || t.device().type() != self->device_type ||
      t.device().index() != self->device_index || t.dim() != self->dim || t.requires_grad() != self->requires_grad)
    return false;
  if (!self->sized && !self->offset_checked) return true;
  if (t.is_nested()) return false;  // (Python's size() raises)
  if ((self->any_stride || self->offset_checked) && (t.is_sparse() || t.layout() != c10::kStrided))
    return false;  // (Python's stride() and storage_offset() raise)
  const int64_t* expected = self->sizes->data();
  if (self->sized) {
    c10::IntArrayRef sizes = t.sizes();
    for (int64_t d = 0; d < self->dim; ++d)
      if (expected[d] != kAnyInt && sizes[d] != expected[d]) return false;
  }
  if (self->any_stride) {
    c10::IntArrayRef strides = t.strides();
    for (int64_t d = 0; d < self->dim; ++d)
      if (expected[self->dim + d] != kAnyInt && strides[d] != expected[self->dim + d]) return false;
  }
  return !self->offset_checked || t.storage_offset() == self->storage_offset;
}

PyObject* tensor_check_vectorcall(PyObject* callable, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  if (PyVectorcall_NARGS(nargsf) != 1 || (kwnames != nullptr && PyTuple_GET_SIZE(kwnames) != 0)) {
    PyErr_SetString(PyExc_TypeError, "a TensorCheck takes one value");
    return nullptr;
  }
  bool ok;
  try {
    ok = tensor_matches(reinterpret_cast<TensorCheck*>(callable), args[0]);
  } catch (const std::exception&) {  // (a tensor whose sizes cannot be read matches nothing)
    ok = false;
  }
  return PyBool_FromLong(ok);
}

// The n (a tensor's dim) ints of the sequence `seq` into out[0, n), None read as kAnyInt where `any`
// allows it; false with Python's error set, naming `what`.
bool read_ints(PyObject* seq, int64_t n, int64_t* out, const char* what, bool any = true) {
  PyObject* fast = PySequence_Fast(seq, what);
  if (fast == nullptr) return false;
  bool ok = PySequence_Fast_GET_SIZE(fast) == n;
  for (int64_t k = 0; ok && k < n; ++k) {
    PyObject* item = PySequence_Fast_GET_ITEM(fast, k);
    out[k] = item == Py_None && any ? kAnyInt : PyLong_AsLongLong(item);
    ok = !(out[k] == -1 && PyErr_Occurred()) && (item == Py_None || out[k] != kAnyInt);
  }
  Py_DECREF(fast);
  if (!ok && !PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "%s must have dim integers", what);
  return ok;
}

PyObject* tensor_check_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  PyObject *tensor_type, *dtype, *device, *sizes, *strides, *offset = Py_None;
  long long dim;
  int requires_grad;
  static const char* names[] = {"type", "dtype", "device", "dim", "sizes", "strides", "requires_grad",
                                "storage_offset", nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOLOOp|O", const_cast<char**>(names), &tensor_type, &dtype, &device,
                                   &dim, &sizes, &strides, &requires_grad, &offset))
    return nullptr;
  if (!PyType_Check(tensor_type) || !THPDtype_Check(dtype) || !THPDevice_Check(device) || dim < 0 ||
      (sizes == Py_None) != (strides == Py_None) || (offset != Py_None && !PyLong_Check(offset))) {
    PyErr_SetString(PyExc_TypeError, "TensorCheck(type, dtype: torch.dtype, device: torch.device, dim >= 0, "
                                     "sizes and strides: both sequences (of ints or None) or both None, requires_grad, "
                                     "storage_offset: int or None)");
    return nullptr;
  }
  const int64_t storage_offset = offset == Py_None ? 0 : PyLong_AsLongLong(offset);
  if (storage_offset == -1 && PyErr_Occurred()) return nullptr;
  std::vector<int64_t> expected(sizes == Py_None ? 0 : 2 * dim);
  if (sizes != Py_None && (!read_ints(sizes, dim, expected.data(), "TensorCheck: sizes") ||
                           !read_ints(strides, dim, expected.data() + dim, "TensorCheck: strides")))
    return nullptr;
  auto* self = reinterpret_cast<TensorCheck*>(type->tp_alloc(type, 0));
  if (self == nullptr) return nullptr;
  self->vectorcall = tensor_check_vectorcall;
  Py_INCREF(tensor_type);
  self->type = tensor_type;
  self->dtype = reinterpret_cast<THPDtype*>(dtype)->scalar_type;
  const c10::Device& d = reinterpret_cast<THPDevice*>(device)->device;
  self->device_type = d.type();
  self->device_index = d.index();
  self->dim = dim;
  self->sized = sizes != Py_None;
  self->any_stride = self->sized && dim == 0;  // (a 0-d tensor's `stride() == ()`: strided only)
  for (int64_t d = 0; self->sized && d < dim; ++d) self->any_stride |= expected[dim + d] != kAnyInt;
  self->offset_checked = offset != Py_None;
  self->storage_offset = storage_offset;
  self->requires_grad = requires_grad != 0;
  self->sizes = new std::vector<int64_t>(std::move(expected));
  return reinterpret_cast<PyObject*>(self);
}

void tensor_check_dealloc(PyObject* object) {
  auto* self = reinterpret_cast<TensorCheck*>(object);
  Py_XDECREF(self->type);
  delete self->sizes;
  Py_TYPE(object)->tp_free(object);
}

PyTypeObject TensorCheckType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// What changes when a dict does. Python 3.11: the version tag CPython gives a dict on every change
// (PEP 509). 3.12 and later: a dict watcher's count of the dict's changes, since the tag misses
// some (3.13 writes an attribute into an object's inline values without a new tag for the dict
// made of them) and 3.14 keeps none; the watcher hears of every change, and the count is 0 until
// the first. Not on free-threaded builds.
#if PY_VERSION_HEX >= 0x030C0000 && !defined(Py_GIL_DISABLED)
#define KILN_DICT_VERSIONS 1
int dict_watcher = -1;  // added at the first watch (one of the interpreter's 8)
std::unordered_map<PyObject*, uint64_t>* dict_changes = nullptr;
uint64_t dict_change_count = 0;

int on_dict_event(PyDict_WatchEvent event, PyObject* dict, PyObject*, PyObject*) {
  if (event == PyDict_EVENT_DEALLOCATED)
    dict_changes->erase(dict);
  else
    (*dict_changes)[dict] = ++dict_change_count;
  return 0;
}

// Start hearing of `dict`'s changes; false (no error set) where no watcher can be added.
bool watch_dict(PyObject* dict) {
  if (dict_watcher < 0) {
    if (dict_changes == nullptr) dict_changes = new std::unordered_map<PyObject*, uint64_t>();
    dict_watcher = PyDict_AddWatcher(on_dict_event);
    if (dict_watcher < 0) {
      PyErr_Clear();
      return false;
    }
  }
  return PyDict_Watch(dict_watcher, dict) == 0 || (PyErr_Clear(), false);
}

uint64_t dict_version(PyObject* dict) {
  auto found = dict_changes->find(dict);
  return found == dict_changes->end() ? 0 : found->second;
}
#elif PY_VERSION_HEX < 0x030C0000
#define KILN_DICT_VERSIONS 1
bool watch_dict(PyObject*) { return true; }
uint64_t dict_version(PyObject* dict) { return reinterpret_cast<PyDictObject*>(dict)->ma_version_tag; }
#else
#define KILN_DICT_VERSIONS 0
bool watch_dict(PyObject*) { return false; }
uint64_t dict_version(PyObject*) { return 0; }
#endif

// An object's __dict__ as a watch saw it: the dict, and its keys and values in order.
struct InstanceDictRecord {
  PyObject* owner;
  PyObject* dict;
  std::vector<PyObject*> items;  // key, value, key, value, ...
};

struct Watch {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  bool armed;
  // Owned references: each dict with its version, each owner with its dict and that dict's items,
  // each cell with the object it held.
  std::vector<std::pair<PyObject*, uint64_t>>* dicts;
  std::vector<InstanceDictRecord>* owners;
  std::vector<std::pair<PyObject*, PyObject*>>* cells;
};

void watch_release(Watch* self) {
  self->armed = false;
  // Emptied before the references go: a release may run code that reaches this watch again.
  std::vector<std::pair<PyObject*, uint64_t>> dicts;
  std::vector<InstanceDictRecord> owners;
  std::vector<std::pair<PyObject*, PyObject*>> cells;
  dicts.swap(*self->dicts);
  owners.swap(*self->owners);
  cells.swap(*self->cells);
  for (auto& [dict, version] : dicts) Py_DECREF(dict);
  for (auto& record : owners) {
    Py_DECREF(record.owner);
    Py_DECREF(record.dict);
    for (PyObject* item : record.items) Py_DECREF(item);
  }
  for (auto& [cell, contents] : cells) { Py_DECREF(cell); Py_XDECREF(contents); }
}

// owner.__dict__ as object.__getattribute__ finds it, or nullptr (no error left set).
PyObject* instance_dict_of(PyObject* owner) {
  PyObject* dict = PyObject_GenericGetDict(owner, nullptr);
  if (dict == nullptr) PyErr_Clear();
  return dict;
}

// An instance dict is compared item by item (a few dozen pointers for a model's config), not by
// its version: CPython 3.13 writes an attribute into the object's inline values, which the dict
// made of them shares, without a new version or a word to dict watchers.
bool instance_dict_unchanged(const InstanceDictRecord& record) {
  PyObject* now = instance_dict_of(record.owner);
  Py_XDECREF(now);  // the owner keeps it alive; only its identity is compared
  if (now != record.dict || 2 * static_cast<size_t>(PyDict_GET_SIZE(now)) != record.items.size()) return false;
  Py_ssize_t position = 0;
  PyObject *key, *value;
  for (size_t k = 0; PyDict_Next(now, &position, &key, &value); k += 2)
    if (key != record.items[k] || value != record.items[k + 1]) return false;
  return true;
}

bool watch_unchanged(const Watch* self) {
  if (!self->armed) return false;
  for (const auto& [dict, version] : *self->dicts)
    if (dict_version(dict) != version) return false;
  for (const auto& record : *self->owners)
    if (!instance_dict_unchanged(record)) return false;
  for (const auto& [cell, contents] : *self->cells)
    if (PyCell_GET(cell) != contents) return false;
  return true;
}

PyObject* watch_vectorcall(PyObject* callable, PyObject* const*, size_t nargsf, PyObject* kwnames) {
  if (PyVectorcall_NARGS(nargsf) != 0 || (kwnames != nullptr && PyTuple_GET_SIZE(kwnames) != 0)) {
    PyErr_SetString(PyExc_TypeError, "a Watch takes no arguments");
    return nullptr;
  }
  return PyBool_FromLong(watch_unchanged(reinterpret_cast<Watch*>(callable)));
}

// record(dicts, owners, cells): what the watch compares from now on, disarmed until arm(). An
// item of the wrong kind (not exactly a dict, a pair whose owner's __dict__ is another, not a
// cell) raises TypeError and leaves the watch empty.
PyObject* watch_record(PyObject* object, PyObject* args) {
  auto* self = reinterpret_cast<Watch*>(object);
  PyObject *dicts, *owners, *cells;
  if (!PyArg_ParseTuple(args, "O!O!O!", &PyTuple_Type, &dicts, &PyTuple_Type, &owners, &PyTuple_Type, &cells)) return nullptr;
  watch_release(self);
  for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(dicts); ++k) {
    PyObject* dict = PyTuple_GET_ITEM(dicts, k);
    if (!PyDict_CheckExact(dict)) {
      watch_release(self);
      PyErr_Format(PyExc_TypeError, "Watch.record: dicts[%zd] is %s, not a dict", k, Py_TYPE(dict)->tp_name);
      return nullptr;
    }
    if (!watch_dict(dict)) {
      watch_release(self);
      PyErr_SetString(PyExc_RuntimeError, "Watch.record: no dict watcher could be added");
      return nullptr;
    }
    Py_INCREF(dict);
    self->dicts->emplace_back(dict, dict_version(dict));
  }
  for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(owners); ++k) {
    PyObject* pair = PyTuple_GET_ITEM(owners, k);
    PyObject* now = PyTuple_Check(pair) && PyTuple_GET_SIZE(pair) == 2 ? instance_dict_of(PyTuple_GET_ITEM(pair, 0)) : nullptr;
    Py_XDECREF(now);
    if (now == nullptr || now != PyTuple_GET_ITEM(pair, 1) || !PyDict_Check(now)) {
      watch_release(self);
      PyErr_Format(PyExc_TypeError, "Watch.record: owners[%zd] is not an (owner, owner.__dict__) pair", k);
      return nullptr;
    }
    InstanceDictRecord record{PyTuple_GET_ITEM(pair, 0), now, {}};
    Py_INCREF(record.owner);
    Py_INCREF(record.dict);
    record.items.reserve(2 * PyDict_GET_SIZE(now));
    Py_ssize_t position = 0;
    PyObject *key, *value;
    while (PyDict_Next(now, &position, &key, &value)) {
      Py_INCREF(key);
      Py_INCREF(value);
      record.items.push_back(key);
      record.items.push_back(value);
    }
    self->owners->push_back(std::move(record));
  }
  for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(cells); ++k) {
    PyObject* cell = PyTuple_GET_ITEM(cells, k);
    if (!PyCell_Check(cell)) {
      watch_release(self);
      PyErr_Format(PyExc_TypeError, "Watch.record: cells[%zd] is %s, not a cell", k, Py_TYPE(cell)->tp_name);
      return nullptr;
    }
    Py_INCREF(cell);
    Py_XINCREF(PyCell_GET(cell));
    self->cells->emplace_back(cell, PyCell_GET(cell));
  }
  Py_RETURN_NONE;
}

PyObject* watch_arm(PyObject* object, PyObject*) {
  reinterpret_cast<Watch*>(object)->armed = KILN_DICT_VERSIONS != 0;
  Py_RETURN_NONE;
}

PyObject* watch_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  if (PyTuple_GET_SIZE(args) != 0 || (kwargs != nullptr && PyDict_GET_SIZE(kwargs) != 0)) {
    PyErr_SetString(PyExc_TypeError, "Watch() takes no arguments");
    return nullptr;
  }
  auto* self = reinterpret_cast<Watch*>(type->tp_alloc(type, 0));
  if (self == nullptr) return nullptr;
  self->vectorcall = watch_vectorcall;
  self->armed = false;
  self->dicts = new std::vector<std::pair<PyObject*, uint64_t>>();
  self->owners = new std::vector<InstanceDictRecord>();
  self->cells = new std::vector<std::pair<PyObject*, PyObject*>>();
  return reinterpret_cast<PyObject*>(self);
}

// A watch is a GC container: what it holds may lead back to it (a module's globals holding the
// compiled function whose guards hold the watch).
int watch_traverse(PyObject* object, visitproc visit, void* arg) {
  auto* self = reinterpret_cast<Watch*>(object);
  for (auto& [dict, version] : *self->dicts) Py_VISIT(dict);
  for (auto& record : *self->owners) {
    Py_VISIT(record.owner);
    Py_VISIT(record.dict);
    for (PyObject* item : record.items) Py_VISIT(item);
  }
  for (auto& [cell, contents] : *self->cells) { Py_VISIT(cell); Py_VISIT(contents); }
  return 0;
}

int watch_clear(PyObject* object) {
  watch_release(reinterpret_cast<Watch*>(object));
  return 0;
}

void watch_dealloc(PyObject* object) {
  PyObject_GC_UnTrack(object);
  auto* self = reinterpret_cast<Watch*>(object);
  watch_release(self);
  delete self->dicts;
  delete self->owners;
  delete self->cells;
  Py_TYPE(object)->tp_free(object);
}

PyMethodDef watch_methods[] = {
    {"record", watch_record, METH_VARARGS, "record(dicts, owners, cells): what to compare from now on; disarms."},
    {"arm", watch_arm, METH_NOARGS, "From now on the watch holds while nothing recorded changed."},
    {nullptr, nullptr, 0, nullptr},
};

PyTypeObject WatchType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// greedy_tokens: 16 lanes in GCC's vector extensions (lowered to the machine's widest vectors).
typedef float Lanes __attribute__((vector_size(64)));
typedef int32_t LaneMask __attribute__((vector_size(64)));
typedef float UnalignedLanes __attribute__((vector_size(64), aligned(4)));
constexpr int64_t kLanes = 16;

// The first index of the largest value of x[0:n] (n >= 1), or of its first NaN: torch.argmax's answer.
int64_t first_largest(const float* x, int64_t n) {
  int64_t i = 0;
  float largest = x[0];
  bool unordered = x[0] != x[0];
  if (n >= kLanes) {
    Lanes acc = *reinterpret_cast<const UnalignedLanes*>(x);
    LaneMask nan = acc != acc;
    for (i = kLanes; i + kLanes <= n; i += kLanes) {
      Lanes v = *reinterpret_cast<const UnalignedLanes*>(x + i);
      acc = v > acc ? v : acc;
      nan |= v != v;
    }
    for (int j = 0; j < kLanes; ++j) {
      unordered |= nan[j] != 0;
      largest = acc[j] > largest ? acc[j] : largest;
    }
  }
  for (; i < n; ++i) {
    unordered |= x[i] != x[i];
    largest = x[i] > largest ? x[i] : largest;
  }
  if (unordered) {
    for (int64_t k = 0; k < n; ++k)
      if (x[k] != x[k]) return k;
  }
  int64_t k = 0;
  if (n >= kLanes) {
    Lanes target = largest - Lanes{};  // broadcast
    for (; k + kLanes <= n; k += kLanes) {
      LaneMask hit = *reinterpret_cast<const UnalignedLanes*>(x + k) == target;
      int32_t any = 0;
      for (int j = 0; j < kLanes; ++j) any |= hit[j];
      if (any) break;
    }
  }
  for (; k < n; ++k)
    if (x[k] == largest) return k;
  return 0;  // not reached: the largest value is one of x's
}

// (A decode loop's calls between two steps: each through the dispatcher cost 20-40 us with the caches
// cold after the step's weights, where these cost a few.)
PyObject* greedy_tokens(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 1 && nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "greedy_tokens(logits, column=False) takes 1 or 2 arguments");
    return nullptr;
  }
  PyObject* value = args[0];
  const int column = nargs == 2 ? PyObject_IsTrue(args[1]) : 0;
  if (column < 0) return nullptr;
  if (!THPVariable_Check(value)) Py_RETURN_NONE;
  const at::Tensor& logits = THPVariable_Unpack(value);
  const int64_t dim = logits.dim();
  if ((dim != 2 && dim != 3) || logits.scalar_type() != at::kFloat || !logits.device().is_cpu() ||
      logits.size(dim - 1) == 0 || (dim == 3 && logits.size(1) == 0) ||
      (logits.size(dim - 1) > 1 && logits.stride(dim - 1) != 1) || logits.requires_grad())
    Py_RETURN_NONE;
  const int64_t rows = logits.size(0), n = logits.size(dim - 1), row_stride = logits.stride(0);
  at::Tensor tokens = column ? at::empty({rows, 1}, at::TensorOptions().dtype(at::kLong))
                             : at::empty({rows}, at::TensorOptions().dtype(at::kLong));
  // (batch, positions, vocabulary): the last position's row.
  const float* data = logits.const_data_ptr<float>() + (dim == 3 ? (logits.size(1) - 1) * logits.stride(1) : 0);
  int64_t* out = tokens.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r) out[r] = first_largest(data + r * row_stride, n);
  return THPVariable_Wrap(std::move(tokens));
}

PyObject* successor(PyObject*, PyObject* value) {
  if (!THPVariable_Check(value) || reinterpret_cast<PyObject*>(Py_TYPE(value)) != THPVariableClass) Py_RETURN_NONE;
  const at::Tensor& t = THPVariable_Unpack(value);
  if (t.scalar_type() != at::kLong || !t.device().is_cpu() || !t.is_contiguous() || t.numel() > 64 ||
      t.requires_grad())
    Py_RETURN_NONE;
  at::Tensor next = at::empty(t.sizes(), at::TensorOptions().dtype(at::kLong));
  const int64_t* from = t.const_data_ptr<int64_t>();
  int64_t* to = next.data_ptr<int64_t>();
  for (int64_t k = 0; k < t.numel(); ++k) to[k] = from[k] + 1;
  return THPVariable_Wrap(std::move(next));
}

PyObject* views_of(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 4) {
    PyErr_SetString(PyExc_TypeError, "views_of(bases, size, stride, offset) takes 4 arguments");
    return nullptr;
  }
  const Py_ssize_t dim = PySequence_Size(args[1]);
  if (dim < 0) return nullptr;
  std::vector<int64_t> size(static_cast<size_t>(dim)), stride(static_cast<size_t>(dim));
  if (!read_ints(args[1], dim, size.data(), "views_of: size", false) ||
      !read_ints(args[2], dim, stride.data(), "views_of: stride", false))
    return nullptr;
  const int64_t offset = PyLong_AsLongLong(args[3]);
  if (offset == -1 && PyErr_Occurred()) return nullptr;
  PyObject* seq = PySequence_Fast(args[0], "views_of takes a sequence of tensors");
  if (seq == nullptr) return nullptr;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  PyObject** items = PySequence_Fast_ITEMS(seq);
  for (Py_ssize_t k = 0; k < n; ++k)
    if (reinterpret_cast<PyObject*>(Py_TYPE(items[k])) != THPVariableClass) {
      Py_DECREF(seq);
      Py_RETURN_NONE;
    }
  PyObject* result = PyList_New(n);
  if (result == nullptr) {
    Py_DECREF(seq);
    return nullptr;
  }
  for (Py_ssize_t k = 0; k < n; ++k) {
    PyObject* view = nullptr;
    try {
      view = THPVariable_Wrap(THPVariable_Unpack(items[k]).as_strided(size, stride, offset));
    } catch (const std::exception& e) {  // (c10::Error: a layout outside the base's storage)
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
    if (view == nullptr) {
      Py_DECREF(seq);
      Py_DECREF(result);
      return nullptr;
    }
    PyList_SET_ITEM(result, k, view);
  }
  Py_DECREF(seq);
  return result;
}

PyObject* swap_storage_memory(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2 || !THPStorage_Check(args[0]) || !THPStorage_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "swap_storage_memory(a, b) takes two torch.UntypedStorage");
    return nullptr;
  }
  c10::StorageImpl* a = THPStorage_Unpack(args[0]).unsafeGetStorageImpl();
  c10::StorageImpl* b = THPStorage_Unpack(args[1]).unsafeGetStorageImpl();
  if (a == b) Py_RETURN_NONE;
  try {
    const size_t a_bytes = a->nbytes(), b_bytes = b->nbytes();
    at::DataPtr a_memory = a->set_data_ptr(at::DataPtr());
    a->set_data_ptr(b->set_data_ptr(std::move(a_memory)));
    a->set_nbytes(b_bytes);
    b->set_nbytes(a_bytes);
  } catch (const std::exception& e) {  // a storage whose memory may not be replaced (c10::Error)
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
  Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"swap_storage_memory", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(swap_storage_memory)), METH_FASTCALL,
     "Two UntypedStorages exchange their memory (data pointer, deleter, size)."},
    {"stamp", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(stamp)), METH_FASTCALL,
     "Identity, version counter and data pointer of each tensor, as bytes; with expected bytes, whether it is them."},
    {"alias_pattern", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(alias_pattern)), METH_FASTCALL,
     "For each value the index of the first that is it; by storage, then the first sharing its memory."},
    {"views_of", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(views_of)), METH_FASTCALL,
     "[base.as_strided(size, stride, offset) for base in bases] of plain tensors; None where one is a subclass."},
    {"greedy_tokens", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(greedy_tokens)), METH_FASTCALL,
     "torch.argmax(logits[:, -1] if 3D else logits, -1) of a CPU float32 tensor (as a column: [:, None]); None for others."},
    {"successor", successor, METH_O, "t + 1 of a small CPU int64 tensor, contiguous; None for others."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "kiln_python", "kiln's door from Python into C++ wrappers.", -1, methods};

// A callable type whose calls go through its vectorcall slot at `offset`.
int ready_callable_type(PyTypeObject& type, const char* name, Py_ssize_t size, Py_ssize_t offset, newfunc make,
                        destructor dealloc, const char* doc, unsigned long extra_flags = 0) {
  type.tp_name = name;
  type.tp_basicsize = size;
  type.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | extra_flags;
  type.tp_vectorcall_offset = offset;
  type.tp_call = PyVectorcall_Call;
  type.tp_new = make;
  if (dealloc != nullptr) type.tp_dealloc = dealloc;
  type.tp_doc = doc;
  return PyType_Ready(&type);
}

}  // namespace

PyMODINIT_FUNC PyInit_kiln_python(void) {
  GraphCallType.tp_methods = graph_call_methods;
  if (ready_callable_type(GraphCallType, "kiln_python.GraphCall", sizeof(GraphCall), offsetof(GraphCall, vectorcall),
                          graph_call_new, graph_call_dealloc,
                          "GraphCall(entry, error, num_outputs, share=0, release=0): a C++ wrapper's entry as (*tensors) -> tuple.") < 0 ||
      ready_callable_type(TensorCheckType, "kiln_python.TensorCheck", sizeof(TensorCheck), offsetof(TensorCheck, vectorcall),
                          tensor_check_new, tensor_check_dealloc,
                          "TensorCheck(type, dtype, device, dim, sizes, strides, requires_grad, storage_offset=None): a guard's tensor match.") < 0 ||
      ready_callable_type(DirectOpType, "kiln_python.DirectOp", sizeof(DirectOp), offsetof(DirectOp, vectorcall),
                          direct_op_new, direct_op_dealloc,
                          "DirectOp(op, call, error, num_outputs, names, defaults): one of kiln's C++ operators.") < 0)
    return nullptr;
  WatchType.tp_methods = watch_methods;
  WatchType.tp_traverse = watch_traverse;
  WatchType.tp_clear = watch_clear;
  if (ready_callable_type(WatchType, "kiln_python.Watch", sizeof(Watch), offsetof(Watch, vectorcall), watch_new,
                          watch_dealloc, "Watch(): whether recorded dicts, instance dicts and cells are unchanged.",
                          Py_TPFLAGS_HAVE_GC) < 0)
    return nullptr;
  PyObject* m = PyModule_Create(&module);
  if (m == nullptr) return nullptr;
  for (auto [name, type] : {std::pair{"GraphCall", &GraphCallType}, std::pair{"TensorCheck", &TensorCheckType},
                            std::pair{"DirectOp", &DirectOpType}, std::pair{"Watch", &WatchType}}) {
    Py_INCREF(type);
    if (PyModule_AddObject(m, name, reinterpret_cast<PyObject*>(type)) < 0) {
      Py_DECREF(type);
      Py_DECREF(m);
      return nullptr;
    }
  }
  if (PyModule_AddObject(m, "dict_versions", PyBool_FromLong(KILN_DICT_VERSIONS)) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
