"""Shared benchmark machinery: device facts, the copy-bandwidth ceiling, timing, result files.

The scripts run as files (``python benchmarks/bench_gdn.py``): Python puts the script's folder first on
``sys.path``, so they import this module and ``shapes`` as ``import _harness``, with no path edits.
``tests_module`` loads a helper of ``tests/`` (the vLLM tests' model builder) from its file.

Every timing goes through this module: ``time_us`` (device time, cold L2, or CUDA-graph replays),
``host_us`` (host time of one eager call) and ``timed`` / ``median_s`` (wall clock around whole calls:
the CPU rows, model steps, engine runs).

Device timing follows docs/style.md §7 and the anchors of docs/targets.md: ``triton.testing.do_bench``
(eager: it flushes a buffer larger than L2 before every call, so reads come from HBM; median of
its runs) beside ``triton.testing.do_bench_cudagraph`` (graph replays of the same call; launch
overhead removed). Every provider is checked against a reference answer before it is timed, and
a provider that fails its check is reported as wrong and not timed.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch


RESULTS = Path(__file__).resolve().parent / "results"
ROOT = RESULTS.parents[1]


def tests_module(name: str):
    """``tests/<name>.py`` imported under its own name (as the tests import it), loaded from its file so
    that the benchmarks and the tests share one definition without putting ``tests/`` on ``sys.path``."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "tests" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def commit() -> str:
    if os.environ.get("AURA_COMMIT"):
        return os.environ["AURA_COMMIT"]
    try:
        git = lambda *a: subprocess.run(["git", *a], capture_output=True, text=True,  # noqa: E731
                                        cwd=RESULTS.parent, timeout=10).stdout.strip()
        head = git("rev-parse", "--short", "HEAD") or "unknown"
        # a copied working tree (e.g. a remote GPU run) can differ from HEAD: say so, never hide it
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", "csrc", "torch_aura", "triton_kernels")
        return head + ("+uncommitted" if dirty else "")
    except OSError:
        return "unknown"


def device_facts() -> dict:
    import triton

    props = torch.cuda.get_device_properties(0)
    return {"gpu": props.name, "sms": props.multi_processor_count, "torch": torch.__version__,
            "cuda": torch.version.cuda, "triton": triton.__version__, "python": platform.python_version(),
            "commit": commit()}


def start(script: str, op: str, doc: str, argv=None, extra_args=None):
    """The prologue every bench script shares: parse ``--out`` (and what ``extra_args(parser)`` adds),
    check that a CUDA device and ``op``'s CUDA kernel exist, then measure the device facts and the
    copy ceiling. Returns ``(args, facts, copy_tbs)``, or None after saying why the bench cannot run."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="results folder (default benchmarks/results)")
    if extra_args is not None:
        extra_args(parser)
    args = parser.parse_args(argv)
    from torch_aura import backends

    if not torch.cuda.is_available() or not backends.has_kernel(op, "cuda"):
        print(f"{script}: needs a CUDA device and the CUDA kernel of {op}:", backends.status()[op]["cuda"])
        return None
    return args, device_facts(), copy_bandwidth_tbs()


def time_us(fn, graph: bool = False) -> float:
    """Median time of ``fn()`` in microseconds, eager (cold L2) or as CUDA-graph replays."""
    from triton.testing import do_bench, do_bench_cudagraph

    if graph:
        return do_bench_cudagraph(fn, rep=200, return_mode="median") * 1e3
    return do_bench(fn, warmup=50, rep=200, return_mode="median") * 1e3


def host_us(fn, calls: int = 30, device="cuda", warmup: bool = True) -> float:
    """Host (CPU) time of one eager call in microseconds. On CUDA, ``calls`` calls queued behind a GPU
    sleep that outlasts them, so the device never waits for the host and the host never waits for the
    device (the launch queue holds them); the clock stops when the last call returns. Where this exceeds
    the device time, an eager caller waits for the host, not the GPU. With ``device="cpu"``, the mean of
    ``calls`` back-to-back calls. ``warmup=False`` skips the one untimed call first (for a ``fn`` with a side
    effect the caller counts, such as an append)."""
    if warmup:
        fn()
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda._sleep(int(calls * 5e-3 * 2e9))  # ~5 ms of device time per call at ~2 GHz: never drained
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - t0
    if cuda:
        torch.cuda.synchronize()
    return elapsed / calls * 1e6


def _sync(device) -> None:
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device=None):
    """``(seconds, fn())``: the wall-clock time of one call, ``device`` synchronized before and after
    (None: nothing to wait for, a CPU call). The one stopwatch of every wall-clock measurement."""
    _sync(device)
    t0 = time.perf_counter()
    result = fn()
    _sync(device)
    return time.perf_counter() - t0, result


def kernel_times(fn, device=None) -> dict[str, list]:
    """``fn()`` under torch.profiler, then ``device`` synchronized: ``{name: [calls, ms]}`` of the CUDA kernels
    it ran (CUDA-graph replays' included) where ``device`` is a CUDA device, else of its top-level aten and
    aura ops' self CPU time. The one kernel table of the benchmarks' profiles."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device is not None and torch.device(device).type == "cuda"
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        fn()
        _sync(device)
    totals: dict[str, list] = {}
    for e in prof.events():
        if cuda and e.device_type == torch.autograd.DeviceType.CUDA:
            ms = e.device_time / 1e3
        elif not cuda and e.cpu_parent is None and e.name.startswith(("aten::", "aura::")):
            ms = e.self_cpu_time_total / 1e3
        else:
            continue
        entry = totals.setdefault(e.name, [0, 0.0])
        entry[0] += 1
        entry[1] += ms
    return totals


_GLOBAL_FN = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\((?:[^()]|\([^()]*\))*\)\s*)?(\w+)\s*\(")


@functools.cache
def own_kernels() -> re.Pattern:
    """The names torch_aura's kernels run under in a profile, as one pattern: the Triton and Gluon kernels of
    ``torch_aura.triton_kernels`` and the ``__global__`` functions of ``csrc/cuda`` (a profiler names a
    template instance ``void ns::name<...>(...)``, so a name matches as a whole word)."""
    import importlib
    import pkgutil

    from torch_aura import triton_kernels

    names = set()
    for info in pkgutil.walk_packages(triton_kernels.__path__, triton_kernels.__name__ + "."):
        try:
            module = importlib.import_module(info.name)
        except Exception:  # a kernel module this machine cannot import (a Gluon build) runs nothing here
            continue
        names |= {fn.__name__ for fn in (getattr(o, "fn", None) for o in vars(module).values())
                  if callable(fn) and getattr(fn, "__name__", "").endswith("_kernel")}
    for source in (ROOT / "csrc" / "cuda").glob("*.cu*"):
        names |= set(_GLOBAL_FN.findall(source.read_text()))
    return re.compile(r"\b(?:" + "|".join(sorted(map(re.escape, names))) + r")\b")


def own_kernel_ms(totals: dict) -> float:
    """The ms of :func:`kernel_times`' table (``{name: [calls, ms]}``) that torch_aura's own kernels took."""
    pattern = own_kernels()
    return sum(ms for name, (_, ms) in totals.items() if pattern.search(name))


def _variant_text(src, metadata) -> str:
    """A compiled variant in words: what tells two compiles of one kernel apart (a stall's diagnosis)."""
    names = getattr(getattr(src, "fn", None), "arg_names", None) or []
    consts = {names[k[0]] if isinstance(k, tuple) and len(k) == 1 and k[0] < len(names) else k: v
              for k, v in (getattr(src, "constants", None) or {}).items()}
    sig = ",".join(str(t) for t in (getattr(src, "signature", None) or {}).values())
    read = metadata.get if isinstance(metadata, dict) else lambda k: getattr(metadata, k, None)
    opts = {k: read(k) for k in ("num_warps", "num_stages")}
    return f"{getattr(src, 'name', '?')} {opts} constexprs={consts} signature=[{sig}]"


class TritonCompiles(list):
    """Inside ``with TritonCompiles() as seen:``, every Triton kernel the process builds, as ``(name,
    from_disk, seconds)``: compiled (``from_disk`` False) or loaded from Triton's on-disk cache. Attributes a
    stall to Triton by count, not by inference (Triton's ``knobs.compilation.listener``; any listener
    installed before is still called). Empty where Triton is absent or has no listener knob."""

    def __enter__(self):
        try:
            from triton import knobs
        except ImportError:
            self._knobs = None
            return self
        self._knobs, self._before = knobs, knobs.compilation.listener

        self.variants = []  # per compile (not disk loads): the variant's constexprs, signature and launch options

        def listener(*, src, metadata, metadata_group, times, cache_hit):
            self.append((str(getattr(src, "name", "?")), bool(cache_hit), getattr(times, "total", 0) / 1e6))  # CompileTimes: us
            if not cache_hit:
                self.variants.append(_variant_text(src, metadata))
            if self._before is not None:
                self._before(src=src, metadata=metadata, metadata_group=metadata_group, times=times,
                             cache_hit=cache_hit)

        knobs.compilation.listener = listener
        return self

    def __exit__(self, *exc):
        if self._knobs is not None:
            self._knobs.compilation.listener = self._before

    def summary(self) -> dict:
        """Counts and seconds of what was compiled and what was loaded from disk."""
        built = [s for _, from_disk, s in self if not from_disk]
        return {"triton_compiled": len(built), "triton_loaded": len(self) - len(built),
                "triton_compile_s": sum(built),
                "triton_compiled_names": sorted({name for name, from_disk, _ in self if not from_disk})}


def median_s(fn, repeats: int, device=None, warmup: int = 1) -> float:
    """Median wall-clock seconds of ``repeats`` calls of ``fn()`` after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    return statistics.median(timed(fn, device)[0] for _ in range(repeats))


def copy_bandwidth_tbs(gib: float = 2.0) -> float:
    """Device-to-device copy, bytes read + written per second: the practical HBM ceiling."""
    n = int(gib * 2**30) // 4
    src = torch.empty(n, dtype=torch.float32, device="cuda").normal_()
    dst = torch.empty_like(src)
    t = time_us(lambda: dst.copy_(src)) * 1e-6
    del src, dst
    return 2 * n * 4 / t / 1e12


def gpu_slug(name: str) -> str:
    for key in ("H200", "H100", "A100", "B200", "L40"):
        if key in name:
            return key.lower()
    return name.split()[-1].lower()


def write(family: str, facts: dict, rows: list[dict], markdown: str, out_dir: Path | None = None) -> Path:
    """Markdown summary (committed) and JSONL rows (raw, gitignored) for one family and GPU."""
    out_dir = Path(out_dir or RESULTS)
    (out_dir / "raw").mkdir(parents=True, exist_ok=True)
    slug = gpu_slug(facts["gpu"])
    with open(out_dir / "raw" / f"{family}_{slug}.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps({**facts, **r}) + "\n")
    md = out_dir / f"{family}_{slug}.md"
    md.write_text(markdown)
    return md
