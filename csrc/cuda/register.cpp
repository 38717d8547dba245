// torch_aura._C_cuda: implementations only. Every schema lives in torch_aura/_schema.py and is
// defined from Python before this module loads (torch_aura.backends.autoload).
#include <Python.h>
#include <torch/csrc/stable/library.h>

#include "ops.h"

// Importing the module runs the static registrations below; it exports nothing else.
extern "C" PyObject* PyInit__C_cuda(void) {
  static PyModuleDef def = {PyModuleDef_HEAD_INIT, "_C_cuda", "torch_aura CUDA kernels", -1, nullptr};
  return PyModule_Create(&def);
}

STABLE_TORCH_LIBRARY_IMPL(aura, CUDA, m) {
  m.impl("flash_decode", TORCH_BOX(&aura::flash_decode_cuda));
  m.impl("flash_decode_out", TORCH_BOX(&aura::flash_decode_out_cuda));
  m.impl("merge_attn_states", TORCH_BOX(&aura::merge_attn_states_cuda));
  m.impl("hadamard_rotate", TORCH_BOX(&aura::hadamard_rotate_cuda));
  m.impl("aura_encode", TORCH_BOX(&aura::aura_encode_cuda));
  m.impl("aura_write_cache", TORCH_BOX(&aura::aura_write_cache_cuda));
  m.impl("aura_append", TORCH_BOX(&aura::aura_append_cuda));
  m.impl("aura_dequantize", TORCH_BOX(&aura::aura_dequantize_cuda));
  m.impl("aura_flash_p1", TORCH_BOX(&aura::aura_flash_p1_cuda));
  m.impl("aura_flash_p2", TORCH_BOX(&aura::aura_flash_p2_cuda));
  m.impl("aura_decode", TORCH_BOX(&aura::aura_decode_cuda));
}
