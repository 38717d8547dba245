"""A recorded plan's launches as one C call: ``native_replay.c``'s ``Program`` (docs/gdn.md §6.1).

A planned ``gdn_chunk`` call replayed in Python pays per launch a Python call into Triton's C launcher,
which parses every argument again (50-60 for the GDN kernels). Here each launch's parameter block is
built once, as Triton 3.6's generated launcher builds it from the same arguments (:func:`parameters`,
:func:`pack`), and a call only patches its device addresses and TMA descriptors into copies of the
blocks and launches them, all in C.

The module is compiled from its source on first use by Triton's own launcher builder (the C compiler and
the CUDA driver header that Triton's launchers need, nothing more: the driver is opened with ``dlopen``),
and cached where Triton caches its launchers. :func:`module` is None where it cannot be built; plans then
replay in Python as before.
"""

from __future__ import annotations

import functools
import os
import struct
import warnings

# plans replay, and launchers that keep a program per geometry launch, in one C call; off: through Triton's launchers
ENABLED = True
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "native_replay.c")
WAIT, ENTER, EXIT = 1, 2, 3  # the stream steps of a plan's "event" ops, as the C file numbers them
_STEPS = {"wait": WAIT, "enter": ENTER, "exit": EXIT}
_INTS = {"i1": "b", "i8": "b", "i16": "h", "i32": "i", "i64": "q", "u1": "B", "u8": "B", "u16": "H", "u32": "I",
         "u64": "Q"}
_FLOATS = {"fp16": "e", "fp32": "f", "f32": "f", "fp64": "d"}  # bf16: fp32's top half, as Triton's pack_bf16
_MAP_BYTES = 128


@functools.cache
def module():
    """The compiled ``native_replay`` module, or None (warned once) where Triton cannot build it here."""
    try:
        from triton.backends.nvidia.driver import include_dirs
        from triton.runtime.build import compile_module_from_src

        with open(SOURCE) as f:
            return compile_module_from_src(f.read(), "native_replay", include_dirs=list(include_dirs))
    except Exception as e:  # no C compiler, another Triton layout: plans replay in Python
        warnings.warn(f"torch_aura: GDN plans replay in Python: native_replay.c did not build "
                      f"({type(e).__name__}: {e})", RuntimeWarning, stacklevel=2)
        return None


class Pointer:
    """A device-address parameter filled per call: address-table entry ``address`` plus ``add`` bytes."""

    __slots__ = ("address", "add")

    def __init__(self, address: int, add: int = 0):
        self.address, self.add = address, add


class Descriptor:
    """A host tensor descriptor (``TensorDescriptor``) over address-table entry ``address`` plus ``add``."""

    __slots__ = ("address", "add", "shape", "strides", "block_shape", "padding")

    def __init__(self, address, add, shape, strides, block_shape, padding):
        self.address, self.add = address, add
        self.shape, self.strides, self.block_shape, self.padding = shape, strides, block_shape, padding


class _Map:
    """A CUtensorMap parameter: the arguments of Triton's ``fill_tma_descriptor`` for one descriptor."""

    __slots__ = ("address", "add", "dtype", "elem_size", "block", "shape", "strides", "fill", "swizzle")


def parameters(signature: list, tensordesc_meta, args: list) -> list[tuple[str, object]]:
    """The kernel parameters Triton 3.6's launcher hands ``cuLaunchKernelEx`` for ``args`` (one per signature
    entry, in order), scratch pointers aside: ``(type, value)`` each, constexprs dropped, each descriptor
    expanded as ``make_tensordesc_arg`` and ``make_launcher``'s ``_expand_signature`` expand it."""
    from triton.backends.nvidia.driver import TMA_DTYPE_DEVICE_TO_HOST

    out, metas = [], iter(tensordesc_meta or ())
    for ty, value in zip(signature, args, strict=True):
        if isinstance(ty, tuple):
            raise ValueError("a tuple parameter")  # Triton flattens them; no GDN kernel takes one
        if not ty.startswith("tensordesc"):
            if ty != "constexpr":
                out.append((ty, value))
            continue
        meta = next(metas, None)
        if not isinstance(value, Descriptor):
            raise ValueError("a descriptor parameter whose base the plan does not fill")
        dtype = ty[ty.index("<") + 1:ty.index("[")]
        shape, strides = list(value.shape), list(value.strides)
        if meta is None:  # lowered without TMA: base, shape, strides, the NaN padding flag, shape and strides again
            out.append(("*" + dtype, Pointer(value.address, value.add)))
            out += [("i64", s) for s in (*shape, *strides)] + [("i1", value.padding == "nan")]
        else:
            if meta["fp4_padded"]:
                shape[-1] *= 2
            m = _Map()
            m.address, m.add, m.elem_size, m.swizzle = value.address, value.add, meta["elem_size"], meta["swizzle"]
            m.dtype = TMA_DTYPE_DEVICE_TO_HOST[meta["elem_type"]]
            m.block, m.shape, m.strides = list(meta["block_size"]), shape, strides
            m.fill = 1 if value.padding == "nan" else 0
            out.append(("nvTmaDesc", m))
        out += [("i32", s) for s in shape] + [("i64", s) for s in strides]
    return out


def _map_hole(at: int, m: _Map) -> tuple:
    """``fill_tma_descriptor``'s encoding arguments, innermost dimension first, strides in bytes."""
    if m.strides[-1] != 1:
        raise ValueError("a descriptor whose last dimension is strided")  # Triton asserts it too
    strides = tuple(m.elem_size * s for s in reversed(m.strides[:-1]))
    return (at, m.address, m.add, m.dtype, len(m.shape), m.swizzle, m.fill, tuple(reversed(m.shape)), strides,
            tuple(reversed(m.block)))


def pack(params: list[tuple[str, object]], scratch: Pointer | None) -> tuple:
    """One launch's parameter block: ``(block bytes, offset of each parameter, pointer holes, map holes)``, each
    parameter at its type's natural alignment (maps at 128 bytes), the global and profile scratch pointers last
    as Triton's launcher appends them (``scratch``: where the global one is; the profile one is null)."""
    block, offsets, pointers, maps = bytearray(), [], [], []

    def put(data: bytes, align: int) -> int:
        block.extend(bytes(-len(block) % align))
        offsets.append(len(block))
        block.extend(data)
        return offsets[-1]

    for ty, value in [*params, ("*scratch", scratch), ("*profile", None)]:
        if ty == "nvTmaDesc":
            maps.append(_map_hole(put(bytes(_MAP_BYTES), _MAP_BYTES), value))
        elif ty[0] == "*":
            at = put(bytes(8) if isinstance(value, Pointer) or value is None else struct.pack("<Q", value), 8)
            if isinstance(value, Pointer):
                pointers.append((at, value.address, value.add))
        elif ty in _INTS:
            fmt = "<" + _INTS[ty]
            put(struct.pack(fmt, value), struct.calcsize(fmt))
        elif ty == "bf16":
            put(struct.pack("<f", value)[2:], 2)
        elif ty in _FLOATS:
            fmt = "<" + _FLOATS[ty]
            put(struct.pack(fmt, value), struct.calcsize(fmt))
        else:
            raise ValueError(f"a parameter of type {ty}")
    return bytes(block), tuple(offsets), tuple(pointers), tuple(maps)


def launch_spec(compiled, function: int, packed: tuple, prefix: tuple, grid: tuple, args: list,
                scratch: Pointer | None = None) -> tuple:
    """One launch of a ``Program``: the compiled variant ``compiled`` (its signature and descriptor metadata) run
    on ``grid`` with ``args`` (every kernel argument in signature order, each device address a :class:`Pointer`
    or :class:`Descriptor`), ``function`` / ``packed`` / ``prefix`` as ``_launch.direct_launch`` gives them.
    Raises ValueError (or AttributeError) where the launch needs what a program cannot hold."""
    params = parameters(list(compiled.src.signature.values()), getattr(compiled.metadata, "tensordesc_meta", None),
                        args)
    block, offsets, pointers, maps = pack(params, scratch)
    warps, ctas, shared = packed[:3]
    return function, grid, warps, ctas, shared, prefix[1], prefix[2], block, offsets, pointers, maps


def step(name: str) -> int:
    """A plan's stream step as the C ``Program`` numbers it."""
    return _STEPS[name]
