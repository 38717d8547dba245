"""Every repository path and every "§" pointer written in the docs, the README and the code's comments
resolves: a renamed file or a renumbered section fails here instead of rotting in a comment."""

import re
import subprocess
from functools import lru_cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
SOURCES = (".py", ".cu", ".cuh", ".cpp", ".h", ".mm", ".metal", ".md", ".sh")
ROOTS = ("torch_aura", "triton_kernels", "csrc", "tests", "benchmarks", "tools", "docs")
# "decode.md §4", "docs/gdn.md §6.1", "gdn.md's §3.2"
QUALIFIED = re.compile(r"\b([a-z][\w-]*)\.md(?:'s)?,? (?:§ ?|sections? )(\d+(?:\.\d+)*)")
BARE = re.compile(r"(?<![\w.])§ ?(\d+(?:\.\d+)*)")
PATH = re.compile(r"(?<![\w/.-])((?:%s)/[\w./{}<>*-]*[\w/])" % "|".join(ROOTS))
TICKED_FILE = re.compile(r"`([\w-]+\.(?:py|cu|cuh|cpp|h|mm|metal|md|sh))`")
# written by a build or a run, never committed
GENERATED = ("benchmarks/results/raw", "torch_aura/_C_", "torch_aura/_mps_build_info.py", "build/")
OUTPUTS = {"vllm_serve_llama3-8b.md"}  # a benchmark's output file, named where the README says how to run it
# A line naming another project's file says whose it is; those paths are not ours to resolve.
EXTERNAL = re.compile(r"vllm-project|fla-org|flashinfer-ai|Dao-AILab|ml-explore|linkedin/|pytorch/|TheTom|"
                      r"robertelee78|triton-lang|huggingface/|\bFLA\b|FlashInfer|flash-attention|llama\.cpp|"
                      r"PagedAttention|MSL spec|ATen/|c10/|OperationUtils|extension-cpp|Liger|\bmlx\b")
# whole sections about other projects
EXTERNAL_SECTIONS = {"docs/style.md": "## 1. ", "docs/aura-format.md": "## 12. "}
# files of engineers working on them now; their references are reported, not failed, until they land
OTHERS: set[str] = set()
SELF = "tests/registration/test_references.py"  # its examples are patterns


@lru_cache
def _tracked() -> tuple[str, ...]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout
    return tuple(out.split())


@lru_cache
def _sections(doc: str) -> frozenset[str]:
    path = DOCS / f"{doc}.md"
    if not path.exists():
        return frozenset()
    found, top = set(), None
    for line in path.read_text().splitlines():
        m = re.match(r"#+ (\d+(?:\.\d+)*)[.: ]", line)
        if m:
            found.add(m.group(1))
            top = m.group(1).split(".")[0]
        elif top and (m := re.match(r"(\d+)\. ", line)):  # "§11.6": item 6 of section 11's list
            found.add(f"{top}.{m.group(1)}")
    return frozenset(found)


def _files():
    for rel in _tracked():
        path = REPO / rel
        if (rel.startswith(ROOTS) or rel == "README.md") and path.suffix in SOURCES and path.exists() \
                and not rel.startswith("benchmarks/results/") and rel not in OTHERS | {SELF}:
            yield rel, _ours(rel, path.read_text(errors="replace"))


def _ours(rel, text):
    """``text`` with the lines of sections about other projects blanked (line numbers kept)."""
    start = EXTERNAL_SECTIONS.get(rel)
    if start is None:
        return text
    lines, inside = text.splitlines(), False
    for i, line in enumerate(lines):
        if line.startswith("#"):
            inside = line.startswith(start)
        if inside:
            lines[i] = ""
    return "\n".join(lines)


def _exists(target: str) -> bool:
    target = target.rstrip("/.")
    if target.endswith(("_", "-")):  # a name prefix, as in tests/reference/test_cpu_fast_*
        return any(t.startswith(target) for t in _tracked())
    if target.startswith("torch_aura/triton_kernels"):  # the installed name of triton_kernels/
        target = target.replace("torch_aura/triton_kernels", "triton_kernels", 1)
    if any(ch in target for ch in "{}<>*") or target.startswith(GENERATED):
        return True  # a pattern, not a path
    if (REPO / target).exists():
        return True
    module = re.sub(r"\.\w+$", ".py", target)  # tests/_gdn_check.check_decay_domain: a module's attribute
    if module != target and (REPO / module).exists():
        return True
    return any(t == target or t.startswith(target + "/") for t in _tracked())


def _pointer_failures(rel, text):
    bad = []
    for i, line in enumerate(text.splitlines(), 1):
        for doc, section in QUALIFIED.findall(line):
            if doc in {p.stem for p in DOCS.glob("*.md")} and section not in _sections(doc):
                bad.append(f"{rel}:{i}: {doc}.md §{section}")
            elif doc not in {p.stem for p in DOCS.glob("*.md")} and doc.lower() != "readme":
                bad.append(f"{rel}:{i}: {doc}.md (no such doc)")
        if rel.startswith("docs/") and rel.endswith(".md"):
            own = QUALIFIED.sub("", line)
            for section in BARE.findall(re.sub(r"spec §", "", own)):
                if section not in _sections(Path(rel).stem):
                    bad.append(f"{rel}:{i}: §{section} (this doc)")
    return bad


def _path_failures(rel, text):
    bad = []
    basenames = {Path(t).name for t in _tracked()}
    lines = text.splitlines()
    for i, line in enumerate(lines, 1):
        if EXTERNAL.search(line) or (i > 1 and EXTERNAL.search(lines[i - 2]) and line.startswith(" ")):
            continue  # another project's file (or the continuation of a list item naming one)
        for target in PATH.findall(line):
            if not _exists(target):
                bad.append(f"{rel}:{i}: {target}")
        for name in TICKED_FILE.findall(line):
            if name not in basenames and name not in OUTPUTS:
                bad.append(f"{rel}:{i}: `{name}` (no file of that name)")
    return bad


@pytest.mark.parametrize("check", [_pointer_failures, _path_failures], ids=["section-pointers", "paths"])
def test_references_resolve(check):
    bad = [b for rel, text in _files() for b in check(rel, text)]
    assert not bad, f"{len(bad)} references that do not resolve:\n" + "\n".join(bad)
