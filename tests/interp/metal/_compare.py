"""Running one op under the emulator and through its reference, and comparing the two."""

from __future__ import annotations

import torch

import _util
from torch_aura import reference
from torch_aura._schema import OPS

ORDERS = ("forward", "reverse", "shuffled")


def _clone(args):
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


def mutated(name: str, args: tuple) -> list:
    """The tensors a mutating op writes (its ``Tensor(a!)`` arguments, ``Tensor(a!)?`` ones when
    given), in schema order."""
    schema = getattr(torch.ops.aura, name).default._schema
    return [v for a, v in zip(schema.arguments, args)
            if a.alias_info is not None and a.alias_info.is_write and v is not None]


def results(name: str, args: tuple, out) -> list[torch.Tensor]:
    """What to compare: the returned tensors, then the mutated arguments."""
    outs = [] if out is None else list(out) if isinstance(out, tuple) else [out]
    return outs + mutated(name, args)


def reference_results(name: str, args: tuple) -> list[torch.Tensor]:
    args = _clone(args)
    return results(name, args, getattr(reference.FAMILIES[OPS[name].family], name)(*args))


def emulated_results(emu, name: str, args: tuple, order: str = "forward", seed: int = 0) -> list[torch.Tensor]:
    args = _clone(args)
    return results(name, args, emu.run_op(name, *args, lane_order=order, seed=seed))


def assert_matches(label: str, got: list[torch.Tensor], ref: list[torch.Tensor], ratio: float | None = None,
                   max_rel: float = _util.FP32_MAX_REL) -> None:
    """fp32 results within ``max_rel`` of the reference's scale; 16-bit ones by relative RMS."""
    assert len(got) == len(ref), label
    for i, (g, r) in enumerate(zip(got, ref)):
        assert g.dtype == r.dtype and g.shape == r.shape, f"{label}[{i}]: {g.dtype}{tuple(g.shape)} vs {r.dtype}{tuple(r.shape)}"
        if not g.is_floating_point():
            assert torch.equal(g, r), f"{label}[{i}]: integer results differ"
        elif g.dtype == torch.float32 and ratio is None:
            _util.assert_max_rel(f"{label}[{i}]", g, r, max_rel)
        else:
            _util.assert_close(f"{label}[{i}]", g.float(), r.float(), ratio or _util.RATIO[g.dtype])


def check_op(emu, name: str, args: tuple, orders=ORDERS, **tol) -> list[torch.Tensor]:
    """The op under every lane order equals the reference; returns the forward-order results."""
    ref = reference_results(name, args)
    first = None
    for k, order in enumerate(orders):
        got = emulated_results(emu, name, args, order, seed=k)
        assert_matches(f"{name} ({order})", got, ref, **tol)
        if first is None:
            first = got
        else:  # a race shows as a difference between lane orders, even inside the tolerance
            for a, b in zip(first, got):
                assert torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)), f"{name}: result depends on the lane order ({order})"
    return first
