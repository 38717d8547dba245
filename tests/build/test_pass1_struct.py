"""The argument structs the CPU kernels take through ctypes agree with their C++ definitions.

``torch_aura/cpu/native.py`` mirrors each struct as a ``ctypes.Structure`` that no compiler checks:
a field added, dropped, reordered or retyped on one side only would make the native code read the
wrong bytes, silently. Two checks per struct: the declarations parsed from the C++ source give the
same fields (names, types, order) as ``_fields_``; and a C++ compiler, where one is found, reports
the same offsets and size as ctypes computes.

The CUDA pass 1 (``AuraP1Params``, csrc/cuda/aura_pass1_plan.cuh) is no such struct: the host code
that fills it and the kernel that reads it are compiled together by nvcc.
"""

import ctypes
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from torch_aura.cpu import native

REPO = Path(__file__).resolve().parents[2]

# (C++ struct, the file holding its one definition, its ctypes mirror)
STRUCTS = [
    ("P1Args", "csrc/cpu/pass1_args.h", native._P1Args),
    ("DecodeArgs", "csrc/cpu/decode.cpp", native._DecodeArgs),
]

# C++ scalar types as the ctypes type of the same size and kind
CPP_TYPES = {"int64_t": ctypes.c_int64, "int32_t": ctypes.c_int32, "uint8_t": ctypes.c_uint8, "float": ctypes.c_float,
             "double": ctypes.c_double}


def struct_body(name, path):
    """The member declarations of ``struct name { ... };`` in ``path``, comments removed."""
    text = re.sub(r"//[^\n]*|/\*.*?\*/", "", (REPO / path).read_text(), flags=re.S)
    found = re.findall(r"\bstruct\s+%s\s*\{(.*?)\};" % name, text, flags=re.S)
    assert len(found) == 1, f"{path}: expected one definition of struct {name}, found {len(found)}"
    return found[0]


def cpp_fields(name, path):
    """[(field, description)] in declaration order; description: 'pointer', a scalar type, or 'type[n]'."""
    fields = []
    for decl in filter(None, (d.strip() for d in struct_body(name, path).split(";"))):
        m = re.match(r"((?:const\s+)?\w+)\s*(.*)", decl, flags=re.S)
        base, declarators = m.group(1).replace("const ", "").strip(), m.group(2)
        for d in (x.strip() for x in declarators.split(",")):
            dm = re.fullmatch(r"(\*?)\s*(?:const\s+)?(\w+)\s*(?:\[(\d+)\])?", d)
            assert dm, f"{path}: struct {name}: cannot read the declaration {decl!r}"
            star, field, count = dm.groups()
            if star:
                fields.append((field, "pointer"))
            else:
                assert base in CPP_TYPES, f"{path}: struct {name}: field {field} has an unmapped type {base}"
                fields.append((field, f"{base}[{count}]" if count else base))
    return fields


def ctypes_fields(mirror):
    """The same description of a ctypes.Structure's _fields_."""
    by_type = {v: k for k, v in CPP_TYPES.items()}
    out = []
    for field, t in mirror._fields_:
        if t is ctypes.c_void_p or (isinstance(t, type) and issubclass(t, ctypes._Pointer)):
            out.append((field, "pointer"))
        elif isinstance(t, type) and issubclass(t, ctypes.Array):
            out.append((field, f"{by_type.get(t._type_, t._type_.__name__)}[{t._length_}]"))
        else:
            out.append((field, by_type.get(t, t.__name__)))
    return out


def side_by_side(cpp, py):
    rows = [f"  {i:2d}  {c[0] + ' ' + c[1] if c else '-':32s} {p[0] + ' ' + p[1] if p else '-'}"
            for i, (c, p) in enumerate(zip(cpp + [None] * (len(py) - len(cpp)), py + [None] * (len(cpp) - len(py))))]
    return "\n".join(["   #  C++                              ctypes"] + rows)


@pytest.mark.parametrize("name, path, mirror", STRUCTS, ids=[s[0] for s in STRUCTS])
def test_ctypes_mirror_has_the_cpp_fields(name, path, mirror):
    cpp, py = cpp_fields(name, path), ctypes_fields(mirror)
    if cpp != py:
        first = next((i for i, (c, p) in enumerate(zip(cpp, py)) if c != p), min(len(cpp), len(py)))
        pytest.fail(f"struct {name} ({path}) and torch_aura/cpu/native.py's {mirror.__name__} disagree, first at "
                    f"field {first}; change both together:\n{side_by_side(cpp, py)}")


def test_p1args_has_one_cpp_definition():
    hits = [p.relative_to(REPO).as_posix() for p in sorted((REPO / "csrc").rglob("*"))
            if p.suffix in {".h", ".cpp", ".cu", ".cuh"} and re.search(r"\bstruct\s+P1Args\s*\{", p.read_text())]
    assert hits == ["csrc/cpu/pass1_args.h"], f"struct P1Args defined in {hits}; keep it in csrc/cpu/pass1_args.h"


@pytest.mark.parametrize("name, path, mirror", STRUCTS, ids=[s[0] for s in STRUCTS])
def test_ctypes_mirror_has_the_cpp_layout(name, path, mirror, tmp_path):
    """What the C++ compiler lays out (offsetof, sizeof), the struct text compiled on its own."""
    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    fields = [f for f, _ in cpp_fields(name, path)]
    src = tmp_path / "layout.cpp"
    src.write_text("#include <cstddef>\n#include <cstdint>\n#include <cstdio>\n"
                   f"struct {name} {{{struct_body(name, path)}}};\n"
                   f'int main() {{\n  std::printf("sizeof %zu\\n", sizeof({name}));\n'
                   + "".join(f'  std::printf("{f} %zu %zu\\n", offsetof({name}, {f}), sizeof({name}::{f}));\n'
                             for f in fields) + "}\n")
    exe = tmp_path / "layout"
    r = subprocess.run([cxx, "-std=c++17", str(src), "-o", str(exe)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = subprocess.run([str(exe)], capture_output=True, text=True, check=True, timeout=30).stdout.splitlines()
    want = {"sizeof": ctypes.sizeof(mirror)} | {f: (getattr(mirror, f).offset, getattr(mirror, f).size)
                                                for f, _ in mirror._fields_}
    got = {}
    for line in lines:
        key, *nums = line.split()
        got[key] = int(nums[0]) if key == "sizeof" else tuple(map(int, nums))
    bad = [f"  {k}: C++ {got.get(k)} vs ctypes {want.get(k)}" for k in dict.fromkeys([*got, *want])
           if got.get(k) != want.get(k)]
    assert not bad, (f"struct {name} ({path}) and {mirror.__name__} lay out differently "
                     "((offset, size) per field, bytes):\n" + "\n".join(bad))
