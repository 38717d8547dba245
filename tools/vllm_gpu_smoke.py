"""One vLLM engine, one attention backend, greedy tokens of the tests' tiny Llama: the first thing to run
after ``tools/vllm_gpu_setup.sh ... install`` (outside pytest, one process per engine).

    bash tools/vllm_gpu_setup.sh run python3 tools/vllm_gpu_smoke.py save
    bash tools/vllm_gpu_setup.sh run python3 tools/vllm_gpu_smoke.py graph CUSTOM   # or eager, FLASH_ATTN
"""
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import _vllm_serve as s  # noqa: E402

MODEL = Path(os.environ.get("AURA_SMOKE_MODEL", "/root/tiny"))

if sys.argv[1] == "save":
    s.save_llama_sized(MODEL, "tiny")
    sys.exit()
mode, backend = sys.argv[1], sys.argv[2]
os.environ.update(s.OFFLINE_ENV)
from vllm import LLM, SamplingParams  # noqa: E402

llm = LLM(model=str(MODEL), tokenizer=str(MODEL), dtype="bfloat16", max_model_len=320, enforce_eager=mode == "eager",
          gpu_memory_utilization=0.3, block_size=16, attention_config={"backend": backend})
out = llm.generate([{"prompt_token_ids": list(range(5, 40))}], SamplingParams(max_tokens=8, temperature=0))
print("RESULT", mode, backend, out[0].outputs[0].token_ids)
