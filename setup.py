"""Build script: pure Python everywhere, native extensions only where their toolchain exists.

* ``torch_aura._C_cuda`` (``csrc/cuda``, LibTorch stable ABI, one abi3 wheel for torch >= 2.10):
  built when CUDA sources exist and either ``AURA_BUILD_CUDA=1`` or (nvcc is found and the torch
  in this environment is a CUDA build). ``torch.cuda.is_available()`` is deliberately not asked:
  it is False on a GPU-less build box that has nvcc.
* ``torch_aura._C_cpu`` (``csrc/cpu``, plain C++ reached through ctypes: no torch headers, so it
  builds without torch and serves any torch version): always attempted, ``optional`` so a machine
  without a C++ compiler still installs (the CPU ops then run the reference).
* ``torch_aura._C_mps`` (``csrc/mps``, Objective-C++): macOS with an MPS-enabled torch only, as its
  own extension so Objective-C flags never reach ``.cpp``/``.cu`` sources.
* ``torch_aura._C_autograd_t<major>_<minor>`` (``csrc/autograd``, ordinary LibTorch C++, so tied to
  the torch minor version in its name): the ops' Autograd-key kernel, built with the CPU kernels
  (``AURA_BUILD_CPU``) wherever torch is importable; ``optional``.
* ``triton_kernels/`` installs as ``torch_aura.triton_kernels`` and never as a top-level package.

Building an extension needs the torch of the target environment: ``pip install --no-build-isolation``.
Without torch importable at build time the package installs pure Python (reference backend only).
"""

import glob
import os
import shutil
import sys

from setuptools import find_packages, setup

ROOT = os.path.dirname(os.path.abspath(__file__))
# Hide stable-ABI APIs newer than torch 2.10 so one wheel serves torch >= 2.10 (decode.md §9).
TORCH_TARGET = "-DTORCH_TARGET_VERSION=0x020a000000000000"
# Where a toolchain links libstdc++ statically (the GPU hosts' does), its exported symbols interpose on
# torch's libstdc++.so.6 and the first ostringstream of an error path crashes (tests/build/test_link_isolation.py).
HIDE_STATIC_LIBS = [] if sys.platform in ("win32", "darwin") else ["-Wl,--exclude-libs,ALL"]


def _load(name, relpath):
    """A standard-library-only module of the package, loaded by path: torch_aura is not installed yet."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, relpath))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


# every variable read here is in torch_aura/_env.py's table, with its default and parser
env = _load("_torch_aura_env", os.path.join("torch_aura", "_env.py"))


def _sources(pattern):
    return sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern)))


def _torch():
    try:
        import torch
        import torch.utils.cpp_extension  # noqa: F401
        return torch
    except ImportError:
        return None


def _cuda_extension(torch):
    sources = _sources("csrc/cuda/*.cu") + _sources("csrc/cuda/*.cpp")  # register.cpp binds them
    flag = env.get("AURA_BUILD_CUDA")  # "0", "1" or None (auto)
    if not sources or flag == "0" or torch is None:
        return None
    cuda_home = env.get("CUDA_HOME")
    nvcc = shutil.which("nvcc") or (cuda_home and os.path.exists(os.path.join(cuda_home, "bin", "nvcc")))
    if flag != "1" and not (nvcc and torch.version.cuda):
        return None
    from torch.utils.cpp_extension import CUDAExtension

    arch = env.get("AURA_CUDA_ARCH")
    return CUDAExtension(
        "torch_aura._C_cuda", sources, py_limited_api=True,
        include_dirs=[os.path.join(ROOT, "csrc")],
        extra_compile_args={
            "cxx": ["-O3", "-std=c++20", TORCH_TARGET, "-DUSE_CUDA", "-DPy_LIMITED_API=0x03090000"],
            "nvcc": ["-O3", "-std=c++20", TORCH_TARGET, "-DUSE_CUDA", "--expt-relaxed-constexpr", "-lineinfo",
                     f"-gencode=arch=compute_{arch},code=sm_{arch}"],
        },
        extra_link_args=HIDE_STATIC_LIBS)


def _cpu_extension():
    sources = _sources("csrc/cpu/*.cpp")
    if not sources or not env.get("AURA_BUILD_CPU"):
        return None
    from setuptools import Extension

    flags = ["/O2", "/std:c++17"] if sys.platform == "win32" else ["-O3", "-std=c++17", "-fopenmp-simd", "-pthread"]
    return Extension("torch_aura._C_cpu", sources, language="c++", optional=True, py_limited_api=True,
                     define_macros=[("Py_LIMITED_API", "0x03090000")], extra_compile_args=flags,
                     extra_link_args=[] if sys.platform == "win32" else ["-pthread", *HIDE_STATIC_LIBS])


def _mps_extension(torch):
    """The Objective-C++ host (csrc/mps/*.mm) with the portable launch plans (csrc/mps/plan) and
    the shaders embedded as source (csrc/mps/embed_metal.py, compiled by Metal at first use)."""
    sources = _sources("csrc/mps/*.mm")
    if sys.platform != "darwin" or torch is None or not sources or not torch.backends.mps.is_built():
        return None
    from torch.utils.cpp_extension import CppExtension

    embed = _load("embed_metal", os.path.join("csrc", "mps", "embed_metal.py"))
    generated = os.path.join(ROOT, "build", "aura_generated")
    embed.write_header(__import__("pathlib").Path(generated) / "aura_shader_sources.h")
    # _C_mps uses ordinary ATen (the stable ABI has no MPS surface): it is tied to this torch
    # minor version, recorded here and checked by torch_aura.backends before the import.
    with open(os.path.join(ROOT, "torch_aura", "_mps_build_info.py"), "w") as f:
        f.write(f'"""Written by setup.py: the torch version _C_mps was built against."""\n'
                f'TORCH_MINOR = "{_minor(torch)}"\n')
    return CppExtension(
        "torch_aura._C_mps", sources + _sources("csrc/mps/plan/*.cpp"),
        include_dirs=[os.path.join(ROOT, "csrc"), os.path.join(ROOT, "csrc", "mps"), generated],
        extra_compile_args={"cxx": ["-O3", "-std=c++20", "-fobjc-arc"]},
        extra_link_args=["-framework", "Metal", "-framework", "Foundation"])


def _minor(torch) -> str:
    return ".".join(torch.__version__.split("+")[0].split(".")[:2])


def _autograd_extension(torch):
    """Tied to this torch minor version (ordinary LibTorch C++), so the version is in its module name,
    ``torch_aura._C_autograd_t2_13``: under another torch the import finds no module and the Python
    kernel serves, where a stale build of the same name could load and crash."""
    sources = _sources("csrc/autograd/*.cpp")
    if not sources or torch is None or not env.get("AURA_BUILD_CPU"):
        return None
    from torch.utils.cpp_extension import CppExtension

    module = "_C_autograd_t" + _minor(torch).replace(".", "_")
    flags = ["/O2", "/std:c++17"] if sys.platform == "win32" else ["-O2", "-std=c++17"]
    return CppExtension(f"torch_aura.{module}", sources, optional=True,
                        extra_compile_args={"cxx": [*flags, f"-DAURA_AUTOGRAD_MODULE={module}"]},
                        extra_link_args=HIDE_STATIC_LIBS)


def _triton_packages():
    found = find_packages(where="triton_kernels")
    return ["torch_aura.triton_kernels"] + [f"torch_aura.triton_kernels.{p}" for p in found]


torch = _torch()
ext_modules = [e for e in (_cpu_extension(), _cuda_extension(torch), _mps_extension(torch), _autograd_extension(torch))
               if e is not None]
cmdclass = {}
if ext_modules:
    from torch.utils.cpp_extension import BuildExtension

    cmdclass["build_ext"] = BuildExtension.with_options(no_python_abi_suffix=True)

setup(
    packages=find_packages(include=["torch_aura", "torch_aura.*"]) + _triton_packages(),
    package_dir={"torch_aura.triton_kernels": "triton_kernels"},
    # the tuned launch configs shipped per GPU (triton_kernels/_tune.py, made by bench_gdn_first_call.py)
    package_data={"torch_aura.triton_kernels": ["tuned/*.json", "native_replay.c"]},  # the C replay builds on first use
    ext_modules=ext_modules,
    cmdclass=cmdclass,
    options={"bdist_wheel": {"py_limited_api": "cp39"}} if ext_modules else {},
)
