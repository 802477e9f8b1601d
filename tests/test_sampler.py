"""The JAX KV-cache sampler against the model's full (no-cache) forward and numpy references."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from jaxrl.models import qwen3, qwen3_engine
from jaxrl.rollout.sampler import Sampler, select_tokens
from jaxrl.rollout.types import SamplingParams

T_REF = 48  # padded length of the reference forward


@pytest.fixture(scope="module")
def model():
    cfg = qwen3.Qwen3Config.preset("tiny")  # float32, vocab 256
    params = qwen3.init_params(cfg, seed=0)
    # Twice the 0.02 init: logits far enough from uniform for clear argmax margins, while the
    # float32 round-off of the cached path (S=1 matmuls) stays ~1e-6 in the logits.
    params = jax.tree.map(lambda x: x * 2.0 if x.ndim > 1 else x, params)
    return cfg, params


@pytest.fixture(scope="module")
def sampler(model):
    cfg, params = model
    # One bucket per axis: every test below shares one compiled program.
    return Sampler(params, cfg, max_seq_len=48, batch_buckets=(8,), prompt_buckets=(32,), new_token_buckets=(16,))


@pytest.fixture(scope="module")
def full_logits(model):
    """Logits of the plain forward (no cache) of one unpadded sequence, float64 numpy [L, V]."""
    cfg, params = model
    fwd = jax.jit(lambda t, p, s: qwen3.forward(params, cfg, t, p, s))

    def run(seq):
        L = len(seq)
        tok = np.zeros((1, T_REF), np.int32)
        tok[0, :L] = seq
        seg = np.zeros((1, T_REF), np.int32)
        seg[0, :L] = 1
        pos = np.arange(T_REF, dtype=np.int32)[None]
        return np.asarray(fwd(tok, pos, seg), np.float64)[0, :L]

    return run


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


PROMPTS = [[3, 1, 4], [1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4], [7], [2, 7, 1, 8, 2, 8, 1, 8, 2]]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_greedy_equals_full_forward_argmax_and_logprobs(sampler, full_logits, temperature):
    out = sampler.generate(PROMPTS, SamplingParams(max_tokens=12, greedy=True, temperature=temperature))
    for prompt, (c,) in zip(PROMPTS, out):
        assert c.finish_reason == "length" and len(c.token_ids) == 12
        logits = full_logits(prompt + c.token_ids)
        P = len(prompt)
        step_logits = logits[P - 1:P - 1 + 12]  # position t predicts generated token t
        np.testing.assert_array_equal(c.token_ids, step_logits.argmax(-1))
        ref = _log_softmax(step_logits / temperature)[np.arange(12), c.token_ids]
        np.testing.assert_allclose(c.logprobs, ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_equal_full_forward(sampler, full_logits, temperature):
    params = SamplingParams(max_tokens=14, temperature=temperature, seed=5, n=2)
    out = sampler.generate(PROMPTS[:3], params)
    for prompt, comps in zip(PROMPTS[:3], out):
        for c in comps:
            logits = full_logits(prompt + c.token_ids)
            P, n = len(prompt), len(c.token_ids)
            ref = _log_softmax(logits[P - 1:P - 1 + n] / temperature)[np.arange(n), c.token_ids]
            np.testing.assert_allclose(c.logprobs, ref, atol=1e-5, rtol=0)
        assert comps[0].token_ids != comps[1].token_ids  # two samples of a prompt use different keys


def test_row_output_independent_of_batch(sampler):
    req = ([[4, 4, 2], [9, 1, 1, 3, 5]], SamplingParams(max_tokens=10, temperature=0.9, top_p=0.95, top_k=40,
                                                         n=2, seed=11))
    others = [([[1] * 20, [5, 6]], SamplingParams(max_tokens=16, temperature=1.3, seed=2)),
              ([[8, 8, 8, 8]], SamplingParams(max_tokens=3, greedy=True, stop_token_ids=(8,)))]
    alone = sampler.generate_requests([req])[0]
    batched = sampler.generate_requests([others[0], req, others[1]])[1]
    for a_group, b_group in zip(alone, batched):
        for a, b in zip(a_group, b_group):
            assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-6, rtol=0)
    # The same request again reproduces itself (per-request seed).
    again = sampler.generate(*req)
    assert [[c.token_ids for c in g] for g in again] == [[c.token_ids for c in g] for g in alone]


def test_stop_tokens_end_exactly_the_rows_that_emit_them(sampler):
    free = sampler.generate(PROMPTS, SamplingParams(max_tokens=12, greedy=True))
    seqs = [g[0].token_ids for g in free]
    stops = (seqs[0][4], seqs[2][7])
    expected = []
    for s in seqs:
        hits = [i for i, t in enumerate(s) if t in stops]
        expected.append((s[:hits[0] + 1], "stop") if hits else (s, "length"))
    reasons = {r for _, r in expected}
    assert reasons == {"stop", "length"}, "the test needs rows that stop and rows that do not"
    out = sampler.generate(PROMPTS, SamplingParams(max_tokens=12, greedy=True, stop_token_ids=stops))
    for (tokens, reason), (c,) in zip(expected, out):
        assert c.token_ids == tokens and c.finish_reason == reason
        assert len(c.logprobs) == len(tokens)


TOY_LOGITS = np.array([2.0, 1.5, 1.2, 0.3, 0.0, -0.5, -1.0, -3.0], np.float32)


def _np_softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def _draw(temperature, top_p, top_k, n=20000):
    B = n
    logits = jnp.broadcast_to(jnp.asarray(TOY_LOGITS), (B, TOY_LOGITS.size))
    keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.PRNGKey(1234), i))(jnp.arange(B))
    tok, lp = jax.jit(select_tokens)(logits, keys, jnp.full(B, temperature, jnp.float32),
                                     jnp.full(B, top_p, jnp.float32), jnp.full(B, top_k, jnp.int32),
                                     jnp.zeros(B, bool))
    return np.asarray(tok), np.asarray(lp)


@pytest.mark.parametrize("temperature,top_p,top_k,support", [
    (1.0, 1.0, 0, list(range(8))),
    (1.0, 1.0, 3, [0, 1, 2]),
    (0.5, 1.0, 0, list(range(8))),
    # softmax(TOY) = [.398 .241 .179 .073 .054 .033 .020 .003] (by hand): the mass before index 2
    # is .639 < .7 and before index 3 is .818 >= .7, so the 0.7-nucleus is {0, 1, 2}.
    (1.0, 0.7, 0, [0, 1, 2]),
    (1.0, 0.7, 2, [0, 1]),
    (1.0, 0.3, 0, [0]),
])
def test_sampling_frequencies_match_probabilities(temperature, top_p, top_k, support):
    p_full = _np_softmax(TOY_LOGITS.astype(np.float64) / temperature)
    if top_p < 1.0:  # independent check of the nucleus given in the parametrization
        mass_before = np.cumsum(p_full) - p_full
        nucleus = set(np.nonzero(mass_before < top_p)[0].tolist())
        assert nucleus == set(support) or (top_k and set(support) == set(sorted(nucleus)[:top_k]))
    tok, lp = _draw(temperature, top_p, top_k)
    assert set(np.unique(tok)) <= set(support)
    p = p_full[support] / p_full[support].sum()
    counts = np.array([(tok == s).sum() for s in support])
    if len(support) > 1:
        keep = p * len(tok) >= 5  # chi-square validity: expected counts >= 5
        chi2 = stats.chisquare(counts[keep], p[keep] / p[keep].sum() * counts[keep].sum())
        assert chi2.pvalue > 1e-3, (counts, p * len(tok))
    else:
        assert counts[0] == len(tok)
    # logprobs: log softmax(logits / T) of the sampled token, not renormalised by the filter.
    np.testing.assert_allclose(lp, np.log(p_full)[tok], atol=1e-5)


def test_engine_top_k_sampling_stays_in_top_k(sampler, full_logits):
    out = sampler.generate(PROMPTS, SamplingParams(max_tokens=10, temperature=1.5, top_k=2, seed=9, n=2))
    for prompt, group in zip(PROMPTS, out):
        for c in group:
            logits = full_logits(prompt + c.token_ids)[len(prompt) - 1:len(prompt) - 1 + len(c.token_ids)]
            top2 = np.argsort(-logits, axis=-1)[:, :2]
            assert all(t in row for t, row in zip(c.token_ids, top2))


def test_set_params_changes_output_without_recompiling(sampler, model):
    cfg, params = model
    before = sampler.num_compiled
    ref = sampler.generate(PROMPTS[:2], SamplingParams(max_tokens=8, greedy=True))
    new = jax.tree.map(lambda x: x * 1.1, params)
    sampler.set_params(new, policy_version=3)
    try:
        out = sampler.generate(PROMPTS[:2], SamplingParams(max_tokens=8, greedy=True))
        assert all(g[0].policy_version == 3 for g in out)
        assert [g[0].token_ids for g in out] != [g[0].token_ids for g in ref]
        assert sampler.num_compiled == before
        with pytest.raises(ValueError, match="shape"):
            sampler.set_params(jax.tree.map(lambda x: x[:1], params), 4)
    finally:
        sampler.set_params(params, policy_version=0)


def test_bad_requests_are_refused_with_the_field_named(sampler):
    with pytest.raises(ValueError, match="max_seq_len"):
        sampler.generate([[1] * 40], SamplingParams(max_tokens=16))
    with pytest.raises(ValueError, match="empty"):
        sampler.generate([[]], SamplingParams(max_tokens=4))
    with pytest.raises(ValueError, match="token ids"):
        sampler.generate([[256]], SamplingParams(max_tokens=4))
    with pytest.raises(ValueError, match="stop_token_ids"):
        sampler.generate([[1]], SamplingParams(max_tokens=4, stop_token_ids=tuple(range(9))))


def test_compiles_a_bounded_number_of_programs(model):
    cfg, params = model
    s = Sampler(params, cfg, max_seq_len=24, batch_buckets=(2, 4), prompt_buckets=(16,), new_token_buckets=(8,))
    # Rows per group: powers of two dividing a batch bucket, {1, 2, 4}; (R, B) pairs with R | B:
    # (1,2) (1,4) (2,2) (2,4) (4,4); x 1 prompt bucket x 1 new-token bucket x 4 switch variants.
    assert s.group_buckets == (1, 2, 4)
    assert s.max_num_programs == 5 * 1 * 1 * 4
    before = s.num_compiled  # programs are shared by the Samplers of one config (the fixture's too)
    rng = np.random.default_rng(0)
    requests = []
    for i in range(6):
        prompts = [rng.integers(0, 256, size=int(rng.integers(1, 17))).tolist() for _ in range(int(rng.integers(1, 4)))]
        requests.append((prompts, SamplingParams(max_tokens=int(rng.integers(1, 9)), seed=i,
                                                 temperature=float(rng.uniform(0.5, 1.5)))))
    for r in requests:
        out = s.generate(*r)
        assert all(1 <= len(c.token_ids) <= r[1].max_tokens for g in out for c in g)
    s.generate_requests(requests)  # 6 requests, 12 rows: chunks of at most 4 rows
    # n = 1, all sampling, no filter: one program per batch bucket, (R, B) = (1, 2) and (1, 4).
    assert s.num_compiled - before == 2
    for r in requests[::-1]:
        s.generate(*r)
    assert s.num_compiled - before == 2


# ---------------------------------------------------------------------------------------------
# top-p / top-k without sorting, and the "sampled" logprobs mode
# ---------------------------------------------------------------------------------------------

def _np_kept(scaled, top_p, top_k):
    """float64 reference of the kept set, by sorting: the k largest tokens and the prefix of the
    descending order whose preceding mass is < top_p; every token tied with the last kept one."""
    desc = np.sort(scaled)[::-1]
    p = np.exp(desc - desc.max())
    p /= p.sum()
    before = np.cumsum(p) - p
    keep = np.ones(len(desc), bool)
    if top_p < 1.0:
        keep &= before < top_p
    if top_k > 0:
        keep &= np.arange(len(desc)) < top_k
    return scaled >= desc[keep].min()


def _np_margin(scaled, top_p):
    """Distance of top_p from the nearest preceding-mass value (float64): float32 sums cannot
    decide the kept set of a row closer than ~1e-6 to a boundary, and neither can a sort."""
    desc = np.sort(scaled)[::-1]
    p = np.exp(desc - desc.max())
    p /= p.sum()
    return np.min(np.abs(np.cumsum(p) - p - top_p))


def test_filter_mask_equals_the_sorting_rule():
    from jaxrl.rollout.sampler import filter_mask

    rng = np.random.default_rng(0)
    rows, settings = [], []
    while len(rows) < 48:
        V = 300
        x = rng.standard_normal(V) * rng.uniform(0.5, 4.0)
        if len(rows) % 3 == 0:
            x = np.round(x, 1)  # many ties, also at the threshold
        top_p = float(rng.choice([1.0, 0.95, 0.9, 0.5, 0.1, 1e-3]))
        top_k = int(rng.choice([0, 1, 5, 40, 299, 300, 1000]))
        if top_p < 1.0 and _np_margin(x, top_p) < 1e-5:
            continue
        rows.append(x)
        settings.append((top_p, top_k))
    scaled = np.asarray(rows, np.float32)
    top_p = np.array([s[0] for s in settings], np.float32)
    top_k = np.array([s[1] for s in settings], np.int32)
    got = np.asarray(jax.jit(filter_mask)(scaled, top_p, top_k))
    for i, (p, k) in enumerate(settings):
        want = _np_kept(scaled[i].astype(np.float64), p, k)
        np.testing.assert_array_equal(got[i], want, err_msg=f"row {i} top_p={p} top_k={k}")
    sizes = got.sum(1)
    assert sizes.min() == 1 and sizes.max() == 300 and len(set(sizes.tolist())) > 10  # the cases vary


def test_top_p_one_keeps_every_token_when_the_mass_rounds_to_one():
    # One dominant token: in float32 the running mass reaches 1.0 before the last tokens, so a
    # cumulative-sum test "mass before < 1.0" would drop them. top_p = 1 must filter nothing,
    # also in a batch where another row uses top-p.
    from jaxrl.rollout.sampler import filter_mask

    x = np.zeros((2, 4096), np.float32)
    x[:, 0] = 20.0
    x[:, 1:] = -np.linspace(0, 2, 4095)  # distinct (a tie with the last kept token keeps all ties)
    keep = np.asarray(filter_mask(jnp.asarray(x), jnp.array([1.0, 0.5], jnp.float32), jnp.array([0, 0], jnp.int32)))
    assert keep[0].all()
    assert keep[1].sum() == 1 and keep[1, 0]


@pytest.mark.parametrize("temperature,top_p,top_k,support", [
    (1.0, 1.0, 3, [0, 1, 2]),
    (1.0, 0.7, 0, [0, 1, 2]),
    (0.5, 1.0, 2, [0, 1]),
])
def test_sampled_logprobs_are_renormalised_over_the_kept_set(temperature, top_p, top_k, support):
    B = 2000
    logits = jnp.broadcast_to(jnp.asarray(TOY_LOGITS), (B, TOY_LOGITS.size))
    keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.PRNGKey(99), i))(jnp.arange(B))
    mode = jnp.arange(B) % 2 == 0  # rows of both modes in one batch
    tok, lp = jax.jit(select_tokens)(logits, keys, jnp.full(B, temperature, jnp.float32),
                                     jnp.full(B, top_p, jnp.float32), jnp.full(B, top_k, jnp.int32),
                                     jnp.zeros(B, bool), mode)
    tok, lp, mode = np.asarray(tok), np.asarray(lp), np.asarray(mode)
    p_full = _np_softmax(TOY_LOGITS.astype(np.float64) / temperature)
    assert set(np.unique(tok)) == set(support)
    want_sampled = np.log(p_full[tok] / p_full[support].sum())
    want_full = np.log(p_full[tok])
    np.testing.assert_allclose(lp[mode], want_sampled[mode], atol=1e-6)
    np.testing.assert_allclose(lp[~mode], want_full[~mode], atol=1e-6)
    # The mode changes the reported logprob, never the draw (same keys -> same tokens).
    tok2, _ = jax.jit(select_tokens)(logits, keys, jnp.full(B, temperature, jnp.float32),
                                     jnp.full(B, top_p, jnp.float32), jnp.full(B, top_k, jnp.int32),
                                     jnp.zeros(B, bool), ~jnp.asarray(mode))
    np.testing.assert_array_equal(np.asarray(tok2), tok)


def test_engine_sampled_logprobs_mode_against_the_full_forward(sampler, full_logits):
    T, top_p, top_k = 0.8, 0.9, 6
    sampled = SamplingParams(max_tokens=12, temperature=T, top_p=top_p, top_k=top_k, seed=21, n=2,
                             logprobs_mode="sampled")
    full = dataclasses.replace(sampled, logprobs_mode="full")
    out_s, out_f = sampler.generate_requests([(PROMPTS[:2], sampled), (PROMPTS[:2], full)])  # one batch
    differ = 0
    for prompt, gs, gf in zip(PROMPTS[:2], out_s, out_f):
        for cs, cf in zip(gs, gf):
            assert cs.token_ids == cf.token_ids  # same seed: the mode does not change the draw
            n, P = len(cs.token_ids), len(prompt)
            z = full_logits(prompt + cs.token_ids)[P - 1:P - 1 + n] / T
            for t, (tok, lps, lpf) in enumerate(zip(cs.token_ids, cs.logprobs, cf.logprobs)):
                kept = _np_kept(z[t], top_p, top_k)
                assert kept[tok]
                zk = z[t][kept]
                np.testing.assert_allclose(lps, z[t, tok] - (zk.max() + np.log(np.exp(zk - zk.max()).sum())),
                                           atol=1e-5)
                np.testing.assert_allclose(lpf, _log_softmax(z[t])[tok], atol=1e-5)
                differ += kept.sum() < len(kept)
    assert differ > 10  # the filter was active on most steps, so the two modes were compared


def test_bad_logprobs_mode_is_refused():
    with pytest.raises(ValueError, match="logprobs_mode"):
        SamplingParams(logprobs_mode="processed")


# ---------------------------------------------------------------------------------------------
# Prefix sharing: one prefill per prompt, the same tokens as one prefill per sample
# ---------------------------------------------------------------------------------------------

def test_prefix_shared_engine_prefills_once_and_equals_the_unshared_one(model, monkeypatch):
    cfg, params = model
    prefill_rows = []
    real = qwen3_engine.prefill

    def spy(ep, cfg, tokens, token_mask):
        prefill_rows.append(tokens.shape[0])
        return real(ep, cfg, tokens, token_mask)

    monkeypatch.setattr(qwen3_engine, "prefill", spy)
    kw = dict(max_seq_len=48, batch_buckets=(8,), prompt_buckets=(32,), new_token_buckets=(16,))
    shared = Sampler(params, cfg, **kw)
    unshared = Sampler(params, cfg, share_prefix=False, **kw)
    # n = 3: groups of R = 4 rows (one padding row each); a stop id ends some rows early.
    req = (PROMPTS[1:3], SamplingParams(max_tokens=14, temperature=1.2, n=3, seed=7, stop_token_ids=(5,)))
    a = shared.generate(*req)
    assert prefill_rows == [2]  # 2 prompts x 3 samples: each prompt prefilled once
    b = unshared.generate(*req)
    assert unshared.group_buckets == (1,)
    # One prefill per sample (6 rows, padded to 8); traced only if no earlier test compiled it.
    assert prefill_rows[1:] in ([], [8])
    for ga, gb in zip(a, b):
        assert len(ga) == len(gb) == 3
        for ca, cb in zip(ga, gb):
            assert ca.token_ids == cb.token_ids and ca.finish_reason == cb.finish_reason
            np.testing.assert_allclose(ca.logprobs, cb.logprobs, atol=1e-6, rtol=0)
    assert len({tuple(c.token_ids) for g in a for c in g}) == 6  # distinct samples


@pytest.mark.parametrize("layout", qwen3_engine.ENGINE_LAYOUTS)
def test_prefill_and_decode_steps_equal_the_full_forward(model, full_logits, layout):
    """The engine's model path alone: prefill of right- and left-padded prompts, then decode steps
    in both cache layouts (shared: R = 2 rows per prompt feeding different tokens; row: one row
    per prompt), against the plain forward of each row's sequence; in every weight layout (the
    CPU's "out_in" multiplies the decode steps' 2 and 4 rows as a multiply-reduce)."""
    cfg, params = model
    ep = qwen3_engine.engine_params(params, cfg, layout=layout)
    assert ("qkv_proj_t" in ep["layers"][0]) == (layout == "out_in")
    prompts, P, steps = [[3, 1, 4, 1, 5], [9, 2, 6]], 8, 3
    fed = [[7, 8, 9], [10, 11, 12], [13, 14, 15], [16, 17, 18]]
    prefill = jax.jit(lambda ep, t, m: qwen3_engine.prefill(ep, cfg, t, m))
    decode = jax.jit(lambda ep, t, pos, pkv, m, gen, i: qwen3_engine.decode_step(ep, cfg, t, pos, pkv, m, gen, i))
    for side in ("right", "left"):
        tokens, mask = np.zeros((2, P), np.int32), np.zeros((2, P), bool)
        for g, p in enumerate(prompts):
            sl = slice(0, len(p)) if side == "right" else slice(P - len(p), P)
            tokens[g, sl], mask[g, sl] = p, True
        logits, pkv = prefill(ep, tokens, mask)
        Nkv, D = cfg.num_key_value_heads, cfg.head_dim  # qwen3_engine.KV_LAYOUT: keys slot-minor
        assert [(k.shape, v.shape) for k, v in pkv] == [((2, Nkv, D, P), (2, Nkv, P, D))] * cfg.num_hidden_layers
        for g, p in enumerate(prompts):
            np.testing.assert_allclose(logits[g], full_logits(p)[-1], atol=1e-5, rtol=0)
        for R in (2, 1):  # row b continues prompt b // R
            rows = fed[:2 * R]
            shared, gen = ((pkv, qwen3_engine.init_decode_cache(cfg, 2 * R, steps)) if R > 1
                           else (None, qwen3_engine.row_cache(pkv, steps)))
            plen = np.repeat([len(p) for p in prompts], R)
            for t in range(steps):
                tok = np.array([f[t] for f in rows], np.int32)
                out, gen = decode(ep, tok, plen + t, shared, mask, gen, t)
                for b in range(2 * R):
                    want = full_logits(prompts[b // R] + rows[b][:t + 1])[-1]
                    np.testing.assert_allclose(out[b], want, atol=1e-5, rtol=0, err_msg=f"{side} R={R} row {b} t={t}")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("rows", [1, 2, 16, 17])
def test_projection_in_every_layout_against_float64(rows, dtype):
    """`qwen3_engine._project` (GEMV at 1 row, multiply-reduce at 2-16 rows in the "out_in" layout, dot
    above) against a float64 numpy
    matmul of the same (rounded) inputs: float32 to 1e-6 of the bound on the round-off;
    bfloat16 within the rounding of the output (float32 accumulation)."""
    rng = np.random.default_rng(rows)
    x = jnp.asarray(rng.standard_normal((rows, 96)), dtype)
    w = jnp.asarray(rng.standard_normal((96, 48)), dtype)  # [in, out]
    want = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
    scale = np.abs(np.asarray(x, np.float64)) @ np.abs(np.asarray(w, np.float64))  # bounds the round-off
    tol = 1e-6 if dtype == "float32" else 2 ** -8
    layouts = [({"w": w}, "w"), ({"w_t": w.T}, "w")]
    for p, name in layouts:
        got = jax.jit(lambda x, p: qwen3_engine._project(x, p, name))(x, p)
        assert got.dtype == jnp.dtype(dtype) and got.shape == (rows, 48)
        assert np.all(np.abs(np.asarray(got, np.float64) - want) <= tol * scale), (p.keys(), rows, dtype)
        got32 = jax.jit(lambda x, p: qwen3_engine._project(x, p, name, jnp.float32))(x, p)
        assert got32.dtype == jnp.float32
        assert np.all(np.abs(np.asarray(got32, np.float64) - want) <= 1e-6 * scale), (p.keys(), rows, dtype)


def test_engine_layouts_give_the_same_tokens_and_logprobs(model):
    """A Sampler of 2 to 16 rows on CPU runs the "out_in" layout; the "in_out" one (GPU, TPU) run
    here on the same requests gives the same tokens, and logprobs within float32 round-off."""
    cfg, params = model
    kw = dict(max_seq_len=48, batch_buckets=(8,), prompt_buckets=(32,), new_token_buckets=(16,))
    a = Sampler(params, cfg, **kw)
    assert a.layout == "out_in" and "qkv_proj_t" in a.params["layers"][0]
    others = [Sampler(params, cfg, **kw, layout="in_out")]
    assert "qkv_proj" in others[0].params["layers"][0]
    for sp in (SamplingParams(max_tokens=16, greedy=True, n=2, seed=0),
               SamplingParams(max_tokens=16, temperature=1.0, n=2, seed=3)):
        want = a.generate(PROMPTS, sp)
        for b in others:
            for ga, gb in zip(want, b.generate(PROMPTS, sp)):
                for ca, cb in zip(ga, gb):
                    assert ca.token_ids == cb.token_ids
                    np.testing.assert_allclose(ca.logprobs, cb.logprobs, atol=1e-5, rtol=0)




def test_engine_raw_logprobs_mode_is_temperature_one_full_vocabulary(sampler, full_logits):
    # the seed runs' mu: log_softmax(logits) at T 1, whatever T / top-p / top-k drew the token
    T, top_p, top_k = 1.2, 0.95, 20
    raw = SamplingParams(max_tokens=12, temperature=T, top_p=top_p, top_k=top_k, seed=3, n=2, logprobs_mode="raw")
    full = dataclasses.replace(raw, logprobs_mode="full")
    out_r, out_f = sampler.generate_requests([(PROMPTS[:2], raw), (PROMPTS[:2], full)])
    for prompt, gr, gf in zip(PROMPTS[:2], out_r, out_f):
        for cr, cf in zip(gr, gf):
            assert cr.token_ids == cf.token_ids  # the mode does not change the draw
            n, P = len(cr.token_ids), len(prompt)
            logits = full_logits(prompt + cr.token_ids)[P - 1:P - 1 + n]
            np.testing.assert_allclose(cr.logprobs, _log_softmax(logits)[np.arange(n), cr.token_ids], atol=1e-5)
            np.testing.assert_allclose(cf.logprobs, _log_softmax(logits / T)[np.arange(n), cr.token_ids], atol=1e-5)
