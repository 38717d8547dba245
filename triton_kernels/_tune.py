"""Launch-config selection for the Triton kernels: tuned once per key, remembered on disk.

Why not ``@triton.autotune``: it re-tunes inside CUDA-graph capture (benchmark launches there
break the capture) and fails under ``TRITON_INTERPRET=1`` with more than one config. ``Tuner``
keeps the decision in our hands:

* the key is chosen by the launcher from static facts (head dims, dtype, layout, varlen, and at most
  a two-valued parallelism bucket), never from T, so one warm-up call tunes every later shape of a
  model, and the kernels do not specialise on lengths either (``gdn._jit.LENGTH_ARGS``);
* a decision is looked up before it is timed: in this process, then in the user's table on disk
  (``TORCH_AURA_TUNE_CACHE``: a folder, default ``~/.cache/torch_aura/tune``; ``0`` disables it),
  then in the table the package ships for this GPU (``tuned/<gpu>.json``, made on the GPU by
  ``benchmarks/bench_gdn_first_call.py``). A fresh install on a GPU with a shipped table never times a config;
  every decision timed elsewhere is written to the user's table (one file per GPU name, torch_aura
  version and Triton version);
* under the interpreter, with ``TORCH_AURA_TUNE=0``, or while a CUDA graph is being captured, the
  first config that fits the device runs untuned (a capture never benchmarks; the untuned pick is
  not cached, so the next eager call still tunes);
* a config that fails to compile or launch (e.g. too much shared memory) is skipped.

Launches must be repeatable: outputs are fresh buffers and inputs are read-only (the in-place
``gdn_recurrent`` is not tuned).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import tempfile
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .. import _env  # torch_aura._env: this package installs as torch_aura.triton_kernels


@dataclass(frozen=True)
class Config:
    """One launch configuration: constexpr kwargs plus Triton's ``num_warps`` / ``num_stages``."""

    kwargs: dict = field(default_factory=dict)
    num_warps: int = 4
    num_stages: int = 2

    def launch_kwargs(self) -> dict:
        return {**self.kwargs, "num_warps": self.num_warps, "num_stages": self.num_stages}


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (1 for n <= 1). Plain Python on purpose: ``triton.next_power_of_2``
    and ``triton.cdiv`` are constexpr-function wrappers that cost microseconds of host time per call
    (a cProfile of eager ``gdn_recurrent`` on the H100's host: their four calls, 9% of the launch)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for ints (host side; see ``next_pow2``)."""
    return -(-a // b)


@functools.lru_cache(maxsize=None)
def _properties_of(index: int):
    return torch.cuda.get_device_properties(index)


def _cuda_properties(device: torch.device):
    """Cached properties of a CUDA device (launchers ask on every call)."""
    return _properties_of(torch.cuda.current_device() if device.index is None else device.index)


def sm_count(device: torch.device) -> int:
    """SMs of a CUDA device; 1 elsewhere."""
    return _cuda_properties(device).multi_processor_count if device.type == "cuda" else 1


def cuda_capability(device: torch.device) -> tuple[int, int]:
    """``(major, minor)`` compute capability of a CUDA device."""
    props = _cuda_properties(device)
    return props.major, props.minor


def has_tma(device: torch.device) -> bool:
    """Whether a CUDA device has the tensor memory accelerator (Hopper, compute capability 9, and later)."""
    return device.type == "cuda" and _cuda_properties(device).major >= 9


@contextlib.contextmanager
def descriptor_workspace(device: torch.device):
    """Lend Triton an allocator for in-kernel TMA descriptors (``tl.make_tensor_descriptor``) while
    our launches run.

    Each such descriptor lives in a small global workspace (128 B per descriptor and program) that
    Triton requests, at every launch, from the allocator a process sets with ``triton.set_allocator``;
    without one the launch fails. A caller's allocator (FLA and vLLM set theirs) is left in charge;
    otherwise torch's caching allocator serves for the duration and the previous state is restored,
    so importing torch_aura changes nothing for other Triton users. Stream-ordered and safe inside
    CUDA-graph capture (the workspace then comes from the graph's pool).
    """
    def alloc(size: int, alignment: int, stream):
        return torch.empty(size, dtype=torch.int8, device=device)

    try:
        from triton.runtime import _allocation

        var = _allocation._allocator
        unset = isinstance(var.get(), _allocation.NullAllocator)
    except (ImportError, AttributeError):  # another Triton layout, no way to read the current one: set ours
        import triton

        triton.set_allocator(alloc)
        yield
        return
    if not unset:
        yield
        return
    token = var.set(alloc)
    try:
        yield
    finally:
        var.reset(token)


def interpreting() -> bool:
    return _env.get("TRITON_INTERPRET")


# --------------------------------------------------------------------- tuned configs on disk
TUNE_CACHE_ENV = "TORCH_AURA_TUNE_CACHE"
SHIPPED_TABLES = Path(__file__).resolve().parent / "tuned"
_TABLE_FORMAT = 1


def gpu_slug(device: torch.device) -> str:
    """The GPU's name as a file name: ``"NVIDIA H100 80GB HBM3"`` -> ``"nvidia-h100-80gb-hbm3"``."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def user_table_path(slug: str) -> Path | None:
    """Where this process keeps the decisions it timed for GPU ``slug``, or None (disabled)."""
    if not _env.is_set(TUNE_CACHE_ENV):
        folder = Path(_env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "torch_aura" / "tune"
    else:
        folder = _env.get(TUNE_CACHE_ENV)
        if folder is None:  # 0 / off: this process only
            return None
    import triton

    from .. import __version__
    return Path(folder) / f"{slug}-torch_aura-{__version__}-triton-{triton.__version__}.json"


def _key_text(key: tuple) -> str:
    return "|".join(str(part) for part in key)  # dtypes print as torch.bfloat16: stable across runs


class TuneTable:
    """The tuned configs of one GPU kind, ``{tuner name: {key text: config fields}}``: the shipped
    table, the user's table over it. A file that does not parse is ignored with a warning (and the
    user's is rewritten at the next decision); an entry naming a config its tuner no longer has is
    ignored when looked up."""

    def __init__(self, slug: str):
        self.slug = slug
        self.path = user_table_path(slug)
        self.entries: dict[str, dict[str, dict]] = {}
        for path in (SHIPPED_TABLES / f"{slug}.json", self.path):
            for tuner, rows in self._read(path).items():
                self.entries.setdefault(tuner, {}).update(rows)

    @staticmethod
    def _read(path: Path | None) -> dict:
        if path is None or not path.exists():
            return {}
        try:
            data = json.loads(path.read_text())
            tuners = data["tuners"]
            if data.get("format") != _TABLE_FORMAT or not all(
                    isinstance(rows, dict) and all(isinstance(c, dict) for c in rows.values()) for rows in tuners.values()):
                raise ValueError(f"expected format {_TABLE_FORMAT} with a dict of configs per tuner")
            return tuners
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            warnings.warn(f"torch_aura: ignoring the tuned-config table {path} ({type(e).__name__}: {e})", stacklevel=2)
            return {}

    def get(self, tuner: "Tuner", key: tuple) -> Config | None:
        fields = self.entries.get(tuner.name, {}).get(_key_text(key))
        if fields is None:
            return None
        return next((c for c in tuner.configs if asdict(c) == fields), None)

    def put(self, tuner: "Tuner", key: tuple, cfg: Config) -> None:
        """Record a timed decision here and in the user's table (merged with what another process
        wrote meanwhile; written to a temporary file, then renamed, so a reader never sees half)."""
        self.entries.setdefault(tuner.name, {})[_key_text(key)] = asdict(cfg)
        if self.path is None:
            return
        import triton

        from .. import __version__
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a corrupt file was reported when it was first read
            on_disk = self._read(self.path)
        on_disk.setdefault(tuner.name, {})[_key_text(key)] = asdict(cfg)
        data = {"format": _TABLE_FORMAT, "gpu": self.slug, "torch_aura": __version__, "triton": triton.__version__,
                "tuners": on_disk}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=self.path.parent, suffix=".tmp", delete=False) as f:
                json.dump(data, f, indent=1, sort_keys=True)
            os.replace(f.name, self.path)
        except OSError as e:  # a read-only home: the decision still holds for this process
            warnings.warn(f"torch_aura: could not write the tuned-config table {self.path} ({e})", stacklevel=2)


_TABLES: dict[str, TuneTable] = {}


def tune_table(device: torch.device) -> TuneTable:
    """The table of ``device``'s GPU kind, read once per process."""
    slug = gpu_slug(device)
    if slug not in _TABLES:
        _TABLES[slug] = TuneTable(slug)
    return _TABLES[slug]


class Tuner:
    """Chooses among ``configs`` per key: a remembered decision (this process, the user's table, the
    shipped table), else by timing each once; ``configs[0]`` is the safe default.

    ``timed`` counts the keys this process had to time (what a first call at a new shape pays).
    """

    def __init__(self, name: str, configs: list[Config], bucket: int | None = None):
        self.name = name
        self.configs = configs
        # the key's place of a two-valued bucket (prep.many_chunks): each new variant launched on one side also
        # compiles the other side's known config for the same arguments, so the first prompt past the bucket's
        # edge does not compile (gdn.md §6.4)
        self.bucket = bucket
        self.cache: dict[tuple, Config] = {}
        self._other: dict[tuple, tuple] = {}  # memo -> the other side's launch options, () where none to ready
        self.timed = 0
        self._warned_capture = False

    def __call__(self, key: tuple, launch, device: torch.device) -> None:
        """Run ``launch(config)`` with the remembered or freshly tuned config for ``key`` on ``device``."""
        if len(self.configs) == 1 or interpreting() or not _env.get("TORCH_AURA_TUNE"):
            return self._first_that_fits(launch)
        memo = (device.index, key)
        cfg = self.cache.get(memo)
        if cfg is None:
            cfg = tune_table(device).get(self, key)
            if cfg is not None:
                self.cache[memo] = cfg
        if cfg is not None:
            other = self._other.get(memo)
            if other is None:
                other = self._other[memo] = self._other_side(key, cfg, device)
            if not other:
                launch(cfg)
                return
            from . import _launch

            before = _launch.siblings(other)
            try:
                launch(cfg)
            finally:
                _launch.siblings(before)
        elif device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            if not self._warned_capture:
                self._warned_capture = True
                warnings.warn(f"torch_aura: {self.name} met key {key} first inside CUDA-graph capture; "
                              "running its default config untuned (call it once eagerly to tune)",
                              stacklevel=2)
            self._first_that_fits(launch)
        else:
            cfg = self._tune(launch)
            self.cache[memo] = cfg
            tune_table(device).put(self, key, cfg)
            launch(cfg)

    def _other_side(self, key: tuple, cfg: Config, device: torch.device) -> tuple:
        """``(launch options,)`` of the table's config for ``key``'s other bucket side where it is another variant
        than ``cfg`` (compiled beside each new variant of ``key``: ``_launch.siblings``), else ``()``."""
        if self.bucket is None:
            return ()
        b = self.bucket
        found = tune_table(device).get(self, (*key[:b], not key[b], *key[b + 1:]))
        if found is None or found.launch_kwargs() == cfg.launch_kwargs():
            return ()
        return (found.launch_kwargs(),)

    def _first_that_fits(self, launch) -> None:
        """Untuned: the first config in order whose kernel fits the device (shared memory, registers).
        Triton raises OutOfResources when loading the kernel, before anything is launched (or
        captured), so trying the next one is safe."""
        from triton.runtime.errors import OutOfResources

        for cfg in self.configs[:-1]:
            try:
                return launch(cfg)
            except OutOfResources:
                continue
        return launch(self.configs[-1])

    def _tune(self, launch) -> Config:
        from triton.testing import do_bench

        self.timed += 1
        best, best_ms = self.configs[0], float("inf")
        for cfg in self.configs:
            try:
                ms = do_bench(lambda: launch(cfg), warmup=3, rep=15)
            except Exception:  # noqa: BLE001 - e.g. OutOfResources: this config cannot run here
                continue
            if ms < best_ms:
                best, best_ms = cfg, ms
        return best
