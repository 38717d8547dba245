// torch_aura._C_autograd_t<major>_<minor>: the ops' Autograd-key kernel in C++, registered from Python
// (torch_aura/_registry.py) for the ops that return something to differentiate; and, as the package's one
// module built against LibTorch's C++ API, the launchers' memo keys read from the tensors' C++ side
// (tensor_facts.cpp).
//
// The ops are forward-only. The kernel is PyTorch's autogradNotImplementedFallback: it redispatches
// below autograd and, where an input requires grad, gives the outputs a grad_fn whose backward raises
// "derivative for aura::<op> is not implemented". A Python kernel for the key did the same with a
// round trip through the interpreter on every call, 10-20 us of an eager call's host time (decode.md §4).
//
// Not the stable ABI: torch/library.h and the autograd fallback have no stable surface, so this module
// is tied to the torch minor version it was built against, which setup.py puts in its name
// (AURA_AUTOGRAD_MODULE, e.g. _C_autograd_t2_13): under another torch, torch_aura finds no module of
// that name and keeps its Python kernel.
#include <Python.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

#include <memory>
#include <string>

namespace torch_aura_detail {
PyObject* tensor_facts(PyObject*, PyObject* const* argv, Py_ssize_t argc);  // tensor_facts.cpp
}

namespace {

// One IMPL library per namespace for the process's lifetime: the registrations live as long as it does.
std::unique_ptr<torch::Library> g_library;
std::string g_namespace;

// register_ops(namespace: str, names: tuple[str, ...]) -> None
PyObject* register_ops(PyObject*, PyObject* args) {
  const char* ns = nullptr;
  PyObject* names = nullptr;
  if (!PyArg_ParseTuple(args, "sO!", &ns, &PyTuple_Type, &names)) return nullptr;
  try {
    if (!g_library) {
      g_namespace = ns;
      g_library = std::make_unique<torch::Library>(torch::Library::IMPL, g_namespace, c10::DispatchKey::Autograd,
                                                   __FILE__, __LINE__);
    } else if (g_namespace != ns) {
      PyErr_Format(PyExc_ValueError, "torch_aura's autograd module serves one namespace (%s), asked for %s", g_namespace.c_str(), ns);
      return nullptr;
    }
    for (Py_ssize_t i = 0; i < PyTuple_Size(names); ++i) {
      const char* name = PyUnicode_AsUTF8(PyTuple_GetItem(names, i));
      if (name == nullptr) return nullptr;
      g_library->impl(name, torch::autograd::autogradNotImplementedFallback());
    }
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
  Py_RETURN_NONE;
}

PyMethodDef kMethods[] = {
    {"register_ops", register_ops, METH_VARARGS,
     "register_ops(namespace, names): PyTorch's not-implemented autograd kernel for each op"},
    {"tensor_facts", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(torch_aura_detail::tensor_facts)),
     METH_FASTCALL, "tensor_facts(args, alignment): the memo key of a launcher's call (tensor_facts.cpp)"},
    {nullptr, nullptr, 0, nullptr}};

#ifndef AURA_AUTOGRAD_MODULE
#error "setup.py names the module: -DAURA_AUTOGRAD_MODULE=_C_autograd_t<major>_<minor>"
#endif
#define AURA_STR2(x) #x
#define AURA_STR(x) AURA_STR2(x)
#define AURA_CAT2(a, b) a##b
#define AURA_CAT(a, b) AURA_CAT2(a, b)

PyModuleDef kModule = {PyModuleDef_HEAD_INIT, AURA_STR(AURA_AUTOGRAD_MODULE), "torch_aura's Autograd-key kernel", -1,
                       kMethods};

}  // namespace

extern "C" PyObject* AURA_CAT(PyInit_, AURA_AUTOGRAD_MODULE)(void) { return PyModule_Create(&kModule); }
