"""Source lint of the CUDA kernels: a full-mask warp collective is never evaluated conditionally
inside an expression.

``__shfl_*_sync(0xffffffff, ...)`` waits for all 32 lanes at that shuffle. Behind ``c ? a : f()``,
``c && f()`` or ``c || f()``, only the lanes that take that arm run it, and when the others do not exit
right after, the warp hangs: ``encode_chunk``'s code-norm sum behind ``degenerate ? ... : r / row_sum(cc)``
hung ``aura_append`` on the H200 in any warp that mixed live and padding rows (docs/aura-format.md §7).
Hoisting the call into its own statement, run by every lane, is the fix the lint asks for. Branches
(``if``) are out of its reach; the kernels keep collectives out of lane-dependent ``if`` blocks by
convention, and the GPU tests run warps that mix live and padding rows.
"""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOURCES = sorted((REPO / "csrc" / "cuda").glob("*.cu*")) + sorted((REPO / "tools").glob("*.cu"))
_PRIMITIVES = re.compile(r"\b(__shfl\w*_sync|__syncwarp|__ballot_sync|__any_sync|__all_sync|__reduce_\w+_sync|"
                         r"__match_\w+_sync)\s*\(")
_FUNCTION = re.compile(r"__device__\b[^;{}()]*?\b(\w+)\s*\([^;{}]*?\)\s*(?:const\s*)?\{")


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", lambda m: " " * len(m.group()), text, flags=re.S)
    return re.sub(r"//[^\n]*", lambda m: " " * len(m.group()), text)


def _body(text: str, open_brace: int) -> str:
    depth = 0
    for i in range(open_brace, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[open_brace:i + 1]
    return text[open_brace:]


def _calls_of(names: set[str]) -> re.Pattern:
    """A call of any function in ``names`` (template arguments allowed), or None for no names."""
    return re.compile(r"\b(" + "|".join(map(re.escape, sorted(names))) + r")\s*(<[^;{}()]*>)?\s*\(") if names else None


def _collective_functions(texts: dict) -> set[str]:
    """Device functions that run a warp collective, directly or through another such function."""
    bodies = {}
    for text in texts.values():
        for m in _FUNCTION.finditer(text):
            bodies.setdefault(m.group(1), []).append(_body(text, m.end() - 1))
    names: set[str] = set()
    while True:
        calls = _calls_of(names)
        grown = {n for n, bs in bodies.items() if n not in names and any(
            _PRIMITIVES.search(b) or (calls and calls.search(b)) for b in bs)}
        if not grown:
            return names
        names |= grown


def _condition(statement: str) -> str:
    """An ``if`` / ``while``'s parenthesised condition: its body is a branch, which the lint leaves alone."""
    depth = 0
    for i, ch in enumerate(statement):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == ")" and depth == 0:
            return statement[:i + 1]
    return statement


def _conditional_tail(statement: str):
    """The parts of ``statement`` evaluated only on some lanes: after a ternary's ``?`` or a ``&&`` / ``||``."""
    if re.match(r"\s*(else\s+)?(if|while|switch)\b", statement):
        statement = _condition(statement)
    tails = []
    for op in ("?", "&&", "||"):
        at = statement.find(op)
        if at >= 0:
            tails.append(statement[at + len(op):])
    return tails


def _violations(texts: dict, names: set[str]) -> list[str]:
    calls = re.compile(_PRIMITIVES.pattern + "|" + _calls_of(names).pattern)
    found = []
    for path, text in texts.items():
        for m in re.finditer(r"[^;{}]+", text):
            statement = m.group()
            if statement.lstrip().startswith(("for", "template", "#")):
                continue  # a loop header's condition is uniform by the kernels' convention; templates hold no code
            for tail in _conditional_tail(statement):
                hit = calls.search(tail)
                if hit:
                    line = text.count("\n", 0, m.start() + statement.find(tail)) + 1
                    where = path.relative_to(REPO) if path.is_relative_to(REPO) else path.name
                    found.append(f"{where}:{line}: {hit.group().rstrip('(').strip()} behind a condition")
    return found


def _texts(paths) -> dict:
    return {p: _strip_comments(p.read_text()) for p in paths}


def test_lint_finds_the_collective_behind_a_ternary(tmp_path):
    """The check itself: the aura_append hang's pattern is found, and its fix passes."""
    helpers = ("template <int L>\n__device__ __forceinline__ float row_sum(float x) {\n"
               "  for (int o = 1; o < L; o <<= 1) x += __shfl_xor_sync(0xffffffffu, x, o);\n  return x;\n}\n")
    bad = tmp_path / "bad.cuh"
    bad.write_text(helpers + "__device__ float norm(bool d, float r, float cc) {\n"
                   "  return d ? 0.f : r / sqrtf(row_sum<4>(cc));\n}\n"
                   "__device__ float any_lane(bool d, float x) { return d && __shfl_sync(0xffffffffu, x, 0) > 0.f; }\n")
    good = tmp_path / "good.cuh"
    good.write_text(helpers + "__device__ float norm(bool d, float r, float cc) {\n"
                    "  const float s = row_sum<4>(cc);  // every lane\n  return d ? 0.f : r / sqrtf(s);\n}\n")
    texts = _texts([bad, good])
    names = _collective_functions(texts)
    assert "row_sum" in names
    found = _violations(texts, names)
    assert len(found) == 2 and all("bad.cuh" in f for f in found), found
    assert any("row_sum" in f for f in found) and any("__shfl_sync" in f for f in found)


def test_kernels_run_no_warp_collective_behind_a_condition():
    texts = _texts(SOURCES)
    names = _collective_functions(texts)
    assert {"row_sum", "warp_sum", "warp_max"} <= names, sorted(names)  # the lint sees the helpers it guards
    found = _violations(texts, names)
    assert not found, "\n".join(found)

