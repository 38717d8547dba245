"""One vLLM engine, one attention backend, greedy tokens of the tests' tiny Llama: the first thing to run
after ``tools/vllm_gpu_setup.sh ... install`` (outside pytest, one process per engine; the same tokens
from ``CUSTOM`` and ``FLASH_ATTN`` say our backend serves).

    bash tools/vllm_gpu_setup.sh run python3 benchmarks/smoke_vllm.py save
    bash tools/vllm_gpu_setup.sh run python3 benchmarks/smoke_vllm.py graph CUSTOM   # or eager, FLASH_ATTN
"""
import argparse
import os
from pathlib import Path

import torch

import _harness as H

s = H.tests_module("_vllm_serve")  # the tests' model builder: one definition


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["save", "eager", "graph"], help="save the model, or serve it eagerly or "
                   "with torch.compile and CUDA graphs")
    p.add_argument("backend", nargs="?", default="CUSTOM", help="vLLM attention backend (default CUSTOM)")
    p.add_argument("--model-dir", default="/root/tiny")
    args = p.parse_args(argv)
    model = Path(args.model_dir)
    if args.mode == "save":
        s.save_sized(model, "tiny")
        return 0
    os.environ.update(s.OFFLINE_ENV)
    from vllm import LLM, SamplingParams

    llm = LLM(model=str(model), tokenizer=str(model), dtype="bfloat16", max_model_len=320,
              enforce_eager=args.mode == "eager", gpu_memory_utilization=0.3,
              block_size=16 if torch.cuda.is_available() else 32,  # vLLM's CPU backend takes multiples of 32
              attention_config={"backend": args.backend})
    out = llm.generate([{"prompt_token_ids": list(range(5, 40))}], SamplingParams(max_tokens=8, temperature=0))
    print("RESULT", args.mode, args.backend, out[0].outputs[0].token_ids)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
