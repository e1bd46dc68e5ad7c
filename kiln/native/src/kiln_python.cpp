// kiln's door from Python into C++ wrappers (kiln/native/python_door.py): a CPython extension, so
// a graph call turns Python tensors into wrapper handles and back without ctypes or capsules.
//
//   GraphCall(entry, error, num_outputs)(*tensors) -> tuple of num_outputs tensors
//       entry: the address of a wrapper's `int kiln_graph_call(kiln_tensor* inputs, kiln_tensor* outputs)`,
//       error: of `const char* kiln_error(void)`. A status of 2 raises IndexError, any other RuntimeError.
//       The GIL is released while the wrapper runs.
//   stamp(tensors) -> bytes
//       each tensor's identity (its TensorImpl), version counter and data pointer: two stamps are
//       equal when no tensor was replaced, written in place or rebound to other memory.
//
// Built once per machine, compiler, Python and torch, against the wheel's headers and
// libtorch_python (kiln/native/python_door.py).

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>
#include <new>

namespace {

typedef int (*EntryFn)(void**, void**);
typedef const char* (*ErrorFn)(void);

struct GraphCall {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  EntryFn entry;
  ErrorFn error;
  Py_ssize_t num_outputs;
};

// Handles live on the stack for graphs of up to this many inputs and outputs (a BERT-base graph
// has ~200 inputs with its weights); larger ones use the heap.
constexpr Py_ssize_t kStackHandles = 256;

struct Handles {
  void* stack[kStackHandles];
  void** data;
  explicit Handles(Py_ssize_t n) : data(n <= kStackHandles ? stack : new (std::nothrow) void*[n]) {}
  ~Handles() { if (data != stack) delete[] data; }
};

PyObject* graph_call_vectorcall(PyObject* callable, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* self = reinterpret_cast<GraphCall*>(callable);
  if (kwnames != nullptr && PyTuple_GET_SIZE(kwnames) != 0) {
    PyErr_SetString(PyExc_TypeError, "a kiln graph call takes its tensors by position");
    return nullptr;
  }
  Py_ssize_t n = PyVectorcall_NARGS(nargsf);
  Handles inputs(n), outputs(self->num_outputs);
  if (inputs.data == nullptr || outputs.data == nullptr) return PyErr_NoMemory();
  for (Py_ssize_t k = 0; k < n; ++k) {
    if (!THPVariable_Check(args[k])) {
      for (Py_ssize_t j = 0; j < k; ++j) delete static_cast<at::Tensor*>(inputs.data[j]);
      PyErr_Format(PyExc_TypeError, "a kiln graph call takes tensors; input %zd is %s", k, Py_TYPE(args[k])->tp_name);
      return nullptr;
    }
    // A new owned handle per input: the wrapper releases its inputs when it is done with them.
    inputs.data[k] = new at::Tensor(THPVariable_Unpack(args[k]));
  }
  for (Py_ssize_t k = 0; k < self->num_outputs; ++k) outputs.data[k] = nullptr;
  int status;
  Py_BEGIN_ALLOW_THREADS
  status = self->entry(inputs.data, outputs.data);
  Py_END_ALLOW_THREADS
  if (status != 0) {
    PyErr_SetString(status == 2 ? PyExc_IndexError : PyExc_RuntimeError, self->error());
    return nullptr;
  }
  PyObject* result = PyTuple_New(self->num_outputs);
  for (Py_ssize_t k = 0; k < self->num_outputs; ++k) {
    auto* tensor = static_cast<at::Tensor*>(outputs.data[k]);
    PyObject* wrapped = result != nullptr ? THPVariable_Wrap(std::move(*tensor)) : nullptr;
    delete tensor;
    if (result != nullptr) {
      if (wrapped == nullptr) Py_CLEAR(result);
      else PyTuple_SET_ITEM(result, k, wrapped);
    }
  }
  return result;
}

PyObject* graph_call_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  unsigned long long entry = 0, error = 0;
  Py_ssize_t num_outputs = 0;
  static const char* names[] = {"entry", "error", "num_outputs", nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "KKn", const_cast<char**>(names), &entry, &error, &num_outputs))
    return nullptr;
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
  return reinterpret_cast<PyObject*>(self);
}

PyTypeObject GraphCallType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyObject* stamp(PyObject*, PyObject* tensors) {
  PyObject* seq = PySequence_Fast(tensors, "stamp takes a sequence of tensors");
  if (seq == nullptr) return nullptr;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  PyObject** items = PySequence_Fast_ITEMS(seq);
  PyObject* result = PyBytes_FromStringAndSize(nullptr, n * 3 * sizeof(uint64_t));
  if (result == nullptr) { Py_DECREF(seq); return nullptr; }
  auto* out = reinterpret_cast<uint64_t*>(PyBytes_AS_STRING(result));
  for (Py_ssize_t k = 0; k < n; ++k) {
    if (!THPVariable_Check(items[k])) {
      Py_DECREF(seq); Py_DECREF(result);
      PyErr_Format(PyExc_TypeError, "stamp takes tensors; item %zd is %s", k, Py_TYPE(items[k])->tp_name);
      return nullptr;
    }
    const at::Tensor& t = THPVariable_Unpack(items[k]);
    out[3 * k] = reinterpret_cast<uintptr_t>(t.unsafeGetTensorImpl());
    // Inference tensors have no version counter (they cannot be written in place outside inference mode).
    out[3 * k + 1] = t.is_inference() ? 0 : t.unsafeGetTensorImpl()->version_counter().current_version();
    out[3 * k + 2] = reinterpret_cast<uintptr_t>(t.has_storage() ? t.const_data_ptr() : nullptr);
  }
  Py_DECREF(seq);
  return result;
}

PyMethodDef methods[] = {
    {"stamp", stamp, METH_O, "Identity, version counter and data pointer of each tensor, as bytes."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "kiln_python", "kiln's door from Python into C++ wrappers.", -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit_kiln_python(void) {
  GraphCallType.tp_name = "kiln_python.GraphCall";
  GraphCallType.tp_basicsize = sizeof(GraphCall);
  GraphCallType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL;
  GraphCallType.tp_vectorcall_offset = offsetof(GraphCall, vectorcall);
  GraphCallType.tp_call = PyVectorcall_Call;
  GraphCallType.tp_new = graph_call_new;
  GraphCallType.tp_doc = "GraphCall(entry, error, num_outputs): a C++ wrapper's entry as (*tensors) -> tuple.";
  if (PyType_Ready(&GraphCallType) < 0) return nullptr;
  PyObject* m = PyModule_Create(&module);
  if (m == nullptr) return nullptr;
  Py_INCREF(&GraphCallType);
  if (PyModule_AddObject(m, "GraphCall", reinterpret_cast<PyObject*>(&GraphCallType)) < 0) {
    Py_DECREF(&GraphCallType);
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
