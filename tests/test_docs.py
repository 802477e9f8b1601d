"""The project's documents cannot rot silently: every code reference in docs/architecture.md and
docs/recipes.md names something that exists, docs/recipes.md covers every shipped recipe, scale
and `trainer.algorithm.*` key, and README.md stays a front page (at most 8 KiB, its set-up commands,
links that resolve to every docs/ page); the manual lives in docs/.

References are resolved statically (by reading the source with `ast`), so this test imports no
module of jaxrl except `jaxrl.config` and runs in well under a second.
"""
import ast
import functools
import pathlib
import re

import pytest

from jaxrl import config as config_lib

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
ARCH = DOCS / "architecture.md"
RECIPES = DOCS / "recipes.md"
CHECKED_DOCS = [ARCH, RECIPES]

# `jaxrl/train/trainer.py:Trainer._rl_step`, `jaxrl/rl/losses.py:micro_batch_loss`, `configs/rloo.py`
FILE_REF = re.compile(r"`((?:jaxrl|configs|launch|tests|bench|scripts|notebooks)/[\w./-]+\.(?:py|sh|ipynb))"
                      r"(?::([\w.]+))?`")
# `jaxrl.envs.harbor.load_task_set`, `jaxrl.rl`
DOTTED_REF = re.compile(r"`(jaxrl(?:\.\w+)+)`")
CONFIG_SECTIONS = ("trainer", "generator", "data", "model", "mesh")
CONFIG_REF = re.compile(r"`((?:%s)\.[\w.]+)(?:=[^`]*)?`" % "|".join(CONFIG_SECTIONS))
FILE_SUFFIX = re.compile(r"\.(py|sh|md|json|jsonl|csv|ipynb|png)$")
MD_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@functools.lru_cache(maxsize=None)
def _tree(path: pathlib.Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _defined(body, name: str):
    """The node defining `name` at this level of `body` (def, class, assignment or import), else None."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return node
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return node
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if any((a.asname or a.name.split(".")[0]) == name for a in node.names):
                return node
        if isinstance(node, ast.ClassDef) is False and isinstance(node, (ast.If, ast.Try)):
            inner = _defined(node.body, name)
            if inner is not None:
                return inner
    return None


def _resolve_in_file(path: pathlib.Path, dotted: str) -> bool:
    """True when `dotted` (`func`, `Class`, `Class.method`, `CONSTANT`) is defined in `path`."""
    body = _tree(path).body
    node = None
    for part in dotted.split("."):
        node = _defined(body, part)
        if node is None:
            return False
        body = node.body if isinstance(node, ast.ClassDef) else []
    return True


def _module_file(parts):
    """The source file of module `parts` (e.g. ['jaxrl', 'rl', 'losses']), or None."""
    base = ROOT.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _resolve_dotted(ref: str) -> bool:
    """`jaxrl.a.b` is a module, or the longest module prefix defines the rest."""
    parts = ref.split(".")
    for cut in range(len(parts), 0, -1):
        path = _module_file(parts[:cut])
        if path is not None:
            rest = ".".join(parts[cut:])
            return not rest or _resolve_in_file(path, rest)
    return False


def _refs(path, pattern):
    return sorted(set(pattern.findall(path.read_text())))


README = ROOT / "README.md"
README_MAX_BYTES = 8192
# The two set-up commands of the front page, byte for byte: .ci/run follows the second ("exactly the README's
# test command"), and users copy the first.
README_COMMANDS = (
    "python3 -m venv .venv && . .venv/bin/activate && pip install -e . && python -m jaxrl.main --config=configs/rloo.py",
    "apt-get install -y bubblewrap tmux buildah podman mmdebstrap\n"
    "python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[dev]' && python -m pytest -q",
)


def test_architecture_exists_and_readme_points_to_it():
    readme = README.read_text()
    assert "docs/architecture.md" in readme
    for n in range(1, 9):  # code docstrings cite "docs/architecture.md §N"
        assert re.search(rf"^## {n}\. ", ARCH.read_text(), re.M), f"section §{n} is missing"


@pytest.mark.parametrize("doc", CHECKED_DOCS, ids=lambda p: p.name)
def test_file_and_function_references_exist(doc):
    refs = _refs(doc, FILE_REF)
    assert refs
    missing = []
    for file, name in refs:
        path = ROOT / file
        if not path.is_file():
            missing.append(f"{file} (no such file)")
        elif name and (path.suffix != ".py" or not _resolve_in_file(path, name)):
            missing.append(f"{file}:{name}")
    assert not missing, f"{doc.name} names code that does not exist: {missing}"


@pytest.mark.parametrize("doc", CHECKED_DOCS, ids=lambda p: p.name)
def test_dotted_references_exist(doc):
    missing = [ref for ref in _refs(doc, DOTTED_REF) if not _resolve_dotted(ref)]
    assert not missing, f"{doc.name} names modules or attributes that do not exist: {missing}"


@pytest.mark.parametrize("doc", CHECKED_DOCS, ids=lambda p: p.name)
def test_config_keys_exist(doc):
    keys = set(config_lib.flatten(config_lib.base_config()))
    prefixes = {k.rsplit(".", i)[0] for k in keys for i in range(1, k.count(".") + 1)}
    refs = [ref for ref in _refs(doc, CONFIG_REF) if not FILE_SUFFIX.search(ref)]  # `trainer.py` is a file
    missing = [ref for ref in refs if ref not in keys and ref not in prefixes]
    assert not missing, f"{doc.name} names config keys that do not exist: {missing}"


@pytest.mark.parametrize("doc", CHECKED_DOCS, ids=lambda p: p.name)
def test_links_resolve(doc):
    missing = [link for link in MD_LINK.findall(doc.read_text())
               if not link.startswith("http") and not (doc.parent / link).exists()]
    assert not missing, f"{doc.name} links to missing files: {missing}"


def _relative_links(doc: pathlib.Path):
    return [link for link in MD_LINK.findall(doc.read_text()) if not re.match(r"^[a-z]+:", link)]


def test_readme_is_a_front_page():
    """README.md stays a front page (at most 8 KiB); the manual lives in docs/."""
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes (at most {README_MAX_BYTES}): move detail to docs/"


def test_readme_links_resolve():
    links = _relative_links(README)
    assert links, "README.md links to no document"
    missing = [link for link in links if not (README.parent / link).exists()]
    assert not missing, f"README.md links to missing files: {missing}"


def test_readme_links_every_docs_page():
    linked = {pathlib.Path(link).resolve() for link in _relative_links(README)}
    unlinked = sorted(p.name for p in DOCS.glob("*.md") if p.resolve() not in linked)
    assert not unlinked, f"README.md does not link to docs/{unlinked}"


def test_readme_keeps_the_setup_commands():
    readme = README.read_text()
    for command in README_COMMANDS:
        assert f"```bash\n{command}\n```" in readme, f"README.md lacks the set-up command block: {command!r}"


@pytest.mark.parametrize("doc", sorted(DOCS.glob("*.md")), ids=lambda p: p.name)
def test_every_docs_page_links_resolve(doc):
    """Relative links of every docs/ page resolve, and none leaves the repository."""
    links = _relative_links(doc)
    missing = [link for link in links if not (doc.parent / link).exists()]
    outside = [link for link in links if ROOT.resolve() not in (doc.parent / link).resolve().parents
               and (doc.parent / link).resolve() != ROOT.resolve()]
    assert not missing, f"{doc.name} links to missing files: {missing}"
    assert not outside and "../shared" not in doc.read_text(), f"{doc.name} links outside the repository: {outside}"


def test_resolver_rejects_what_does_not_exist():
    """The checks above can fail: a misspelt function, method, module or key is caught."""
    assert _resolve_in_file(ROOT / "jaxrl/train/trainer.py", "Trainer._rl_step")
    assert not _resolve_in_file(ROOT / "jaxrl/train/trainer.py", "Trainer._rl_stepp")
    assert not _resolve_in_file(ROOT / "jaxrl/train/trainer.py", "_rl_step")  # a method, not a function
    assert _resolve_dotted("jaxrl.envs.harbor.load_task_set")  # re-exported by the package
    assert not _resolve_dotted("jaxrl.envs.harbor.load_task_sets")
    assert not _resolve_dotted("jaxrl.nonexistent")
    text = "`jaxrl/rl/losses.py:micro_batch_loss` `jaxrl/rl/nope.py:f` `trainer.algorithm.eps_clip_low=0.2`"
    assert FILE_REF.findall(text) == [("jaxrl/rl/losses.py", "micro_batch_loss"), ("jaxrl/rl/nope.py", "f")]
    assert CONFIG_REF.findall(text) == ["trainer.algorithm.eps_clip_low"]



def _section(text: str, heading: str) -> str:
    """The body of the `## heading` section of a markdown text (up to the next `## `), or ''."""
    m = re.search(rf"^## {re.escape(heading)}\s*$(.*?)(?=^## |\Z)", text, re.M | re.S)
    return m.group(1) if m else ""


def _table_rows(section: str):
    """(first cell, whole row) of every markdown table row of `section`, header and rulers excluded."""
    rows = [line for line in section.splitlines() if line.startswith("|") and not re.match(r"^\|[-| ]+\|$", line)]
    return [(row.split("|")[1].strip(), row) for row in rows[1:]] if rows else []


def test_recipes_doc_covers_every_shipped_recipe_and_scale():
    text = RECIPES.read_text()
    table = _section(text, "Shipped recipes")
    listed = {re.sub(r"`(configs/[\w]+\.py)`.*", r"\1", cell) for cell, _ in _table_rows(table)}
    shipped = {f"configs/{p.name}" for p in (ROOT / "configs").glob("*.py") if not p.name.startswith("_")}
    assert shipped <= listed, f"docs/recipes.md 'Shipped recipes' lacks {sorted(shipped - listed)}"
    for scale in config_lib.SCALES:
        if scale and scale != "cpu":
            assert f":{scale}" in text, f"docs/recipes.md does not describe the scale :{scale}"


# The seed ablations, built on configs/rloo.py: their row must state every value they change.
SEED_ABLATIONS = ("configs/seqmean.py", "configs/symclip.py", "configs/grpo.py")


@pytest.mark.parametrize("recipe", SEED_ABLATIONS)
def test_recipes_doc_states_what_each_ablation_changes(recipe):
    base = config_lib.flatten(config_lib.load_recipe("configs/rloo.py"))
    ours = config_lib.flatten(config_lib.load_recipe(recipe))
    changed = {k: v for k, v in ours.items() if base.get(k) != v and k != "name"}
    assert changed, recipe
    row = dict(_table_rows(_section(RECIPES.read_text(), "Shipped recipes")))
    row = next(r for cell, r in row.items() if f"`{recipe}`" in cell)
    missing = {k: v for k, v in changed.items() if str(v).lower() not in row.lower()}
    assert not missing, f"docs/recipes.md's row of {recipe} does not state {missing}"


def test_recipes_doc_lists_every_algorithm_key():
    """Every `trainer.algorithm.*` key has a row in the key table (first cell: the key below
    `trainer.algorithm.`, or a full dotted path), and every row names a key that exists."""
    keys = set(config_lib.flatten(config_lib.base_config()))
    documented = set()
    for cell, _ in _table_rows(_section(RECIPES.read_text(), "trainer.algorithm keys")):
        for key in re.findall(r"`([\w.]+)`", cell):
            documented.add(key if key.startswith(CONFIG_SECTIONS) else f"trainer.algorithm.{key}")
    algorithm = {k for k in keys if k.startswith("trainer.algorithm.")}
    assert not algorithm - documented, f"docs/recipes.md lacks rows for {sorted(algorithm - documented)}"
    assert not documented - keys, f"docs/recipes.md documents keys that do not exist: {sorted(documented - keys)}"


# SkyRL 0.3.0's defaults (PyPI `skyrl` 0.3.0, skyrl/train/config/config.py: AlgorithmConfig and its
# sub-configs, the critic's OptimizerConfig(lr=5e-6)) of every key docs/recipes.md attributes to SkyRL.
# None there means "off" where jaxrl writes '' or 0 for off (docs/recipes.md "trainer.algorithm keys").
SKYRL_0_3_0_DEFAULTS = {
    "advantage_estimator": "grpo", "grpo_norm_by_std": True, "gamma": 1.0, "lambd": 1.0, "value_clip": 0.2,
    "policy_loss_type": "regular", "loss_reduction": "token_mean", "max_seq_len": None, "eps_clip_low": 0.2,
    "eps_clip_high": 0.2, "clip_ratio_c": 3.0, "cispo.cispo_eps_clip_low": 0.0, "cispo.cispo_eps_clip_high": 5.0,
    "sapo.tau_pos": 1.0, "sapo.tau_neg": 1.05, "clip_cov.clip_ratio": 0.0002, "clip_cov.clip_cov_lb": 1.0,
    "clip_cov.clip_cov_ub": 5.0, "kl_cov.kl_cov_frac": 0.2, "kl_cov.ppo_kl_coef": 1.0, "temperature": "None",
    "use_kl_loss": True, "kl_loss_coef": 0.001, "kl_estimator_type": "k3", "use_kl_in_reward": False,
    "kl_ctrl.type": "fixed", "kl_ctrl.kl_target": 0.1, "kl_ctrl.horizon": 10000, "entropy_loss_coef": 0.01,
    "off_policy_correction.tis_ratio_type": None, "off_policy_correction.token_tis_ratio_clip_high": 2.0,
    "off_policy_correction.sequence_tis_ratio_clip_high": 5.0,
    "off_policy_correction.outlier_token_is_threshold_low": None,
    "off_policy_correction.outlier_token_is_threshold_high": None,
    "off_policy_correction.token_mask_is_threshold_low": None,
    "off_policy_correction.token_mask_is_threshold_high": None,
    "off_policy_correction.sequence_mask_metric": None, "off_policy_correction.geo_mask_low": 0.99,
    "off_policy_correction.geo_mask_high": 1.01, "off_policy_correction.product_mask_low": 0.5,
    "off_policy_correction.product_mask_high": 2.0, "trainer.critic.optimizer.lr": 5e-6,
    "trainer.critic.optimizer.weight_decay": 0.01, "trainer.critic.optimizer.max_grad_norm": 1.0,
}


def test_recipes_doc_says_where_a_default_differs_from_skyrl():
    """Issue 25 §3: a key whose row cites SkyRL and whose jaxrl default differs from SkyRL's says so
    ("SkyRL default <value>") with its reason; keys equal to SkyRL's need not."""
    flat = config_lib.flatten(config_lib.base_config())
    cited, undeclared = set(), []
    for cell, row in _table_rows(_section(RECIPES.read_text(), "trainer.algorithm keys")):
        keys = re.findall(r"`([\w.]+)`", cell)
        if not keys or "SkyRL" not in row.split("|")[-2]:
            continue
        key = keys[0]
        full = key if key.startswith(CONFIG_SECTIONS) else f"trainer.algorithm.{key}"
        if key not in SKYRL_0_3_0_DEFAULTS or full not in flat:
            continue
        cited.add(key)
        ours, theirs = flat[full], SKYRL_0_3_0_DEFAULTS[key]
        same = ours == theirs or (theirs is None and ours in ("", 0, 0.0))
        if not same and f"SkyRL default {theirs}" not in row:
            undeclared.append(f"{key}: jaxrl {ours!r}, SkyRL {theirs!r}")
    assert {"cispo.cispo_eps_clip_low", "eps_clip_high", "trainer.critic.optimizer.weight_decay"} <= cited
    assert not undeclared, "docs/recipes.md rows that do not state SkyRL's different default: " + "; ".join(undeclared)


# Every leaf key of the seed run's hpc/skyrl_yaml/jupiter/56GPU_qwen3_8b.yaml (OpenThoughts-Agent,
# commit 974ebb3a), as dotted YAML paths: the keys only, listed here so that the check runs offline.
SEED_YAML_KEYS = """
entrypoint config_groups.terminal_bench_config terminal_bench.trials_dir
terminal_bench.harbor.name terminal_bench.harbor.max_episodes terminal_bench.harbor.enable_summarize
terminal_bench.harbor.store_all_messages terminal_bench.harbor.trajectory_config.raw_content
terminal_bench.harbor.enable_episode_logging terminal_bench.harbor.record_terminal_session
terminal_bench.harbor.enable_pane_logging terminal_bench.harbor.strict_json_parser
terminal_bench.harbor.interleaved_thinking terminal_bench.harbor.extra_body.chat_template_kwargs.enable_thinking
terminal_bench.harbor.override_timeout_sec terminal_bench.harbor.override_cpus terminal_bench.harbor.override_memory_mb
terminal_bench.harbor.override_storage_mb terminal_bench.harbor.auto_snapshot
terminal_bench.harbor.verifier_override_timeout_sec terminal_bench.harbor.max_retries terminal_bench.harbor.min_wait_sec
terminal_bench.harbor.max_wait_sec terminal_bench.harbor.wait_multiplier terminal_bench.harbor.exclude_exceptions
terminal_bench.harbor.n_concurrent_trials terminal_bench.harbor.log_level terminal_bench.harbor.enable_reward_shaping
terminal_bench.harbor.collect_rollout_details terminal_bench.harbor.enable_error_classification
terminal_bench.harbor.mask_exceptions terminal_bench.harbor.default_error_treatment
terminal_bench.harbor.passthrough_exceptions terminal_bench.harbor.zero_exceptions
terminal_bench.model_info.max_input_tokens terminal_bench.model_info.max_output_tokens terminal_bench.archiving.enabled
terminal_bench.trace_upload.enabled terminal_bench.trace_upload.repo_org terminal_bench.trace_upload.episodes
terminal_bench.trace_upload.dataset_type terminal_bench.trace_upload.cleanup
trainer.strategy trainer.algorithm.advantage_estimator trainer.algorithm.use_kl_loss trainer.algorithm.kl_loss_coef
trainer.algorithm.eps_clip_low trainer.algorithm.eps_clip_high trainer.algorithm.loss_reduction trainer.algorithm.use_tis
trainer.algorithm.tis_imp_ratio_cap trainer.epochs trainer.max_steps trainer.update_epochs_per_batch
trainer.train_batch_size trainer.policy_mini_batch_size trainer.eval_batch_size trainer.micro_forward_batch_size_per_gpu
trainer.micro_train_batch_size_per_gpu trainer.max_prompt_length trainer.eval_interval trainer.eval_before_train
trainer.ckpt_interval trainer.resume_mode trainer.hf_save_interval trainer.hf_hub_repo_id trainer.hf_hub_private
trainer.hf_hub_revision trainer.enable_db_registration trainer.project_name trainer.log_level
trainer.tracker_commit_each_step trainer.logger trainer.run_name trainer.ckpt_path trainer.export_path
trainer.policy.optimizer_config.lr trainer.policy.optimizer_config.weight_decay trainer.policy.optimizer_config.adam_betas
trainer.policy.optimizer_config.max_grad_norm trainer.policy.fsdp_config.cpu_offload
trainer.policy.fsdp_config.reshard_after_forward trainer.policy.fsdp_config.fsdp_size trainer.ref.fsdp_config.cpu_offload
trainer.ref.fsdp_config.reshard_after_forward trainer.ref.fsdp_config.fsdp_size trainer.placement.colocate_all
trainer.placement.policy_num_nodes trainer.placement.ref_num_nodes trainer.placement.policy_num_gpus_per_node
trainer.placement.ref_num_gpus_per_node trainer.fully_async.max_staleness_steps
trainer.fully_async.num_parallel_generation_workers generator.backend generator.timeout_multiplier generator.model_dtype
generator.inference_engine_tensor_parallel_size generator.num_inference_engines generator.n_samples_per_prompt
generator.eval_n_samples_per_prompt generator.gpu_memory_utilization generator.max_num_seqs
generator.max_num_batched_tokens generator.enable_prefix_caching generator.enable_chunked_prefill
generator.run_engines_locally generator.weight_sync_backend generator.async_engine generator.batched
generator.enable_http_endpoint generator.enable_ray_prometheus_stats generator.vllm_stats_interval
generator.append_eos_token_after_stop_str_in_multi_turn generator.max_turns generator.sampling_params.max_generate_length
generator.sampling_params.temperature generator.sampling_params.top_p generator.sampling_params.top_k
generator.engine_init_kwargs.max_model_len generator.engine_init_kwargs.custom_chat_template_chat_completion_path
data.train_data data.val_data
""".split()


def test_seed_recipe_table_has_every_seed_key():
    # docs/recipes.md "The seed run key by key": each seed key's last name appears in the first
    # column of a row that also gives a jaxrl key or a reason (a non-empty third or fourth cell)
    rows = [r for r in _section(RECIPES.read_text(), "The seed run key by key").splitlines() if r.startswith("| ")]
    cells = [[c.strip() for c in r.strip("|").split(" | ")] for r in rows[1:]]  # after the header
    missing = []
    for key in SEED_YAML_KEYS:
        leaf = key.split(".")[-1]
        ok = any(re.search(r"(?<![\w])" + re.escape(leaf) + r"(?![\w])", c[0]) and (c[2] or c[3]) for c in cells)
        if not ok:
            missing.append(key)
    assert not missing, f"docs/recipes.md's seed table lacks {missing}"
