// tensor_facts(args, alignment): the memo key of a launcher's eager call (torch_aura/_checks/common.py), read
// from the tensors' C++ side. In Python each tensor's shape, strides, dtype, device and data pointer are five
// attribute reads and a tuple (~0.6 us); a decode step's eight tensors cost ~5 us of a 25 us budget. Here one
// bytes object holds every tensor's facts (hashable, compared exactly), followed by the other arguments.
#include <Python.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>
#include <string>

namespace torch_aura_detail {

namespace {
// an argument's tag in the packed facts: what the values after it are
constexpr int64_t kNone = 0, kTensor = 1, kOther = 2;

void put(std::string& out, int64_t v) { out.append(reinterpret_cast<const char*>(&v), sizeof v); }
}  // namespace

// tensor_facts(args: tuple, alignment: bool) -> (bytes, *the arguments that are neither tensors nor None)
PyObject* tensor_facts(PyObject*, PyObject* const* argv, Py_ssize_t argc) {
  if (argc != 2 || !PyTuple_Check(argv[0])) {
    PyErr_SetString(PyExc_TypeError, "tensor_facts(args: tuple, alignment: bool)");
    return nullptr;
  }
  const int alignment = PyObject_IsTrue(argv[1]);
  if (alignment < 0) return nullptr;
  PyObject* args = argv[0];
  const Py_ssize_t n = PyTuple_GET_SIZE(args);
  std::string packed;
  packed.reserve(static_cast<size_t>(n) * 14 * sizeof(int64_t));
  Py_ssize_t others = 0;
  try {
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* a = PyTuple_GET_ITEM(args, i);
      if (a == Py_None) {
        put(packed, kNone);
      } else if (THPVariable_Check(a)) {
        const at::Tensor& t = THPVariable_Unpack(a);
        put(packed, kTensor);
        const auto sizes = t.sizes();  // symbolic sizes (a trace) throw: the caller then checks every call
        const auto strides = t.strides();
        put(packed, static_cast<int64_t>(sizes.size()));
        for (int64_t s : sizes) put(packed, s);
        for (int64_t s : strides) put(packed, s);
        put(packed, static_cast<int64_t>(t.scalar_type()));
        put(packed, static_cast<int64_t>(t.device().type()));
        put(packed, static_cast<int64_t>(t.device().index()));
        if (alignment) put(packed, static_cast<int64_t>(reinterpret_cast<uintptr_t>(t.data_ptr()) & 15));
      } else {
        put(packed, kOther);
        ++others;
      }
    }
  } catch (const std::exception& e) {
    PyErr_Format(PyExc_TypeError, "tensor_facts: %s", e.what());  // remembered() checks such calls every time
    return nullptr;
  }
  PyObject* key = PyTuple_New(1 + others);
  if (key == nullptr) return nullptr;
  PyObject* bytes = PyBytes_FromStringAndSize(packed.data(), static_cast<Py_ssize_t>(packed.size()));
  if (bytes == nullptr) {
    Py_DECREF(key);
    return nullptr;
  }
  PyTuple_SET_ITEM(key, 0, bytes);
  Py_ssize_t at = 1;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* a = PyTuple_GET_ITEM(args, i);
    if (a != Py_None && !THPVariable_Check(a)) {
      Py_INCREF(a);
      PyTuple_SET_ITEM(key, at++, a);
    }
  }
  return key;
}

}  // namespace torch_aura_detail
