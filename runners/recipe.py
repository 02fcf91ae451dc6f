"""Recipes: readable YAML files turned into typed, validated config objects.

A recipe may ``inherit`` another recipe (a path, or a name in ``experiments/recipes``)
and override a few keys. Everything is checked at load time — unknown keys, wrong
types, impossible combinations, batch shapes that do not divide — with a message
that names the key, the value and the fix, before any model is loaded.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from runners.losses import LOSSES, setting_fields, unknown_setting
from runners.task.rewards import NAMES as REWARD_NAMES
from runners.task.sizes import SIZES, base_model_path
from runners.task.tasks import ArithmeticTask

RECIPES_DIR = Path(__file__).resolve().parent.parent / "experiments" / "recipes"
INTERRUPTION_PHRASE = "Okay, time is up. Let me stop thinking and formulate a final answer now. </think>"
SEED_MAX = 2**32 - 1  # numpy's seeds (transformers' set_seed) lie in [0, 2**32 - 1]
_SEGMENT = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")
NAME_RULE = "one path segment: letters, digits, '-', '_' and '.', not starting with a dot"
# A name is a folder's name and part of longer file names (a campaign's lock beside its store,
# ``mlflow.db.NAME.campaign.lock.json``; a run's folder, ``NAME-seedS-ID``), each at most 255 bytes.
NAME_MAX = 100


class RecipeError(ValueError):
    """A recipe that cannot run as written; the message says which key and how to fix it."""


def name_problem(name: Any, what: str, example: str) -> str | None:
    """Why ``name`` cannot name ``what`` ("a recipe"; it becomes a folder's name), or None."""
    if not (isinstance(name, str) and _SEGMENT.fullmatch(name)):
        return f"{what}'s name must be {NAME_RULE}, e.g. {example}"
    if len(name) > NAME_MAX:
        return (
            f"{what}'s name is {len(name)} characters long; it names folders and files (255 bytes at most, with "
            f"what is added to it): shorten it to {NAME_MAX} characters or fewer, e.g. {example}"
        )
    return None


def _run_name_problem(name: str) -> str | None:
    """A recipe's name: one path segment, or the ``CAMPAIGN/VARIANT`` a campaign gives its runs'
    recipes (``loo-cpu/baseline``, ``loo-cpu/loss=dapo``: ``runners.campaign.load.expand``)."""
    campaign, slash, variant = name.partition("/")
    key, eq, _ = variant.partition("=")
    ran = slash and _SEGMENT.fullmatch(campaign) and (variant == "baseline" or (eq and _SEGMENT.fullmatch(key)))
    return None if ran else name_problem(name, "a recipe", "my-recipe")


@dataclass
class LoraSection:
    """LoRA adapters (PEFT) in place of full fine-tuning: only the adapters train."""

    r: int = 16
    alpha: float = 32.0
    dropout: float = 0.05
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


@dataclass
class ModelConfig:
    size: str | None = "small"  # embedded base model: a name in runners.task.sizes.SIZES (tiny, small, medium, ...)
    build_seed: int | None = None  # an independent build of that size (None: the size's one build, as before)
    path: str | None = None  # or any local Hugging Face checkpoint directory
    dtype: Literal["float32", "bfloat16"] = "float32"
    attention: Literal["sdpa", "eager"] = "sdpa"  # transformers' attn_implementation
    generation_cache: Literal["dynamic", "static"] = "dynamic"  # KV cache of generate (static: compiled on CUDA)
    gradient_checkpointing: bool = True  # recompute activations in backward (TRL's default): memory for compute
    lora: LoraSection | None = None  # train LoRA adapters instead of every weight
    quantization: Literal["none", "4bit"] = "none"  # 4bit: QLoRA (bitsandbytes NF4, CUDA only; needs lora)


@dataclass
class BertScoreSection:
    """The ``bertscore`` reward's encoder: a local Hugging Face model folder (nothing is downloaded)."""

    model: str = ""
    threshold: float = 0.9  # a sample is correct when BERTScore F1 > threshold (raw F1 is high for any text)
    num_layers: int | None = None  # which hidden layer to use (None: the model's last)


@dataclass
class DataConfig:
    path: str | None = None  # JSONL with problem/answer fields; None = the embedded task
    val_path: str | None = None  # held-out JSONL; None = a disjoint split of `path`
    problem_field: str = "problem"
    answer_field: str = "answer"
    task: ArithmeticTask = field(default_factory=ArithmeticTask)  # the embedded task and its difficulty
    train_prompts: int | None = None  # RL draws from the first N training prompts (None: all); SFT uses all
    reward: dict[str, float] = field(default_factory=lambda: {"exact_match": 1.0})
    bertscore: BertScoreSection | None = None  # needed by the bertscore reward


@dataclass
class _Algorithm:
    loss: str = "cispo"  # a name in runners.losses.LOSSES: a module of runners/losses/ each
    fp32_lm_head: bool = True
    aggregation: Literal["prompt", "sample", "token"] = "prompt"
    advantage_norm: Literal["batch", "prompt", "none"] = "batch"
    advantage_baseline: Literal["group_mean", "leave_one_out"] = "group_mean"  # GRPO's, or RLOO's
    zero_variance_filter: bool = True
    sampling: Literal["no_positive_resampling", "uniform"] = "no_positive_resampling"
    npr_threshold: float = 0.9
    off_policy: Literal["pipeline", "ppo"] = "pipeline"
    off_policy_k: int = 8
    pipeline_lag: int = 0  # pipeline: train on the batch generated this many steps earlier (<= off_policy_k)


# The algorithm section: the settings above, then each loss's own (``runners.losses``: cispo_epsilon_max,
# dapo_epsilon, gspo_epsilon, sapo_temperature_pos, ...), which its module declares with their defaults.
AlgorithmConfig = dataclasses.make_dataclass(
    "AlgorithmConfig", setting_fields(), bases=(_Algorithm,), namespace={"__module__": __name__}
)


@dataclass
class LengthConfig:
    control: Literal["interruption", "penalty", "none"] = "interruption"
    max_tokens: int = 64  # L_max: completion budget for `penalty` and `none`
    think_budget: tuple[int, int] = (24, 40)  # interruption: thinking budget drawn per completion
    answer_budget: int = 16  # interruption: tokens allowed after the phrase
    interruption_phrase: str = INTERRUPTION_PHRASE
    penalty_cache: int = 16  # DAPO soft overlong punishment L_cache


@dataclass
class BatchConfig:
    prompts: int = 16  # prompts per generation step
    generations: int = 16  # completions per prompt
    micro_batch: int = 64  # most completions per forward/backward pass (sets memory); capped at the mini-batch
    epochs: int = 1  # passes over each generated batch (TRL num_iterations)


@dataclass
class OptimConfig:
    lr: float = 1.5e-4
    adam_epsilon: float = 1e-15
    weight_decay: float = 0.01
    warmup_steps: int = 5
    max_grad_norm: float = 1.0


@dataclass
class TrainConfig:
    steps: int = 150  # optimizer steps
    seed: int = 0
    temperature: float = 1.0
    save_every: int = 25  # checkpoint cadence (optimizer steps)
    mismatch_every: int = 1  # steps between measures of the generator-trainer log-prob mismatch (a no-grad forward)


@dataclass
class EvalConfig:
    every: int = 25  # optimizer steps between validation evaluations
    prompts: int = 100
    samples: int = 16
    batch_prompts: int = 32


@dataclass
class Recipe:
    name: str = "unnamed"
    description: str = ""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    length: LengthConfig = field(default_factory=LengthConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    # --- derived batch shape -------------------------------------------------
    @property
    def rollouts(self) -> int:
        return self.batch.prompts * self.batch.generations

    @property
    def updates_per_generation(self) -> int:
        return self.algorithm.off_policy_k if self.algorithm.off_policy == "ppo" else 1

    @property
    def planned_samples(self) -> int:
        """Completions the run generates in its budget (one batch of rollouts per generation)."""
        updates = self.updates_per_generation * self.batch.epochs
        return self.train.steps // updates * self.rollouts if updates else 0

    @property
    def mini_batch(self) -> int:
        return self.rollouts // self.updates_per_generation

    @property
    def micro_batch(self) -> int:
        """Completions per forward/backward: ``batch.micro_batch``, or the whole mini-batch when that is smaller."""
        return min(self.batch.micro_batch, self.mini_batch)

    @property
    def max_completion_tokens(self) -> int:
        """Longest completion generation can produce (interruptions add the phrase and answer budget)."""
        ln = self.length
        if ln.control == "interruption":
            return ln.think_budget[1] + len(ln.interruption_phrase) + ln.answer_budget
        return ln.max_tokens

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def base_model(self) -> Path | None:
        """The cache folder of the embedded build this recipe starts from (``model.size`` and
        ``model.build_seed`` for ``data.task``), or None for a ``model.path`` checkpoint."""
        m = self.model
        return None if m.size is None else base_model_path(m.size, self.data.task, None, m.build_seed)

    def flat(self) -> dict[str, Any]:
        """Dotted keys → values, e.g. {"algorithm.loss": "cispo", ...} (MLflow params)."""
        out: dict[str, Any] = {}

        def walk(prefix: str, obj: Any) -> None:
            if isinstance(obj, dict) and prefix.split(".")[-1] != "reward":
                for k, v in obj.items():
                    walk(f"{prefix}.{k}" if prefix else k, v)
            else:
                out[prefix] = obj

        walk("", self.to_dict())
        return out

    def to_yaml(self) -> str:
        return yaml.safe_dump(_plain(self.to_dict()), sort_keys=False)


def _plain(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


# --- loading -----------------------------------------------------------------


def _resolve_recipe_path(ref: str, base: Path | None) -> Path:
    candidates = [Path(ref)]
    if base is not None:
        candidates.insert(0, base.parent / ref)
    candidates += [RECIPES_DIR / ref, RECIPES_DIR / f"{ref}.yaml"]
    for c in candidates:
        if c.is_file():
            return c.resolve()
    known = ", ".join(sorted(p.stem for p in RECIPES_DIR.glob("*.yaml")))
    raise RecipeError(f"recipe {ref!r} not found (looked in {RECIPES_DIR}; known recipes: {known})")


class DuplicateKey(yaml.YAMLError):
    """A key written twice in one mapping: YAML keeps the last one silently."""

    def __init__(self, key: Any, line: int, first: int) -> None:
        super().__init__(f"key {key!r} on line {line} is given twice")
        self.key, self.line, self.first = key, line, first


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping (``DuplicateKey``), where
    PyYAML keeps the last one silently (a second ``name:`` would rename the campaign). A merge
    (``<<: *base``) still overrides what it merges, as YAML says."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                if key in seen:
                    raise DuplicateKey(key, line, seen[key])
                seen[key] = line
            except TypeError:  # an unhashable key: SafeLoader's own error names it
                continue
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: Path, what: str = "recipe") -> dict[str, Any]:
    """A YAML mapping from a file (``UniqueKeyLoader``: a key given twice is refused), or one clear
    line on what is wrong with it."""
    try:
        data = yaml.load(path.read_text(), Loader=UniqueKeyLoader)  # a SafeLoader: no arbitrary objects
    except DuplicateKey as e:
        raise RecipeError(
            f"{path}:{e.line}: the key {e.key!r} is given twice (first on line {e.first}), and YAML would keep "
            "only the last one silently: remove one of them"
        ) from None
    except yaml.YAMLError as e:
        raise RecipeError(f"{path}: not valid YAML: {' '.join(str(e).split())}") from None
    if data is None:
        raise RecipeError(f"{path}: the {what} file is empty")
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a {what} must be a mapping of keys, got {type(data).__name__}")
    return data


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and k != "reward":
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def raw_recipe(ref: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The merged mapping of a recipe file and the files it inherits from."""
    path = _resolve_recipe_path(str(ref), _seen[-1] if _seen else None)
    if path in _seen:
        raise RecipeError(f"{path}: inheritance cycle through {' → '.join(p.name for p in _seen)}")
    data = read_yaml(path)
    parent = data.pop("inherit", None)
    if parent is None:
        return data
    return _deep_merge(raw_recipe(parent, (*_seen, path)), data)


def parse_override(text: str) -> tuple[str, Any]:
    """``"algorithm.loss=dapo"`` → ("algorithm.loss", "dapo"); the value is parsed as YAML."""
    if "=" not in text:
        raise RecipeError(f"override {text!r}: expected KEY=VALUE, e.g. algorithm.loss=dapo")
    key, value = text.split("=", 1)
    try:
        return key.strip(), yaml.safe_load(value)
    except yaml.YAMLError:
        return key.strip(), value


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``data`` with dotted keys set; ``data`` itself is never modified."""
    data = copy.deepcopy(data)
    for dotted, value in overrides.items():
        node = data
        *parents, leaf = dotted.split(".")
        for p in parents:
            child = node.get(p)
            if child is None:
                child = node[p] = {}
            if not isinstance(child, dict):
                raise RecipeError(f"override {dotted}: {p!r} is a value, not a section")
            node = child
        node[leaf] = value
    return data


def load_recipe(ref: str | Path, overrides: dict[str, Any] | None = None) -> Recipe:
    """Load, inherit, override and validate a recipe."""
    data = apply_overrides(raw_recipe(ref), overrides or {})
    recipe = _build(Recipe, data, "")
    validate(recipe)
    return recipe


def recipe_from_dict(data: dict[str, Any]) -> Recipe:
    recipe = _build(Recipe, data, "")
    validate(recipe)
    return recipe


def _build(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise RecipeError(f"{where or 'recipe'}: expected a section (mapping), got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}  # a tuple's error quotes its default
    kwargs = {}
    for key, value in data.items():
        dotted = f"{where}.{key}" if where else str(key)
        if key not in names and cls is AlgorithmConfig and (why := unknown_setting(str(key))):
            raise RecipeError(f"unknown key {dotted!r}: {why}")
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise RecipeError(f"unknown key {dotted!r}{hint} Valid keys here: {', '.join(names)}")
        kwargs[key] = _coerce(hints[key], value, dotted, defaults[key])
    try:
        return cls(**kwargs)
    except ValueError as e:  # a section's own checks (e.g. ArithmeticTask.__post_init__)
        raise RecipeError(f"{where}: {e}") from None


def _coerce(tp: Any, value: Any, where: str, example: Any = None) -> Any:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, where)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _coerce(inner, value, where, example)
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            raise RecipeError(f"{where} = {value!r} is not allowed; choose one of: {', '.join(map(str, choices))}")
        return value
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            eg = list(example) if isinstance(example, tuple) else list(range(1, len(args) + 1))
            raise RecipeError(f"{where} = {value!r}: expected a list of {len(args)} numbers, e.g. {eg}")
        return tuple(_coerce(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=True)))
    if origin is list:
        if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
            raise RecipeError(f"{where} = {value!r}: expected a non-empty list of names, e.g. [q_proj, v_proj]")
        return list(value)
    if origin is dict:
        if not isinstance(value, dict):
            raise RecipeError(f"{where} = {value!r}: expected a mapping, e.g. {{exact_match: 1.0}}")
        return {str(k): _coerce(float, v, f"{where}.{k}") for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise RecipeError(f"{where} = {value!r}: expected true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise RecipeError(f"{where} = {value!r}: expected an integer")
        return value
    if tp is float:
        if isinstance(value, str):
            try:
                return float(value)  # YAML reads "3e-4" (no dot) as a string
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise RecipeError(f"{where} = {value!r}: expected a number")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise RecipeError(f"{where} = {value!r}: expected a string")
        return value
    raise RecipeError(f"{where}: unsupported type {tp}")  # pragma: no cover - schema bug


# --- validation ----------------------------------------------------------------


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise RecipeError(msg)


def validate(r: Recipe) -> None:
    """Cross-field checks, section by section; each message names the key, the value and the fix."""
    name_issue = _run_name_problem(r.name)
    _require(name_issue is None, f"name = {r.name!r}: {name_issue} (it names the run's folder)")
    for check in (_check_model, _check_data, _check_algorithm, _check_batch, _check_length, _check_schedule):
        check(r)


def _check_model(r: Recipe) -> None:
    m = r.model
    _require(
        (m.size is None) != (m.path is None),
        f"model: set exactly one of model.size (embedded: {', '.join(SIZES)}) or model.path (a local checkpoint); "
        f"got size={m.size!r}, path={m.path!r}",
    )
    _require(m.size is None or m.size in SIZES, f"model.size = {m.size!r}: choose one of {', '.join(SIZES)}")
    _require(
        m.build_seed is None or (m.size is not None and 0 <= m.build_seed <= SEED_MAX),
        f"model.build_seed = {m.build_seed!r}: a build seed picks one of an embedded size's independent builds; "
        f"use a whole number in [0, {SEED_MAX}] with model.size, or leave it out (model.path loads given weights)",
    )
    if m.lora is not None:
        lo = m.lora
        _require(lo.r >= 1, f"model.lora.r = {lo.r}: the adapter rank must be >= 1 (e.g. 16)")
        _require(lo.alpha > 0, f"model.lora.alpha = {lo.alpha}: must be > 0 (e.g. 2 x r)")
        _require(0 <= lo.dropout < 1, f"model.lora.dropout = {lo.dropout}: must be in [0, 1)")
    _require(
        m.quantization == "none" or m.lora is not None,
        "model.quantization = 4bit: quantized weights cannot be trained; add model.lora (QLoRA trains adapters)",
    )


def _check_data(r: Recipe) -> None:
    tp = r.data.train_prompts
    _require(
        tp is None or tp >= r.batch.prompts,
        f"data.train_prompts = {tp}: must be at least batch.prompts = {r.batch.prompts} (one step's prompts)",
    )
    _require(
        tp is None or r.data.path is not None or tp <= r.data.task.n_train,
        f"data.train_prompts = {tp}: the embedded task has only data.task.n_train = {r.data.task.n_train}",
    )
    _require(bool(r.data.reward), "data.reward: name at least one reward, e.g. {exact_match: 1.0}")
    for name, w in r.data.reward.items():
        _require(name in REWARD_NAMES, f"data.reward.{name}: unknown reward; choose from {', '.join(REWARD_NAMES)}")
        _require(w > 0, f"data.reward.{name} = {w}: weights must be > 0")
    if "bertscore" in r.data.reward or r.data.bertscore is not None:
        _check_bertscore(r)


def _check_bertscore(r: Recipe) -> None:
    bs = r.data.bertscore
    _require(
        "bertscore" in r.data.reward,
        "data.bertscore is set but data.reward has no bertscore: add it ({bertscore: 1.0}) or remove the section",
    )
    _require(
        bs is not None and bool(bs.model),
        "data.reward.bertscore needs a local encoder model: set data.bertscore.model to a Hugging Face model "
        "folder (e.g. a saved roberta-large); this project cannot download one",
    )
    _require(
        (Path(bs.model) / "config.json").is_file(),
        f"data.bertscore.model = {bs.model!r}: not a local Hugging Face model folder (no config.json); "
        "BERTScore cannot download a model here: save one to disk and point at it",
    )
    _require(-1 < bs.threshold < 1, f"data.bertscore.threshold = {bs.threshold}: must be in (-1, 1), e.g. 0.9")
    _require(
        bs.num_layers is None or bs.num_layers >= 1,
        f"data.bertscore.num_layers = {bs.num_layers}: a layer number >= 1, or null for the last",
    )


def _check_algorithm(r: Recipe) -> None:
    a = r.algorithm
    _require(a.loss in LOSSES, f"algorithm.loss = {a.loss!r} is not allowed; choose one of: {', '.join(LOSSES)}")
    for loss in LOSSES.values():  # every loss's settings, whichever loss runs
        for s in loss.settings:
            value = getattr(a, s.key)
            problem = s.check(value)
            shown = list(value) if isinstance(value, tuple) else value
            _require(problem is None, f"algorithm.{s.key} = {shown}: {problem}")
    _require(0 < a.npr_threshold <= 1, f"algorithm.npr_threshold = {a.npr_threshold}: must be in (0, 1]")
    _require(a.off_policy_k >= 1, f"algorithm.off_policy_k = {a.off_policy_k}: must be >= 1")
    _require(
        0 <= a.pipeline_lag <= a.off_policy_k,
        f"algorithm.pipeline_lag = {a.pipeline_lag}: must be in [0, off_policy_k = {a.off_policy_k}] "
        "(PipelineRL-k bounds staleness by k)",
    )


def _check_batch(r: Recipe) -> None:
    a, b = r.algorithm, r.batch
    _require(b.prompts >= 1, f"batch.prompts = {b.prompts}: must be >= 1")
    _require(
        b.generations >= 2,
        f"batch.generations = {b.generations}: GRPO needs >= 2 completions per prompt to form an advantage",
    )
    _require(b.micro_batch >= 1 and b.epochs >= 1, "batch.micro_batch and batch.epochs must be >= 1")
    if a.off_policy == "ppo":
        _require(
            r.rollouts % a.off_policy_k == 0,
            f"algorithm.off_policy_k = {a.off_policy_k} does not divide the {r.rollouts} rollouts per step "
            f"(batch.prompts {b.prompts} x batch.generations {b.generations}); PPO-off-policy-k splits them "
            "into k mini-batches: pick k that divides it",
        )
    _require(
        r.mini_batch % r.micro_batch == 0,
        f"batch.micro_batch = {b.micro_batch} does not divide the mini-batch of {r.mini_batch} completions per "
        f"optimizer update ({r.rollouts} rollouts / {r.updates_per_generation} update(s)); "
        f"use a divisor such as {_divisor_hint(r.mini_batch, b.micro_batch)}",
    )


def _check_length(r: Recipe) -> None:
    ln = r.length
    if ln.control == "interruption":
        lo, hi = ln.think_budget
        _require(0 < lo <= hi, f"length.think_budget = {[lo, hi]}: need 0 < low <= high")
        _require(ln.answer_budget > 0, f"length.answer_budget = {ln.answer_budget}: must be > 0")
        _require(bool(ln.interruption_phrase), "length.interruption_phrase: must not be empty")
    else:
        _require(ln.max_tokens > 0, f"length.max_tokens = {ln.max_tokens}: must be > 0")
    if ln.control == "penalty":
        _require(
            0 < ln.penalty_cache < ln.max_tokens,
            f"length.penalty_cache = {ln.penalty_cache}: must be in (0, length.max_tokens = {ln.max_tokens})",
        )


def _check_schedule(r: Recipe) -> None:
    o, t, e = r.optim, r.train, r.eval
    _require(o.lr > 0, f"optim.lr = {o.lr}: must be > 0")
    _require(t.steps >= 1, f"train.steps = {t.steps}: must be >= 1")
    _require(0 <= t.seed <= SEED_MAX, f"train.seed = {t.seed}: must be in [0, {SEED_MAX}] (numpy's range), e.g. 0")
    _require(t.temperature > 0, f"train.temperature = {t.temperature}: must be > 0")
    _require(t.save_every >= 1, f"train.save_every = {t.save_every}: must be >= 1")
    _require(t.mismatch_every >= 1, f"train.mismatch_every = {t.mismatch_every}: must be >= 1 (1: every step)")
    _require(
        e.every >= 1 and e.prompts >= 1 and e.samples >= 1, "eval.every, eval.prompts and eval.samples must be >= 1"
    )
    _require(
        e.every <= t.steps,
        f"eval.every = {e.every} is more than train.steps = {t.steps}: the run would be evaluated at step 0 and "
        f"its end only, never every {e.every} steps; set eval.every to at most {t.steps} "
        f"(e.g. {max(1, t.steps // 5)}), or raise train.steps",
    )
    if r.data.path is None:
        _require(
            e.prompts <= r.data.task.n_val,
            f"eval.prompts = {e.prompts} exceeds data.task.n_val = {r.data.task.n_val}; "
            "raise n_val or lower eval.prompts",
        )


def _divisor_hint(n: int, near: int) -> int:
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    return min(divisors, key=lambda d: (abs(d - near), d))
