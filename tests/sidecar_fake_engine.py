"""A deterministic stand-in engine for sidecar tests (no JAX model; starts in a second).

Token t of sample j of prompt i is ``(sum(prompt) + w + seed + 7*i + j + t) % 100`` where ``w`` is
the scalar "weight" it serves; its logprob is ``-0.01 * (t + 1) - w``. Generation stops after a
stop id (included) or ``max_tokens``.
"""
import os
import threading
import time

import numpy as np

from jaxrl.rollout import weight_sync
from jaxrl.rollout.types import Completion


def expected_tokens(prompt, w, seed, i, j, max_tokens, stop=()):
    out = []
    for t in range(max_tokens):
        tok = (sum(prompt) + int(w) + seed + 7 * i + j + t) % 100
        out.append(tok)
        if tok in stop:
            return out, "stop"
    return out, "length"


class FakeEngine:
    eos_token_ids = ()

    def __init__(self, delay_s: float = 0.0, load_delay_s: float = 0.0):
        self.w = 0.0
        self.load_delay_s = load_delay_s
        self.policy_version = 0
        self.delay_s = delay_s
        self.batches = []  # rows per engine call
        self.params = []  # SamplingParams of every request, in arrival order
        self.lock = threading.Lock()

    def generate_requests(self, requests):
        time.sleep(self.delay_s)
        with self.lock:
            self.batches.append(sum(len(p) * sp.n for p, sp in requests))
            self.params.extend(sp for _, sp in requests)
        out = []
        for prompts, sp in requests:
            per_prompt = []
            for i, p in enumerate(prompts):
                comps = []
                for j in range(sp.n):
                    toks, reason = expected_tokens(p, self.w, sp.seed, i, j, sp.max_tokens, sp.stop_token_ids)
                    comps.append(Completion(toks, [-0.01 * (t + 1) - self.w for t in range(len(toks))], reason,
                                            self.policy_version))
                per_prompt.append(comps)
            out.append(per_prompt)
        return out

    def load_version(self, version_dir, version):
        if os.environ.get("FAKE_ENGINE_LOAD_STARTED_FILE"):  # tells a test the load is in the engine
            open(os.environ["FAKE_ENGINE_LOAD_STARTED_FILE"], "a").close()
        time.sleep(self.load_delay_s)
        sync_dir = os.path.dirname(version_dir)
        tree, stats = weight_sync.load(sync_dir, version)
        self.w = float(np.asarray(tree["w"]).astype(np.float32))
        self.policy_version = version
        return stats


def make_fake_engine(args):
    """Sidecar `--engine tests.sidecar_fake_engine:make_fake_engine`; FAKE_ENGINE_DELAY_S and
    FAKE_ENGINE_LOAD_DELAY_S set delays of generation and weight loads; FAKE_ENGINE_LOAD_STARTED_FILE
    names a file created when a weight load starts."""
    return FakeEngine(delay_s=float(os.environ.get("FAKE_ENGINE_DELAY_S", "0")),
                      load_delay_s=float(os.environ.get("FAKE_ENGINE_LOAD_DELAY_S", "0")))
