/* A recorded plan's Triton launches replayed in one C call (triton_kernels/_native.py, docs/gdn.md 6.1).
 *
 * A Program holds, per launch, the kernel's parameter block exactly as Triton 3.6's generated launcher
 * builds it (each parameter at its own offset, the global and profile scratch pointers last), with holes:
 * a device address (an address-table entry plus a constant offset) or a TMA descriptor encoded from one.
 * replay(addresses, main stream, side stream) patches the holes into a copy of each block and calls
 * cuLaunchKernelEx; stream steps ("wait", "enter", "exit") fork the side stream from the main one and
 * join it back, as torch's Stream.wait_stream does. No Python object is touched per launch.
 *
 * The driver is reached through dlopen (no link-time libcuda), so this file compiles and its tests run on a
 * machine without a GPU: record(list) swaps the driver calls for ones that append what they were handed. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

#include "cuda.h"

#define MAX_ADDRESSES 64
#define MAX_PARAMS 256
#define MAX_BLOCK 16384 /* bytes of one launch's parameter block: ~2 KB for the GDN kernels */
#define MAP_BYTES 128   /* sizeof(CUtensorMap) */

enum { OP_LAUNCH = 0, OP_WAIT = 1, OP_ENTER = 2, OP_EXIT = 3 };

typedef struct {
  uint32_t at; /* byte offset in the block */
  int32_t address;
  int64_t add;
} PointerHole;

typedef struct {
  uint32_t at;
  int32_t address;
  int64_t add;
  int32_t dtype, rank, swizzle, fill;
  cuuint64_t shape[5], strides[5];
  cuuint32_t box[5];
  int cached; /* map holds the encoding at base last: encoding is a pure function of its arguments */
  uint64_t last;
  _Alignas(128) unsigned char map[MAP_BYTES];
} MapHole;

typedef struct {
  int kind;
  CUfunction function;
  unsigned grid[3], warps, ctas, shared;
  int cooperative, pdl;
  unsigned char *block; /* 128-byte aligned template: holes zero */
  uint32_t block_size, n_params, n_pointers, n_maps;
  uint32_t *param_at;
  PointerHole *pointers;
  MapHole *maps; /* 128-byte aligned array */
} Op;

typedef struct {
  PyObject_HEAD int n_ops, n_addresses;
  Op *ops;
  CUevent events[2]; /* fork and join: created at the first replay that needs them */
  int stand_in_events; /* created by record()'s stand-ins: not the driver's to destroy */
} Program;

/* ------------------------------------------------------------------------------ the driver table */
typedef CUresult (*launch_t)(const CUlaunchConfig *, CUfunction, void **, void **);
typedef CUresult (*encode_t)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                             const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                             CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
typedef CUresult (*event_create_t)(CUevent *, unsigned int);
typedef CUresult (*event_destroy_t)(CUevent);
typedef CUresult (*event_record_t)(CUevent, CUstream);
typedef CUresult (*stream_wait_t)(CUstream, CUevent, unsigned int);
typedef CUresult (*error_string_t)(CUresult, const char **);
typedef CUresult (*ctx_get_t)(CUcontext *);
typedef CUresult (*device_get_t)(CUdevice *, int);
typedef CUresult (*primary_retain_t)(CUcontext *, CUdevice);
typedef CUresult (*ctx_set_t)(CUcontext);

static struct {
  int loaded;
  launch_t launch;
  encode_t encode;
  event_create_t event_create;
  event_destroy_t event_destroy;
  event_record_t event_record;
  stream_wait_t stream_wait;
  error_string_t error_string;
  ctx_get_t ctx_get;
  device_get_t device_get;
  primary_retain_t primary_retain;
  ctx_set_t ctx_set;
} drv;

static PyObject *g_log = NULL;   /* record(): the list the stand-ins append to */
static const Op *g_op = NULL;     /* the launch the stand-in launch records */
static unsigned long long g_events = 0;

static int load_driver(void) {
  if (drv.loaded) return 0;
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    PyErr_Format(PyExc_RuntimeError, "native replay: cannot load libcuda.so.1 (%s)", dlerror());
    return -1;
  }
#define SYM(field, name)                                                                  \
  if (!(drv.field = (__typeof__(drv.field))dlsym(lib, name))) {                           \
    PyErr_Format(PyExc_RuntimeError, "native replay: libcuda.so.1 lacks %s", name);      \
    return -1;                                                                            \
  }
  SYM(launch, "cuLaunchKernelEx");
  SYM(encode, "cuTensorMapEncodeTiled");
  SYM(event_create, "cuEventCreate");
  SYM(event_destroy, "cuEventDestroy_v2");
  SYM(event_record, "cuEventRecord");
  SYM(stream_wait, "cuStreamWaitEvent");
  SYM(error_string, "cuGetErrorString");
  SYM(ctx_get, "cuCtxGetCurrent");
  SYM(device_get, "cuDeviceGet");
  SYM(primary_retain, "cuDevicePrimaryCtxRetain");
  SYM(ctx_set, "cuCtxSetCurrent");
#undef SYM
  drv.loaded = 1;
  return 0;
}

static int check(CUresult res, const char *what) {
  if (res == CUDA_SUCCESS) return 0;
  const char *str = NULL;
  if (drv.error_string) drv.error_string(res, &str);
  PyErr_Format(PyExc_RuntimeError, "Triton Error [CUDA]: %s: %s", what, str ? str : "unknown error");
  return -1;
}

/* Triton's launcher makes the device's primary context current where no context is (its ensureCudaContext) */
static int ensure_context(void) {
  CUcontext ctx;
  if (check(drv.ctx_get(&ctx), "cuCtxGetCurrent")) return -1;
  if (ctx) return 0;
  CUdevice device;
  if (check(drv.device_get(&device, 0), "cuDeviceGet")) return -1;
  if (check(drv.primary_retain(&ctx, device), "cuDevicePrimaryCtxRetain")) return -1;
  return check(drv.ctx_set(ctx), "cuCtxSetCurrent");
}

/* ------------------------------------------------------------------------------ record() stand-ins */
static int append(PyObject *item) {
  if (!g_log) { /* record(False): the stand-ins keep nothing */
    Py_XDECREF(item);
    return 0;
  }
  if (!item) return -1;
  int rc = PyList_Append(g_log, item);
  Py_DECREF(item);
  return rc;
}

static CUresult rec_launch(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
  (void)extra;
  if (!g_log) return CUDA_SUCCESS;
  const unsigned char *start = (const unsigned char *)params[0] - g_op->param_at[0];
  PyObject *block = PyBytes_FromStringAndSize((const char *)start, g_op->block_size);
  if (!block) return CUDA_ERROR_UNKNOWN;
  PyObject *at = PyTuple_New(g_op->n_params); /* where each parameter pointer points, in the block */
  for (uint32_t i = 0; at && i < g_op->n_params; ++i)
    PyTuple_SET_ITEM(at, i, PyLong_FromLong((const unsigned char *)params[i] - start));
  int coop = 0, pdl = 0, cluster = 1;
  for (unsigned i = 0; i < c->numAttrs; ++i) {
    if (c->attrs[i].id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE) coop = 1;
    if (c->attrs[i].id == CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION) pdl = 1;
    if (c->attrs[i].id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION) cluster = c->attrs[i].value.clusterDim.x;
  }
  if (!at) {
    Py_DECREF(block);
    return CUDA_ERROR_UNKNOWN;
  }
  return append(Py_BuildValue("(sK(III)IIKiiiNN)", "launch", (unsigned long long)(uintptr_t)f, c->gridDimX,
                              c->gridDimY, c->gridDimZ, c->blockDimX, c->sharedMemBytes,
                              (unsigned long long)(uintptr_t)c->hStream, cluster, coop, pdl, block, at))
             ? CUDA_ERROR_UNKNOWN
             : CUDA_SUCCESS;
}

static PyObject *u64_tuple(const void *values, int n, int wide) {
  PyObject *t = PyTuple_New(n);
  for (int i = 0; t && i < n; ++i)
    PyTuple_SET_ITEM(t, i, PyLong_FromUnsignedLongLong(wide ? ((const cuuint64_t *)values)[i]
                                                            : ((const cuuint32_t *)values)[i]));
  return t;
}

static CUresult rec_encode(CUtensorMap *map, CUtensorMapDataType dtype, cuuint32_t rank, void *address,
                           const cuuint64_t *shape, const cuuint64_t *strides, const cuuint32_t *box,
                           const cuuint32_t *element_strides, CUtensorMapInterleave interleave,
                           CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill fill) {
  (void)element_strides, (void)interleave, (void)l2;
  memset(map, 0, MAP_BYTES);
  uint64_t a = (uint64_t)(uintptr_t)address;
  memcpy(map, &a, sizeof a); /* a stand-in encoding: the base first, so a recorded block shows it */
  if (!g_log) return CUDA_SUCCESS;
  return append(Py_BuildValue("(siIKNNNii)", "encode", (int)dtype, rank, (unsigned long long)a,
                              u64_tuple(shape, rank, 1), u64_tuple(strides, rank - 1, 1), u64_tuple(box, rank, 0),
                              (int)swizzle, (int)fill))
             ? CUDA_ERROR_UNKNOWN
             : CUDA_SUCCESS;
}

static CUresult rec_event_create(CUevent *event, unsigned int flags) {
  (void)flags;
  *event = (CUevent)(uintptr_t)(++g_events);
  return CUDA_SUCCESS;
}

static CUresult rec_event_destroy(CUevent event) {
  return append(Py_BuildValue("(sK)", "destroy", (unsigned long long)(uintptr_t)event)) ? CUDA_ERROR_UNKNOWN
                                                                                        : CUDA_SUCCESS;
}

static CUresult rec_event_record(CUevent event, CUstream stream) {
  return append(Py_BuildValue("(sKK)", "record", (unsigned long long)(uintptr_t)event,
                              (unsigned long long)(uintptr_t)stream))
             ? CUDA_ERROR_UNKNOWN
             : CUDA_SUCCESS;
}

static CUresult rec_stream_wait(CUstream stream, CUevent event, unsigned int flags) {
  (void)flags;
  return append(Py_BuildValue("(sKK)", "wait", (unsigned long long)(uintptr_t)stream,
                              (unsigned long long)(uintptr_t)event))
             ? CUDA_ERROR_UNKNOWN
             : CUDA_SUCCESS;
}

static CUresult rec_ctx_get(CUcontext *ctx) {
  *ctx = (CUcontext)(uintptr_t)1;
  return CUDA_SUCCESS;
}

/* record(log): every later replay appends what each driver call was handed to log instead of calling the
 * driver; record(False): stand-ins that keep nothing (timing without a GPU); record(None): the driver again */
static PyObject *record(PyObject *self, PyObject *log) {
  (void)self;
  if (log != Py_None && log != Py_False && !PyList_Check(log))
    return PyErr_Format(PyExc_TypeError, "record: a list, False or None");
  Py_XDECREF(g_log);
  g_log = NULL;
  memset(&drv, 0, sizeof drv);
  if (log != Py_None) {
    if (log != Py_False) {
      Py_INCREF(log);
      g_log = log;
    }
    drv.launch = rec_launch;
    drv.encode = rec_encode;
    drv.event_create = rec_event_create;
    drv.event_destroy = rec_event_destroy;
    drv.event_record = rec_event_record;
    drv.stream_wait = rec_stream_wait;
    drv.ctx_get = rec_ctx_get;
    drv.loaded = 1;
  }
  Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------------ building a Program */
static void free_ops(Program *p) {
  for (int i = 0; p->ops && i < p->n_ops; ++i) {
    Op *op = &p->ops[i];
    free(op->block);
    free(op->param_at);
    free(op->pointers);
    free(op->maps);
  }
  free(p->ops);
  p->ops = NULL;
}

static int u64s(PyObject *seq, cuuint64_t *out, int n) {
  if (!PyTuple_Check(seq) || PyTuple_GET_SIZE(seq) != n) {
    PyErr_SetString(PyExc_ValueError, "Program: a map hole's shape, strides or box has the wrong rank");
    return -1;
  }
  for (int i = 0; i < n; ++i) {
    out[i] = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(seq, i));
    if (PyErr_Occurred()) return -1;
  }
  return 0;
}

static void *aligned(size_t n) {
  void *p = NULL;
  return posix_memalign(&p, 128, n ? n : 128) ? NULL : p;
}

/* a launch: (function, (gx, gy, gz), warps, ctas, shared, cooperative, pdl, block bytes, param offsets (tuple),
 *            pointer holes ((at, address, add), ...), map holes ((at, address, add, dtype, rank, swizzle, fill,
 *            shape, strides, box), ...)) -- shape, strides (bytes; rank - 1 used) and box innermost first */
static int build_launch(Op *op, PyObject *spec, int n_addresses) {
  unsigned long long function;
  const char *block;
  Py_ssize_t block_size;
  PyObject *params, *pointers, *maps;
  if (!PyArg_ParseTuple(spec, "K(III)IIIppy#O!O!O!", &function, &op->grid[0], &op->grid[1], &op->grid[2],
                        &op->warps, &op->ctas, &op->shared, &op->cooperative, &op->pdl, &block, &block_size,
                        &PyTuple_Type, &params, &PyTuple_Type, &pointers, &PyTuple_Type, &maps))
    return -1;
  op->kind = OP_LAUNCH;
  op->function = (CUfunction)(uintptr_t)function;
  if (block_size > MAX_BLOCK || PyTuple_GET_SIZE(params) > MAX_PARAMS || PyTuple_GET_SIZE(params) == 0) {
    PyErr_SetString(PyExc_ValueError, "Program: a launch's parameters exceed the replay's bounds");
    return -1;
  }
  op->block_size = (uint32_t)block_size;
  op->n_params = (uint32_t)PyTuple_GET_SIZE(params);
  op->n_pointers = (uint32_t)PyTuple_GET_SIZE(pointers);
  op->n_maps = (uint32_t)PyTuple_GET_SIZE(maps);
  op->block = aligned(block_size);
  op->param_at = malloc(sizeof(uint32_t) * op->n_params);
  op->pointers = malloc(sizeof(PointerHole) * (op->n_pointers ? op->n_pointers : 1));
  op->maps = aligned(sizeof(MapHole) * op->n_maps);
  if (!op->block || !op->param_at || !op->pointers || !op->maps) {
    PyErr_NoMemory();
    return -1;
  }
  memcpy(op->block, block, block_size);
  for (uint32_t i = 0; i < op->n_params; ++i) {
    unsigned long at = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(params, i));
    if (PyErr_Occurred()) return -1;
    if (at >= (unsigned long)block_size) {
      PyErr_SetString(PyExc_ValueError, "Program: a parameter outside its block");
      return -1;
    }
    op->param_at[i] = (uint32_t)at;
  }
  for (uint32_t i = 0; i < op->n_pointers; ++i) {
    PointerHole *h = &op->pointers[i];
    long long add;
    if (!PyArg_ParseTuple(PyTuple_GET_ITEM(pointers, i), "IiL", &h->at, &h->address, &add)) return -1;
    h->add = add;
    if (h->at + 8 > op->block_size || h->address < 0 || h->address >= n_addresses) {
      PyErr_SetString(PyExc_ValueError, "Program: a pointer hole outside its block or address table");
      return -1;
    }
  }
  memset(op->maps, 0, sizeof(MapHole) * op->n_maps);
  for (uint32_t i = 0; i < op->n_maps; ++i) {
    MapHole *h = &op->maps[i];
    long long add;
    PyObject *shape, *strides, *box;
    if (!PyArg_ParseTuple(PyTuple_GET_ITEM(maps, i), "IiLiiiiOOO", &h->at, &h->address, &add, &h->dtype, &h->rank,
                          &h->swizzle, &h->fill, &shape, &strides, &box))
      return -1;
    h->add = add;
    if (h->at % 128 || h->at + MAP_BYTES > op->block_size || h->address < 0 || h->address >= n_addresses ||
        h->rank < 1 || h->rank > 5) {
      PyErr_SetString(PyExc_ValueError, "Program: a map hole misplaced, or of a rank outside 1-5");
      return -1;
    }
    cuuint64_t box64[5];
    if (u64s(shape, h->shape, h->rank) || u64s(strides, h->strides, h->rank - 1) || u64s(box, box64, h->rank))
      return -1;
    for (int d = 0; d < h->rank; ++d) h->box[d] = (cuuint32_t)box64[d];
  }
  return 0;
}

static int Program_init(Program *self, PyObject *args, PyObject *kwargs) {
  PyObject *ops;
  int n_addresses;
  static char *names[] = {"ops", "n_addresses", NULL};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!i", names, &PyTuple_Type, &ops, &n_addresses)) return -1;
  if (n_addresses < 0 || n_addresses > MAX_ADDRESSES) {
    PyErr_SetString(PyExc_ValueError, "Program: too many addresses");
    return -1;
  }
  free_ops(self);
  self->n_ops = (int)PyTuple_GET_SIZE(ops);
  self->n_addresses = n_addresses;
  self->ops = calloc(self->n_ops ? self->n_ops : 1, sizeof(Op));
  if (!self->ops) {
    PyErr_NoMemory();
    return -1;
  }
  for (int i = 0; i < self->n_ops; ++i) {
    PyObject *spec = PyTuple_GET_ITEM(ops, i);
    if (PyLong_Check(spec)) {
      long kind = PyLong_AsLong(spec);
      if (kind < OP_WAIT || kind > OP_EXIT) {
        PyErr_SetString(PyExc_ValueError, "Program: a stream step is 1 (wait), 2 (enter) or 3 (exit)");
        return -1;
      }
      self->ops[i].kind = (int)kind;
    } else if (build_launch(&self->ops[i], spec, n_addresses)) {
      return -1;
    }
  }
  return 0;
}

static void Program_dealloc(Program *self) {
  free_ops(self);
  /* a plan per new length would otherwise leak its two events; the driver frees an event still pending
   * once the work it marks completes, and streams already waiting on it are unaffected */
  if ((self->events[0] || self->events[1]) && !self->stand_in_events) {
    if (load_driver() == 0) {
      for (int i = 0; i < 2; ++i)
        if (self->events[i]) drv.event_destroy(self->events[i]);
    } else {
      PyErr_Clear(); /* no driver to hand them back to */
    }
  }
  Py_TYPE(self)->tp_free((PyObject *)self);
}

/* ------------------------------------------------------------------------------ replay */
static int launch_op(Op *op, const uint64_t *addresses, CUstream stream) {
  _Alignas(128) unsigned char block[MAX_BLOCK];
  void *params[MAX_PARAMS];
  memcpy(block, op->block, op->block_size);
  for (uint32_t i = 0; i < op->n_pointers; ++i) {
    const PointerHole *h = &op->pointers[i];
    uint64_t value = addresses[h->address] + (uint64_t)h->add;
    memcpy(block + h->at, &value, sizeof value);
  }
  for (uint32_t i = 0; i < op->n_maps; ++i) {
    MapHole *h = &op->maps[i];
    uint64_t base = addresses[h->address] + (uint64_t)h->add;
    if (!h->cached || h->last != base) {
      static const cuuint32_t element_strides[5] = {1, 1, 1, 1, 1};
      h->cached = 0;
      if (check(drv.encode((CUtensorMap *)h->map, (CUtensorMapDataType)h->dtype, (cuuint32_t)h->rank,
                           (void *)(uintptr_t)base, h->shape, h->strides, h->box, element_strides,
                           CU_TENSOR_MAP_INTERLEAVE_NONE, (CUtensorMapSwizzle)h->swizzle,
                           CU_TENSOR_MAP_L2_PROMOTION_L2_128B, (CUtensorMapFloatOOBfill)h->fill),
                "cuTensorMapEncodeTiled"))
        return -1;
      h->cached = 1;
      h->last = base;
    }
    memcpy(block + h->at, h->map, MAP_BYTES);
  }
  if ((unsigned long long)op->grid[0] * op->grid[1] * op->grid[2] == 0) return 0; /* as Triton's launcher */
  for (uint32_t i = 0; i < op->n_params; ++i) params[i] = block + op->param_at[i];
  CUlaunchAttribute attrs[4];
  unsigned n = 0;
  if (op->pdl) {
    attrs[n].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attrs[n++].value.programmaticStreamSerializationAllowed = 1;
  }
  if (op->cooperative) {
    attrs[n].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    attrs[n++].value.cooperative = 1;
  }
  if (op->ctas != 1) {
    memset(&attrs[n], 0, sizeof attrs[n]);
    attrs[n].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attrs[n].value.clusterDim.x = op->ctas;
    attrs[n].value.clusterDim.y = 1;
    attrs[n++].value.clusterDim.z = 1;
    memset(&attrs[n], 0, sizeof attrs[n]);
    attrs[n].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE;
    attrs[n++].value.clusterSchedulingPolicyPreference = CU_CLUSTER_SCHEDULING_POLICY_SPREAD;
  }
  CUlaunchConfig config;
  memset(&config, 0, sizeof config);
  config.gridDimX = op->grid[0] * op->ctas;
  config.gridDimY = op->grid[1];
  config.gridDimZ = op->grid[2];
  config.blockDimX = 32 * op->warps;
  config.blockDimY = config.blockDimZ = 1;
  config.sharedMemBytes = op->shared;
  config.hStream = stream;
  config.attrs = attrs;
  config.numAttrs = n;
  g_op = op;
  return check(drv.launch(&config, op->function, params, NULL), "cuLaunchKernelEx");
}

static int fork_join(Program *self, int which, CUstream from, CUstream to) {
  if (!self->events[which]) {
    if (check(drv.event_create(&self->events[which], CU_EVENT_DISABLE_TIMING), "cuEventCreate")) return -1;
    self->stand_in_events = drv.event_create == rec_event_create;
  }
  if (check(drv.event_record(self->events[which], from), "cuEventRecord")) return -1;
  return check(drv.stream_wait(to, self->events[which], 0), "cuStreamWaitEvent");
}

/* replay(addresses: tuple of ints, stream: int, side_stream: int) -> None; holds the GIL throughout, so the
 * map caches and events are never shared by two replays at once */
static PyObject *Program_replay(Program *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 3 || !PyTuple_Check(args[0]))
    return PyErr_Format(PyExc_TypeError, "replay(addresses: tuple, stream: int, side_stream: int)");
  if (PyTuple_GET_SIZE(args[0]) != self->n_addresses)
    return PyErr_Format(PyExc_ValueError, "replay: %d addresses expected, got %zd", self->n_addresses,
                        PyTuple_GET_SIZE(args[0]));
  uint64_t addresses[MAX_ADDRESSES];
  for (int i = 0; i < self->n_addresses; ++i) addresses[i] = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(args[0], i));
  CUstream main = (CUstream)(uintptr_t)PyLong_AsUnsignedLongLong(args[1]);
  CUstream side = (CUstream)(uintptr_t)PyLong_AsUnsignedLongLong(args[2]);
  if (PyErr_Occurred()) return NULL;
  if (load_driver() || ensure_context()) return NULL;
  CUstream stream = main;
  for (int i = 0; i < self->n_ops; ++i) {
    Op *op = &self->ops[i];
    int rc = 0;
    switch (op->kind) {
      case OP_LAUNCH: rc = launch_op(op, addresses, stream); break;
      case OP_WAIT: rc = fork_join(self, 0, main, side); break;
      case OP_ENTER: stream = side; break;
      case OP_EXIT: rc = fork_join(self, 1, side, main), stream = main; break;
    }
    if (rc) return NULL;
  }
  Py_RETURN_NONE;
}

static PyMethodDef Program_methods[] = {
    {"replay", (PyCFunction)(void (*)(void))Program_replay, METH_FASTCALL, "replay(addresses, stream, side_stream)"},
    {NULL, NULL, 0, NULL}};

static PyTypeObject ProgramType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "native_replay.Program",
    .tp_basicsize = sizeof(Program),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Program_init,
    .tp_dealloc = (destructor)Program_dealloc,
    .tp_methods = Program_methods,
};

static PyMethodDef module_methods[] = {
    {"record", record, METH_O, "record(list | None): stand-ins that append what each driver call was handed"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "native_replay", NULL, -1, module_methods};

PyMODINIT_FUNC PyInit_native_replay(void) {
  if (PyType_Ready(&ProgramType) < 0) return NULL;
  PyObject *m = PyModule_Create(&module_def);
  if (!m) return NULL;
  Py_INCREF(&ProgramType);
  if (PyModule_AddObject(m, "Program", (PyObject *)&ProgramType) < 0) {
    Py_DECREF(&ProgramType);
    Py_DECREF(m);
    return NULL;
  }
  PyModule_AddIntConstant(m, "MAX_ADDRESSES", MAX_ADDRESSES);
  return m;
}
