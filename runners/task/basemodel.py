"""The embedded base model: a small Llama built from a config and warm-started by SFT.

No model hub is reachable, so the project makes its own "SFT checkpoint before RL":
a decoder-only Llama (untied LM head, so the FP32-head axis applies) in a few named
sizes, trained with TRL's ``SFTTrainer`` on the task's imperfect demonstrations.
The result is a standard Hugging Face directory (``AutoModelForCausalLM`` /
``AutoTokenizer``), cached under a hash of everything that determines it (its build key). A cache that
takes no file is one line before the build (``runners.runfolder.cache_problem``), not a traceback after it.

A build key names a configuration, not weights: two builds of one key on GPUs whose kernels reduce in
another order differ. So a build runs PyTorch's deterministic algorithms (``deterministic_algorithms``)
and its ``build_info.json`` records the sha256 of the weights it made (``weights_sha256``), which
every run that starts from them carries (``runners.tracking.basemodels``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from datasets import Dataset, disable_progress_bars
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM, TrainerCallback
from trl import SFTConfig, SFTTrainer

from runners.runfolder import RunFolderError, cache_problem
from runners.task import sizes
from runners.task.evaluation import evaluate
from runners.task.sizes import SIZES, base_model_path, build_key
from runners.task.tasks import ArithmeticTask
from runners.task.tokenizer import build_tokenizer
from runners.task.weights import weights_sha256


def syntax_text(node) -> str:
    """A syntax tree as text that is the same on every Python version. ``ast.dump``'s is not (3.12 adds
    an empty ``type_params`` to every def, 3.13 leaves empty fields out), nor is ``ast.unparse``'s (3.12
    quotes f-strings its own way), so here an empty field is left out everywhere."""
    import ast  # noqa: PLC0415

    if isinstance(node, list):
        return "[" + ", ".join(map(syntax_text, node)) + "]"
    if not isinstance(node, ast.AST):
        return repr(node)
    fields = ", ".join(f"{k}={syntax_text(v)}" for k, v in ast.iter_fields(node) if v is not None and v != [])
    return f"{type(node).__name__}({fields})"


def build_fingerprint() -> str:
    """Hash of the code that decides what a base-model build makes — the tokenizer and task modules,
    ``sizes.ModelSize``, ``sizes.SIZES`` and ``_build`` — ignoring comments, docstrings and formatting,
    the same on every Python version (:func:`syntax_text`)."""
    import ast  # noqa: PLC0415
    import inspect  # noqa: PLC0415
    import sys  # noqa: PLC0415

    from runners.task import tasks, tokenizer  # noqa: PLC0415

    def strip(tree: ast.AST) -> ast.AST:
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            first = body[0] if isinstance(body, list) and body else None
            if isinstance(first, ast.Expr) and isinstance(getattr(first.value, "value", None), str):
                node.body = body[1:] or [ast.Pass()]
        return tree

    def nodes(module) -> list[ast.AST]:
        return ast.parse(inspect.getsource(module)).body

    wanted = [
        n
        for n in nodes(sizes) + nodes(sys.modules[__name__])
        if (isinstance(n, (ast.ClassDef, ast.FunctionDef)) and n.name in ("ModelSize", "_build"))
        or (isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == "SIZES")
    ]
    parts = [syntax_text(strip(ast.parse(inspect.getsource(m)))) for m in (tokenizer, tasks)]
    parts += [syntax_text(strip(n)) for n in wanted]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def ensure_base_model(
    size: str = "small",
    task: ArithmeticTask | None = None,
    cache_dir: Path | None = None,
    *,
    build_seed: int | None = None,
    eval_prompts: int = 100,
    deterministic: bool = True,
    log=print,
) -> Path:
    """Return the cached base model for (size, task, build_seed), building it first if missing.
    ``deterministic``: PyTorch's deterministic algorithms during the build (``deterministic_algorithms``)."""
    if size not in SIZES:
        raise ValueError(f"model size {size!r} is not one of {', '.join(SIZES)}")
    task = task or ArithmeticTask()
    path = base_model_path(size, task, cache_dir, build_seed)
    if (path / "build_info.json").is_file():
        return path
    problem = cache_problem(size, task, cache_dir, build_seed)
    if problem is not None:  # one line before the build's compute, not a traceback after it
        raise RunFolderError(problem)
    log(f"building base model '{size}' for {task} → {path}")
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    info = _build(
        size, task, tmp, build_seed=build_seed, eval_prompts=eval_prompts, deterministic=deterministic, log=log
    )
    info["weights_sha256"] = weights_sha256(tmp)
    (tmp / "build_info.json").write_text(json.dumps(info, indent=2) + "\n")
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)  # atomic: a crash mid-build leaves no half-written cache entry
    log(
        f"base model ready: mean@16 {info['val']['mean_at_k']:.3f}, pass@16 {info['val']['pass_at_k']:.3f} "
        f"({info['parameters'] / 1e6:.2f}M parameters, {info['seconds']:.0f} s on {info['device']}; "
        f"weights {info['weights_sha256'][:12]})"
    )
    return path


def build_seed_of(task: ArithmeticTask, build_seed: int | None) -> int:
    """The random seed of a build: the task's (the one build of a size, as before build seeds), or one
    drawn from it and ``model.build_seed`` (an independent build: another initialisation and SFT order)."""
    if build_seed is None:
        return task.seed
    return int.from_bytes(hashlib.sha256(f"build-{task.seed}-{build_seed}".encode()).digest()[:4], "big")


@contextlib.contextmanager
def deterministic_algorithms(on: bool = True) -> Iterator[None]:
    """PyTorch's deterministic algorithms while the block runs (with cuBLAS's fixed workspace, which
    CUDA needs for them), restored after: the RL run that may follow a build keeps its own kernels."""
    if not on:
        yield
        return
    before = torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic
    workspace = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = workspace or ":4096:8"
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0])
        torch.backends.cudnn.deterministic = before[1]
        if workspace is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)


def _build(
    size: str,
    task: ArithmeticTask,
    out: Path,
    *,
    eval_prompts: int,
    log,
    build_seed: int | None = None,
    deterministic: bool = True,
) -> dict:
    t0 = time.perf_counter()
    spec = SIZES[size]
    seed = build_seed_of(task, build_seed)
    torch.manual_seed(seed)
    disable_progress_bars()
    tokenizer = build_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.heads,
        intermediate_size=spec.intermediate,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
    )
    model = LlamaForCausalLM(config)
    train, val = task.splits()
    rng = random.Random(f"demo-{task.seed}")
    demos = Dataset.from_list(
        [{"prompt": r["prompt"], "completion": task.demonstration(r["problem"], rng)} for r in train]
    )
    args = SFTConfig(
        output_dir=str(out / "sft"),
        max_steps=spec.sft_steps,
        per_device_train_batch_size=spec.sft_batch,
        learning_rate=spec.sft_lr,
        lr_scheduler_type="cosine",
        warmup_steps=max(1, spec.sft_steps // 20),
        weight_decay=0.0,
        logging_strategy="no",
        save_strategy="no",
        report_to="none",
        seed=seed,
        bf16=False,
        use_cpu=not torch.cuda.is_available(),
        dataloader_num_workers=4 if torch.cuda.is_available() else 0,
        disable_tqdm=True,
        gradient_checkpointing=False,  # SFTConfig turns it on; off, the build is faster and bitwise the same
    )
    use_one_gpu(args)  # one device is plenty for the warm start
    trainer = SFTTrainer(
        model=model, args=args, train_dataset=demos, processing_class=tokenizer, callbacks=[SFTProgress(log)]
    )
    t_sft = time.perf_counter()
    with deterministic_algorithms(deterministic):
        trainer.train()
    sft_seconds = time.perf_counter() - t_sft
    shutil.rmtree(out / "sft", ignore_errors=True)
    model = trainer.model
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    log(f"  SFT done; evaluating the base model on {min(eval_prompts, len(val))} prompts x 16 samples")
    metrics = evaluate(model, tokenizer, val[:eval_prompts], max_new_tokens=task.max_completion_chars())
    samples = metrics.pop("samples")
    log(f"  SFT {spec.sft_steps} steps; validation on {min(eval_prompts, len(val))} prompts: {metrics}")
    return {
        "size": size,
        "parameters": sum(p.numel() for p in model.parameters()),
        "task": task.to_dict(),
        "key": build_key(size, task, build_seed),
        "build_seed": build_seed,
        "deterministic": deterministic,
        "val": metrics,
        "samples": samples,
        "seconds": time.perf_counter() - t0,  # the build's cost: SFT, evaluation and saving
        "sft_seconds": sft_seconds,
        "sft_steps": spec.sft_steps,
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
    }


class SFTProgress(TrainerCallback):
    """Logs the warm start's progress at every tenth of its steps, or after ``every`` seconds if that
    comes first: step, share done, time so far and the time left at the pace so far (a build takes
    minutes on a CPU)."""

    def __init__(self, log, every: float = 30.0) -> None:
        self.log, self.every = log, every
        self.start = self.last = 0.0

    def on_train_begin(self, args, state, control, **kwargs) -> None:
        self.start = self.last = time.perf_counter()
        self.log(f"  SFT: {state.max_steps} steps of {args.per_device_train_batch_size} demonstrations")

    def on_step_end(self, args, state, control, **kwargs) -> None:
        now = time.perf_counter()
        done, total = state.global_step, state.max_steps
        tenth = done * 10 // total > (done - 1) * 10 // total  # crossed a tenth of the steps
        if not tenth and now - self.last < self.every:
            return
        self.last = now
        left = (now - self.start) / max(done, 1) * (total - done)
        self.log(
            f"  SFT step {done}/{total} ({done / total:.0%}), {_duration(now - self.start)} so far"
            + (f", about {_duration(left)} left" if done < total else "")
        )


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds // 60:.0f} min {seconds % 60:02.0f} s"


def use_one_gpu(args) -> None:
    """Keep a single (non-distributed) process on one GPU: with several visible, Trainer would wrap
    the model in DataParallel, which TRL's trainers refuse."""
    if args.n_gpu > 1:
        args._n_gpu = 1


def load_model_and_tokenizer(path: str | Path, *, torch_dtype=None, attention: str | None = None, quantization=None):
    """Load any local Hugging Face checkpoint with its tokenizer; clear errors for missing pieces.

    A folder of LoRA adapters (``adapter_config.json``, as a LoRA run's ``best/`` holds) loads its
    base model (``base_model_name_or_path``) with the adapters applied."""
    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"model {p}: no such directory")
    adapter = p / "adapter_config.json"
    if adapter.is_file():
        base = json.loads(adapter.read_text()).get("base_model_name_or_path")
        if not base or not Path(base).is_dir():
            raise FileNotFoundError(f"model {p}: LoRA adapters whose base model {base!r} is not a local directory")
        from peft import PeftModel  # noqa: PLC0415 - only adapter folders need peft

        model, tokenizer = load_model_and_tokenizer(base, torch_dtype=torch_dtype, attention=attention)
        if any((p / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
            tokenizer = AutoTokenizer.from_pretrained(str(p))
        return PeftModel.from_pretrained(model, str(p)), tokenizer
    if not (p / "config.json").is_file():
        raise FileNotFoundError(f"model {p}: no config.json, not a Hugging Face checkpoint")
    if not any((p / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        raise FileNotFoundError(f"model {p}: no tokenizer (tokenizer.json / tokenizer_config.json) in the checkpoint")
    tokenizer = AutoTokenizer.from_pretrained(str(p))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(
        str(p), dtype=torch_dtype, attn_implementation=attention, quantization_config=quantization
    )
    return model, tokenizer
