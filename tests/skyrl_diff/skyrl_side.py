"""SkyRL's side of the differential tier; runs in the environment of install_env.py (never imports jaxrl).

    python skyrl_side.py CASES.pkl RESULTS.pkl   # evaluate every case with SkyRL, in float32 and float64
    python skyrl_side.py --check                  # load SkyRL's modules and exit

SkyRL's code is loaded from the installed `skyrl` 0.3.0 distribution, unmodified:
  * `skyrl/backends/skyrl_train/utils/ppo_utils.py` (advantage estimators, policy losses, the loss
    reduction, KL estimators, KL controllers, the critic loss),
  * `skyrl/backends/skyrl_train/utils/off_policy_correction_utils.py` and `torch_utils.py`,
  * from `skyrl/train/trainer.py`, the one method `RayPPOTrainer.apply_reward_kl_penalty` (the KL-in-reward
    path): its source is cut out of the file with `ast` and compiled on its own, because the module imports
    the whole trainer stack.
Stubs, each only for a name used as a type hint or a decorator, never for code that computes:
  * `ray`: `ray.remote` decorates the registry's Ray actor class (identity here) and `ray.is_initialized()`
    is False (the registries then stay in-process, SkyRL's own behaviour without Ray);
  * `skyrl.train.config.AlgorithmConfig`: a type hint in ppo_utils' signatures (the real module imports
    skyrl_gym and pydantic). The config passed to the functions is a namespace with the attributes they
    read; its defaults are SkyRL's, read from `skyrl/train/config/config.py` with `ast` (`skyrl_defaults`).
  * The parent packages' `__init__.py` files are not run (they import the Tinker backend and fsspec,
    which the compared modules do not use): the packages are registered with their real folders as paths.
"""
from __future__ import annotations

import __future__ as _future
import ast
import copy
import importlib
import importlib.util
import pickle
import sys
import textwrap
import types
from pathlib import Path

UTILS = "skyrl.backends.skyrl_train.utils"


def _skyrl_root() -> Path:
    spec = importlib.util.find_spec("skyrl")  # finds the package without running its __init__ ... (below)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("skyrl is not installed in this environment (python -m tests.skyrl_diff.install_env)")
    return Path(list(spec.submodule_search_locations)[0])


def load():
    """Import SkyRL's compared modules; returns (ppo_utils, off_policy_correction_utils, torch_utils, root)."""
    root = _skyrl_root()
    for name, folder in (("skyrl", root), ("skyrl.backends", root / "backends"),
                         ("skyrl.backends.skyrl_train", root / "backends" / "skyrl_train"),
                         (UTILS, root / "backends" / "skyrl_train" / "utils")):
        pkg = types.ModuleType(name)
        pkg.__path__ = [str(folder)]
        sys.modules[name] = pkg
    ray = types.ModuleType("ray")
    ray.remote = lambda cls: cls
    ray.is_initialized = lambda: False
    sys.modules["ray"] = ray
    for name in ("skyrl.train", "skyrl.train.config"):
        sys.modules[name] = types.ModuleType(name)
    sys.modules["skyrl.train.config"].AlgorithmConfig = type("AlgorithmConfig", (), {})
    ppo = importlib.import_module(UTILS + ".ppo_utils")
    opc = importlib.import_module(UTILS + ".off_policy_correction_utils")
    tu = importlib.import_module(UTILS + ".torch_utils")
    return ppo, opc, tu, root


def skyrl_defaults(root: Path) -> dict:
    """Field defaults of SkyRL's config dataclasses ({class: {field: value}}), read from config.py's source
    (literal defaults only; nested configs are `field(default_factory=Class)`)."""
    tree = ast.parse((root / "train" / "config" / "config.py").read_text())
    out = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            fields = {}
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
                    try:
                        fields[stmt.target.id] = ast.literal_eval(stmt.value)
                    except ValueError:
                        if (isinstance(stmt.value, ast.Call) and stmt.value.keywords
                                and stmt.value.keywords[0].arg == "default_factory"):
                            fields[stmt.target.id] = ("factory", ast.unparse(stmt.value.keywords[0].value))
            out[node.name] = fields
    return out


def _method_from_source(path: Path, cls: str, method: str, namespace: dict):
    """Compile one method of a class in `path` on its own (annotations not evaluated)."""
    source = path.read_text()
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == method:
                    code = textwrap.dedent(ast.get_source_segment(source, item))
                    exec(compile(code, str(path), "exec", flags=_future.annotations.compiler_flag,
                                 dont_inherit=True), namespace)
                    return namespace[method]
    raise SystemExit(f"{cls}.{method} not found in {path}")


def ns(d):
    """A nested attribute namespace from a dict (SkyRL reads configs by attribute)."""
    return types.SimpleNamespace(**{k: ns(v) if isinstance(v, dict) else v for k, v in d.items()})


class Side:
    def __init__(self):
        import torch

        self.torch = torch
        self.ppo, self.opc, self.tu, self.root = load()
        self.defaults = skyrl_defaults(self.root)
        namespace = {"torch": torch, "compute_approx_kl": self.ppo.compute_approx_kl,
                     "masked_mean": self.tu.masked_mean}
        self.apply_reward_kl_penalty = _method_from_source(self.root / "train" / "trainer.py", "RayPPOTrainer",
                                                           "apply_reward_kl_penalty", namespace)

    # ----------------------------------------------------------------------------------------- config
    def algorithm_config(self, overrides: dict):
        """SkyRL's AlgorithmConfig defaults (from config.py) with `overrides` (nested dicts for sub-configs)."""
        d = self.defaults

        def build(cls):
            out = {}
            for k, v in d[cls].items():
                out[k] = build(v[1]) if isinstance(v, tuple) and v[0] == "factory" else v
            return out

        cfg = build("AlgorithmConfig")

        def merge(base, over):
            for k, v in over.items():
                if isinstance(v, dict) and isinstance(base.get(k), dict):
                    merge(base[k], v)
                else:
                    base[k] = v

        merge(cfg, copy.deepcopy(overrides))
        return ns(cfg)

    # ----------------------------------------------------------------------------------------- ops
    def t(self, x, dtype):
        return self.torch.tensor(x, dtype=dtype)

    def run(self, case, dtype):
        return getattr(self, "op_" + case["op"])(case, dtype)

    def op_defaults(self, case, dtype):
        return {"defaults": self.defaults}

    def op_adv(self, case, dtype):
        torch, x, o = self.torch, case["x"], case["opts"]
        cfg = self.algorithm_config({})
        kwargs = dict(token_level_rewards=self.t(x["token_rewards"], dtype), response_mask=self.t(x["response_mask"], dtype),
                      index=x["index"], adv_estimator=o["estimator"], config=cfg,
                      values=None if "values" not in x else self.t(x["values"], dtype),
                      grpo_norm_by_std=o.get("grpo_norm_by_std", True), gamma=o.get("gamma", 1.0),
                      lambd=o.get("lambd", 1.0))
        adv, ret = self.ppo.compute_advantages_and_returns(**kwargs)
        return {"advantages": adv.numpy(), "returns": ret.numpy()}

    def op_reduce(self, case, dtype):
        x, o = case["x"], case["opts"]
        adv = self.ppo.apply_loss_reduction_to_advantages_minibatch(
            self.t(x["advantages"], dtype), self.t(x["loss_mask"], dtype), o["loss_reduction"],
            micro_batch_size=x["advantages"].shape[0], max_seq_len=o.get("max_seq_len"))
        return {"scaled_advantages": adv.numpy()}

    def op_loss(self, case, dtype):
        torch, x, o = self.torch, case["x"], case["opts"]
        cfg = self.algorithm_config(o["skyrl_cfg"])
        mask = self.t(x["loss_mask"], dtype)
        adv = self.t(x["advantages"], dtype)
        if o["loss_reduction"] != "sum":  # "sum": the loss functions' own masked sum, no reduction
            adv = self.ppo.apply_loss_reduction_to_advantages_minibatch(
                adv, mask, o["loss_reduction"], micro_batch_size=adv.shape[0], max_seq_len=o.get("max_seq_len"))
        lp = self.t(x["logprobs"], dtype).requires_grad_(True)
        mu = None if "rollout_logprobs" not in x else self.t(x["rollout_logprobs"], dtype)
        fn = self.ppo.PolicyLossRegistry.get(o["policy_loss_type"])
        torch.manual_seed(0)
        loss, metrics = fn(lp, self.t(x["old_logprobs"], dtype), adv, cfg, mask, mu)
        loss.backward()
        out = {"loss": loss.detach().numpy(), "grad": lp.grad.numpy(),
               **{"metric/" + k: float(v) for k, v in metrics.items()}}
        if mu is not None:  # the tokens the off-policy masks keep (for metric denominators, compare.py)
            out["kept_mask"] = self.opc.compute_off_policy_correction(
                self.t(x["old_logprobs"], dtype), mu, mask, cfg.off_policy_correction)[2].numpy()
        return out

    def op_opc(self, case, dtype):
        x, o = case["x"], case["opts"]
        cfg = self.algorithm_config({"off_policy_correction": o["opc"]}).off_policy_correction
        ratio, metrics, mask = self.opc.compute_off_policy_correction(
            self.t(x["old_logprobs"], dtype), self.t(x["rollout_logprobs"], dtype), self.t(x["loss_mask"], dtype), cfg)
        out = {"kept_mask": mask.numpy(), **{"metric/" + k: float(v) for k, v in metrics.items()}}
        if ratio is not None:
            out["factor"] = self.torch.broadcast_to(ratio, mask.shape).numpy()
        return out

    def op_kl(self, case, dtype):
        x, o = case["x"], case["opts"]
        lp = self.t(x["logprobs"], dtype).requires_grad_(True)
        kl = self.ppo.compute_approx_kl(lp, self.t(x["ref_logprobs"], dtype), loss_mask=self.t(x["loss_mask"], dtype),
                                        kl_estimator_type=o["estimator"])
        (kl * self.t(x["cotangent"], dtype)).sum().backward()
        return {"kl": kl.detach().numpy(), "grad": lp.grad.numpy()}

    def op_kl_reward(self, case, dtype):
        """RayPPOTrainer.apply_reward_kl_penalty (SkyRL's source) with SkyRL's KL controller."""
        x, o = case["x"], case["opts"]
        cfg = self.algorithm_config({"kl_estimator_type": o["estimator"], "kl_loss_coef": o["kl_coef"],
                                     "kl_ctrl": o.get("kl_ctrl", {})})
        controller = self.ppo.get_kl_controller(cfg) if o.get("use_controller") else None
        trainer = types.SimpleNamespace(cfg=ns({"trainer": {}}), reward_kl_controller=controller, all_metrics={})
        trainer.cfg.trainer.algorithm = cfg

        class Batch(dict):
            metadata: dict

        data = Batch(loss_mask=self.t(x["loss_mask"], dtype), rewards=self.t(x["token_rewards"], dtype),
                     base_action_log_probs=self.t(x["ref_logprobs"], dtype),
                     action_log_probs=self.t(x["old_logprobs"], dtype))
        data.metadata = {}
        data = self.apply_reward_kl_penalty(trainer, data)
        m = data.metadata["metrics"]
        out = {"rewards": data["rewards"].numpy(), "avg_kl": m["avg_kl"], "avg_kl_max": m["avg_kl_max"]}
        if controller is not None:
            out["next_kl_coef"] = float(controller.value)
        return out

    def op_kl_ctrl(self, case, dtype):
        o = case["opts"]
        cfg = self.algorithm_config({"kl_loss_coef": o["init"], "kl_ctrl": {"type": o["type"], "kl_target": o["target"],
                                                                              "horizon": o["horizon"]}})
        ctrl = self.ppo.get_kl_controller(cfg)
        values = []
        for current, n_steps in o["updates"]:
            ctrl.update(current=current, n_steps=n_steps)
            values.append(float(ctrl.value))
        return {"values": values}

    def op_critic(self, case, dtype):
        x, o = case["x"], case["opts"]
        cfg = self.algorithm_config({"value_clip": o["value_clip"]})
        v = self.t(x["values"], dtype).requires_grad_(True)
        loss, clipfrac = self.ppo.ppo_critic_loss(v, self.t(x["old_values"], dtype), self.t(x["returns"], dtype), cfg,
                                                  loss_mask=self.t(x["loss_mask"], dtype))
        loss.backward()
        out = {"loss": loss.detach().numpy(), "grad": v.grad.numpy()}
        if clipfrac is not None:
            out["values_clipfrac"] = float(clipfrac)
        return out


def main(argv):
    if argv[1:] == ["--check"]:
        Side()
        return 0
    import numpy as np
    import torch

    side = Side()
    cases = pickle.loads(Path(argv[1]).read_bytes())
    results = {}
    for case in cases:
        out = {}
        for name, dtype in (("float32", torch.float32), ("float64", torch.float64)):
            try:
                r = side.run(case, dtype)
                out[name] = {k: (np.asarray(v) if not isinstance(v, (dict, list)) else v) for k, v in r.items()}
            except Exception as e:  # recorded: a difference list entry may expect SkyRL to raise
                out[name] = {"error": f"{type(e).__name__}: {e}"}
        results[case["id"]] = out
    tmp = Path(argv[2] + ".tmp")
    tmp.write_bytes(pickle.dumps(results))
    tmp.replace(argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
