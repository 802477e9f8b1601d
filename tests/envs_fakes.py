"""Scripted generators for the jaxrl.envs tests (no model: outputs come from a Python function)."""
from __future__ import annotations

import dataclasses
from typing import Callable

from jaxrl.rollout.types import Completion, SamplingParams


@dataclasses.dataclass
class Call:
    """One sampled completion as the engine saw it."""

    prompt: list[int]
    params: SamplingParams
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str


class ScriptedGenerator:
    """A `Generator` whose outputs are scripted by `policy(prompt_text, sample_index) -> text`.

    The text is tokenized with the chat tokenizer and the turn-end token is appended (as a model
    ending its turn would); `max_tokens` truncates it (finish_reason "length"). Logprobs are
    -0.01 * (global position of the token in this generator's output stream + 1), so every
    generated token has a distinct, known logprob. Every completion is recorded in `calls`.
    """

    def __init__(self, chat, policy: Callable[[str, int], str], policy_version: int = 0):
        self.chat = chat
        self.policy = policy
        self.policy_version = policy_version
        self.calls: list[Call] = []
        self.batches: list[tuple[int, SamplingParams]] = []  # (number of prompts, params) per generate call
        self._counter = 0

    def generate(self, prompts, params: SamplingParams):
        self.batches.append((len(prompts), params))
        out = []
        for prompt in prompts:
            text_in = self.chat.tokenizer.decode(list(prompt))
            comps = []
            for j in range(params.n):
                ids = self.chat.encode_text(self.policy(text_in, j)) + [self.chat.turn_end_id]
                finish = "stop"
                if len(ids) > params.max_tokens:
                    ids, finish = ids[:params.max_tokens], "length"
                logprobs = [-0.01 * (self._counter + k + 1) for k in range(len(ids))]
                self._counter += len(ids)
                self.calls.append(Call(list(prompt), params, ids, logprobs, finish))
                comps.append(Completion(ids, logprobs, finish, self.policy_version))
            out.append(comps)
        return out


class ScriptedTurns:
    """A `Generator` that answers every request with the next scripted turn (token ids), `n`
    identical stop-ended completions per prompt (logprobs 0)."""

    def __init__(self, turns):
        self.turns = list(turns)

    def generate(self, prompts, params: SamplingParams):
        ids = self.turns.pop(0)
        return [[Completion(list(ids), [0.0] * len(ids), "stop") for _ in range(params.n)] for _ in prompts]
