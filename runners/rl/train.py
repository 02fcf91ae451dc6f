"""One RL run of a recipe on TRL, with validation mean@16 against compute.

``train(recipe, run_dir)`` builds (or loads) the model, the data and the
``ScaleRLTrainer``, evaluates mean@16 on held-out prompts at step 0 and every
``eval.every`` optimizer steps, and records each evaluation with the compute spent so
far. A killed run resumes from its newest complete and readable checkpoint (one whose
``prl_state.json``, written last, is there, whose weight and state files are whole, and whose
files still have the sha256 that ``prl_state.json`` recorded at the save), saying which one and
why newer ones were skipped; evaluations already recorded are not recorded twice. A run that
has history but no such checkpoint is never restarted from step 0 into that history:
``ResumeError`` says so (``runners.tracking.run.tracked_train`` then starts it over as a new
MLflow run). The folder belongs to one run (``runners.runfolder``): another run's folder is
refused, and a finished run (``done.json``, or its last step checkpointed) trains no further step.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
import zipfile
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset, disable_progress_bars
from transformers import PrinterCallback, TrainerCallback, set_seed
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOConfig
from trl.rewards import get_soft_overlong_punishment

from runners.contract import BEST_MEAN_AT_16, DONE_FILE, MEAN_AT_16, PASS_AT_16, STOP_FILE
from runners.recipe import Recipe, RecipeError
from runners.rl.memory import check_fits, estimate, largest_part
from runners.rl.plan import peft_config, trl_args
from runners.rl.profiling import PhaseProfiler
from runners.rl.sharding import Layout, full_parameters, is_sharded, save_full_model
from runners.rl.trainer import ScaleRLTrainer
from runners.runfolder import RunFolderError, append_json_line, check_run_folder_writable, claim, disk_full, finished
from runners.task.basemodel import ensure_base_model, load_model_and_tokenizer, use_one_gpu
from runners.task.data import load_rows
from runners.task.evaluation import evaluate
from runners.task.rewards import CONFIGURED, reward_function

STATE_FILE = "prl_state.json"
CHECKSUMS = "sha256"  # in STATE_FILE: each other file of the checkpoint's sha256, taken at its save
MetricsSink = Callable[[dict[str, float], int], None]


class ResumeError(RunFolderError):
    """A run has history but nothing whole to resume from: restarting would splice two runs."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"{reason}. To start it over, delete the run folder or move it aside")


def _file_problem(path: Path) -> str | None:
    """Why a checkpoint file is not whole (None when it is): a safetensors file shorter than its
    header says, or a torch.save zip without its central directory (written last)."""
    try:
        if path.suffix == ".safetensors":
            with path.open("rb") as f:
                n = int.from_bytes(f.read(8), "little")
                header = json.loads(f.read(n))
            end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
            size = path.stat().st_size
            return None if size >= 8 + n + end else f"{path.name} truncated ({size} of {8 + n + end} bytes)"
        if path.suffix in (".pt", ".pth", ".bin"):
            return None if zipfile.is_zipfile(path) else f"{path.name} truncated (not a whole torch file)"
        if path.suffix == ".json":
            json.loads(path.read_text())
    except (OSError, ValueError, KeyError, TypeError):
        return f"{path.name} unreadable"
    return None


def checksums(ckpt: Path) -> dict[str, str]:
    """The sha256 of each file of a checkpoint but its ``STATE_FILE``, by path relative to it."""
    files = sorted(f for f in ckpt.rglob("*") if f.is_file() and not f.name.startswith(STATE_FILE))
    out = {}
    for f in files:
        with f.open("rb") as fh:
            out[f.relative_to(ckpt).as_posix()] = hashlib.file_digest(fh, "sha256").hexdigest()
    return out


def _changed(ckpt: Path) -> str | None:
    """Which file of a checkpoint differs from its save (None when none does, or when the
    checkpoint was written before checksums were recorded)."""
    state = json.loads((ckpt / STATE_FILE).read_text())
    if not isinstance(state, dict):
        return f"{STATE_FILE} unreadable (not a JSON object)"
    recorded = state.get(CHECKSUMS)
    if not recorded:
        return None
    now = checksums(ckpt)
    for name, digest in sorted(recorded.items()):
        if name not in now:
            return f"{name} missing (it was saved with the checkpoint)"
        if now[name] != digest:
            return f"{name} corrupted (its sha256 differs from the one recorded at its save)"
    return None


def last_complete_checkpoint(ckpt_dir: Path) -> tuple[Path | None, list[str]]:
    """The newest checkpoint that is complete, readable and unchanged since its save, and why each
    newer one was skipped."""
    found = sorted(
        (p for p in ckpt_dir.glob(f"{PREFIX_CHECKPOINT_DIR}-*") if p.name.split("-")[-1].isdigit()),
        key=lambda p: int(p.name.split("-")[-1]),
        reverse=True,
    )
    skipped = []
    for ckpt in found:
        problem = None if (ckpt / STATE_FILE).is_file() else f"no {STATE_FILE} (its save was interrupted)"
        for f in sorted(ckpt.iterdir()):
            problem = problem or _file_problem(f)
        problem = problem or _changed(ckpt)
        if problem is None:
            return ckpt, skipped
        skipped.append(f"{ckpt.name}: {problem}")
    return None, skipped


def _what_a_rerun_does(ckpt_dir: Path) -> str:
    """Where a re-run of a run that stopped now starts (for the disk-full message)."""
    last, _ = last_complete_checkpoint(ckpt_dir) if ckpt_dir.is_dir() else (None, [])
    if last is None:
        return "no checkpoint is complete yet, so the run starts over (untracked: delete its folder first)"
    return f"it resumes from {last.name} (a checkpoint cut short is skipped)"


def reward_setup(recipe: Recipe) -> tuple[list, list[float]]:
    """TRL's ``reward_funcs`` and ``reward_weights``; the first function is validation's pass criterion."""
    sections = {name: getattr(recipe.data, name) for name in CONFIGURED}  # rewards configured by data.<name>
    funcs = [
        reward_function(name, asdict(sections[name]) if sections.get(name) is not None else None)
        for name in recipe.data.reward
    ]
    weights = list(recipe.data.reward.values())
    if recipe.length.control == "penalty":
        funcs.append(get_soft_overlong_punishment(recipe.length.max_tokens, recipe.length.penalty_cache))
        weights.append(1.0)
    return funcs, weights


class Progress(TrainerCallback):
    """Validation mean@16 at step 0 and every ``eval.every`` steps, logged with compute so far.

    Compute excludes evaluation time: ``compute/gpu_hours`` is training wall time x devices
    (device-hours; on CPU, process-hours; packed runs slow each other, so prefer the next two
    for comparing packed runs), ``compute/samples`` counts completions generated,
    ``compute/tokens`` their prompt + completion tokens (filtered or not: generation was spent),
    ``compute/flops`` estimates (2 + 6 x epochs) x params x tokens.
    """

    def __init__(
        self, recipe: Recipe, val_rows: list[dict], run_dir: Path, sinks: list[MetricsSink], log, score=None
    ) -> None:
        self.recipe, self.val, self.run_dir, self.sinks, self.log = recipe, val_rows, run_dir, sinks, log
        self.score = score or next(iter(recipe.data.reward))  # validation's pass criterion: the first reward
        self.metrics_path = run_dir / "metrics.jsonl"
        self.logged_steps = _logged_steps(self.metrics_path)
        self.train_seconds = 0.0
        self.eval_seconds = 0.0
        self.best = -1.0
        self._tick = None
        self.trainer: ScaleRLTrainer | None = None
        self.eval_profiler = PhaseProfiler()
        self.n_params = 0
        self.stopped_at: int | None = None

    # this callback's state that must survive a resume (the trainer keeps its own: ScaleRLTrainer.state_dict)
    def state_dict(self) -> dict[str, Any]:
        return {"train_seconds": self.train_seconds, "eval_seconds": self.eval_seconds, "best": self.best}

    def load_state_dict(self, s: dict[str, Any]) -> None:
        self.train_seconds, self.eval_seconds, self.best = s["train_seconds"], s["eval_seconds"], s["best"]

    def compute(self) -> dict[str, float]:
        devices = max(1, self.trainer.accelerator.num_processes)
        epochs = self.recipe.batch.epochs
        tokens = float(self.trainer.compute_tokens)
        return {
            "compute/gpu_hours": self.train_seconds * devices / 3600.0,
            "compute/tokens": tokens,
            "compute/samples": float(self.trainer.compute_samples),
            "compute/flops": (2.0 + 6.0 * epochs) * self.n_params * tokens,
            "compute/train_seconds": self.train_seconds,
        }

    def _evaluate(self, step: int) -> None:
        if step in self.logged_steps:
            return
        t0 = time.perf_counter()
        e = self.recipe.eval
        self.eval_profiler.begin("evaluation")
        with full_parameters(self.trainer) as whole:  # under FSDP: gathered, as TRL generates
            m = evaluate(
                whole,
                self.trainer.processing_class,
                self.val,
                samples=e.samples,
                max_new_tokens=self.recipe.max_completion_tokens,
                batch_prompts=e.batch_prompts,
                temperature=self.recipe.train.temperature,
                reward=self.score,
                seed=step,
                accelerator=self.trainer.accelerator,
                sharded=is_sharded(self.trainer.accelerator),
                cache_implementation=self.trainer.args.cache_implementation,  # what TRL generates with
            )
        self.eval_profiler.end("evaluation")
        self.eval_seconds += time.perf_counter() - t0
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # evaluation's KV cache is the run's peak; give it back to packed neighbours
        if self.trainer.accelerator.is_main_process:
            append_json_line(self.run_dir / "samples.jsonl", {"step": step, "samples": m.pop("samples")})
        record = {
            MEAN_AT_16: m["mean_at_k"],
            PASS_AT_16: m["pass_at_k"],
            "val/format_error_rate": m["format_error_rate"],
            "val/seconds": m["seconds"],
            "val/prompts": float(m["prompts"]),
            "val/sequences_per_second": m["sequences"] / max(m["seconds"], 1e-9),
            **self.compute(),
            "time/eval_seconds_total": self.eval_seconds,
            **{k: v for k, v in self.eval_profiler.pop().items() if k.startswith("memory/evaluation")},
        }
        if self.trainer.accelerator.is_main_process:
            append_json_line(self.metrics_path, {"step": step, **record})
            for sink in self.sinks:
                sink(record, step)
        if m["mean_at_k"] > self.best:  # the same on every process (the sums were reduced)
            self.best = m["mean_at_k"]
            best = json.dumps({"step": step, MEAN_AT_16: self.best}) + "\n"
            save_full_model(self.trainer, self.run_dir / "best", extra={"best.json": best})  # every process
        self.logged_steps.add(step)
        self.log(
            f"[{self.recipe.name}] step {step:>5}/{self.recipe.train.steps}  mean@16 {m['mean_at_k']:.3f}  "
            f"pass@16 {m['pass_at_k']:.3f}  format-err {m['format_error_rate']:.3f}  "
            f"train {self.train_seconds:.0f}s  eval {m['seconds']:.1f}s"
        )

    def on_train_begin(self, args, state, control, model=None, **kw):
        self._tick = time.perf_counter()
        if state.global_step == 0:
            self._evaluate(0)
            self._tick = time.perf_counter()

    def on_step_end(self, args, state, control, model=None, **kw):
        now = time.perf_counter()
        self.train_seconds += now - self._tick
        step = state.global_step
        if step % self.recipe.eval.every == 0 or step == state.max_steps:
            self._evaluate(step)
        if (self.run_dir / STOP_FILE).is_file() and step < state.max_steps:  # an adaptive campaign's decision
            self.stopped_at = step
            control.should_save = True  # end at a checkpoint: a later --resume-stopped continues from here
            control.should_training_stop = True
            why = (self.run_dir / STOP_FILE).read_text()[:300]
            self.log(f"[{self.recipe.name}] stopped at step {step} by the campaign: {why}")
        self._tick = time.perf_counter()

    def on_save(self, args, state, control, **kw):
        ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        self.trainer.accelerator.wait_for_everyone()  # every process's files are written before they are hashed
        if ckpt.is_dir() and self.trainer.accelerator.is_main_process:
            # written last, atomically: its presence marks the checkpoint complete, its checksums what it holds
            tmp = ckpt / f"{STATE_FILE}.tmp"
            saved = {**self.state_dict(), **self.trainer.state_dict(), CHECKSUMS: checksums(ckpt)}
            tmp.write_text(json.dumps(saved))
            tmp.replace(ckpt / STATE_FILE)

    def on_log(self, args, state, control, logs=None, **kw):
        if logs and self.trainer.accelerator.is_main_process:
            numbers = {k: float(v) for k, v in logs.items() if isinstance(v, (int, float))}
            train_logs = {k: v for k, v in numbers.items() if math.isfinite(v)}
            bad = sorted(set(numbers) - set(train_logs))  # MLflow cannot store NaN/inf: count them instead
            train_logs["nonfinite_values"] = float(len(bad))
            if bad:
                self.log(f"[{self.recipe.name}] step {state.global_step}: non-finite {', '.join(bad)}")
            for sink in self.sinks:
                sink({f"train/{k}": v for k, v in train_logs.items()}, state.global_step)


def metric_records(path: Path) -> list[dict]:
    """The evaluation records of a run's ``metrics.jsonl``, each with its ``step``; a line cut
    short by a crash is skipped."""
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
            record["step"] = int(record["step"])
        except (ValueError, KeyError, TypeError):
            continue  # a line cut short by a crash
        records.append(record)
    return records


def _logged_steps(path: Path) -> set[int]:
    return {r["step"] for r in metric_records(path)}


def check_quantization(recipe: Recipe) -> None:
    """QLoRA needs CUDA and bitsandbytes: refuse before anything loads."""
    if recipe.model.quantization != "4bit":
        return
    if not torch.cuda.is_available():
        raise RecipeError(
            "model.quantization = 4bit: bitsandbytes' NF4 weights need a CUDA GPU and this machine has none; "
            "remove model.quantization (LoRA alone runs on CPU) or run on a GPU"
        )
    try:
        import bitsandbytes  # noqa: F401, PLC0415
    except ImportError:
        raise RecipeError(
            "model.quantization = 4bit needs the bitsandbytes package: pip install bitsandbytes"
        ) from None


def check_lora_targets(recipe: Recipe, model: torch.nn.Module) -> None:
    """Every ``model.lora.target_modules`` name must be a linear layer of this model (one line listing them)."""
    if recipe.model.lora is None:
        return
    linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
    missing = [t for t in recipe.model.lora.target_modules if t not in linear]
    if missing:
        raise RecipeError(
            f"model.lora.target_modules: {', '.join(missing)} is not a linear layer of this model; "
            f"its linear layers are: {', '.join(linear)}"
        )


def prepare_model(recipe: Recipe, log=print):
    if recipe.model.path is not None:
        path = Path(recipe.model.path)
    else:
        path = ensure_base_model(recipe.model.size, recipe.data.task, build_seed=recipe.model.build_seed, log=log)
    # fp32 master weights always; model.dtype bfloat16 trains under bf16 autocast (GRPOConfig bf16=True).
    # Pure-bf16 weights with Adam went NaN within 10 steps on an H200 (plain TRL too).
    # QLoRA: frozen NF4 weights (double quantisation), bf16 compute; only the adapters train.
    quantization = None
    if recipe.model.quantization == "4bit":
        from transformers import BitsAndBytesConfig  # noqa: PLC0415

        quantization = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16,
        )
    model, tokenizer = load_model_and_tokenizer(
        path, torch_dtype=torch.float32, attention=recipe.model.attention, quantization=quantization
    )
    check_lora_targets(recipe, model)
    return model, tokenizer


def train(
    recipe: Recipe,
    run_dir: str | Path,
    *,
    sinks: list[MetricsSink] | None = None,
    log=print,
    extra_args: dict[str, Any] | None = None,
    callbacks: list[TrainerCallback] | None = None,
) -> dict[str, Any]:
    """Run (or resume) one recipe in its folder; returns the final evaluation and compute. A folder
    of another run is refused (``RunFolderError``); a finished one trains nothing."""
    run_dir = Path(run_dir)
    check_run_folder_writable(run_dir)
    claim(run_dir, recipe)
    done = finished(run_dir)
    if done is not None:
        log(f"[{recipe.name}] {run_dir} is finished: best mean@16 {done[BEST_MEAN_AT_16]:.3f}; nothing to train")
        return done
    (run_dir / "recipe.yaml").write_text(recipe.to_yaml())
    disable_progress_bars()
    layout = Layout.from_env()  # DDP or FSDP over WORLD_SIZE processes, as accelerate launched this one
    if torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info(int(os.environ.get("LOCAL_RANK", "0")))  # this process's GPU
        check_fits(recipe, total / 2**30, free / 2**30, log=log, layout=layout)
    check_quantization(recipe)
    set_seed(recipe.train.seed)
    trainer, progress = _trainer(recipe, run_dir, sinks or [], log, extra_args or {}, callbacks or [])
    last = _resume_point(trainer, progress, run_dir, log)
    _train_rest(trainer, last, layout, run_dir, log)
    final = {BEST_MEAN_AT_16: progress.best, **progress.compute()}
    if progress.stopped_at is not None:  # not done: the rest of the budget was not spent
        return {**final, "stopped_at_step": progress.stopped_at}
    if trainer.accelerator.is_main_process:
        tmp = run_dir / f"{DONE_FILE}.tmp"
        tmp.write_text(json.dumps(final, indent=2) + "\n")
        tmp.replace(run_dir / DONE_FILE)  # whole or absent: a finished run is never mistaken for another state
    return final


def _trainer(
    recipe: Recipe,
    run_dir: Path,
    sinks: list[MetricsSink],
    log,
    extra_args: dict[str, Any],
    callbacks: list[TrainerCallback],
) -> tuple[ScaleRLTrainer, Progress]:
    """The run's model, data and trainer (checkpoints in ``run_dir/checkpoints``), with the
    ``Progress`` callback that evaluates and records it."""
    model, tokenizer = prepare_model(recipe, log=log)
    train_rows, val_rows = load_rows(recipe.data, tokenizer, eval_prompts=recipe.eval.prompts, seed=recipe.train.seed)
    funcs, weights = reward_setup(recipe)
    args = GRPOConfig(
        output_dir=str(run_dir / "checkpoints"),
        **trl_args(recipe, world_size=int(os.environ.get("WORLD_SIZE", "1"))),
        logging_steps=1,
        save_strategy="steps",
        save_steps=recipe.train.save_every,
        save_total_limit=2,
        report_to="none",
        use_cpu=not torch.cuda.is_available(),
        disable_tqdm=True,
        dataloader_num_workers=0,
        reward_weights=weights,
        **extra_args,
    )
    use_one_gpu(args)  # one process, several visible GPUs: use one (spread a run with --gpus N instead)
    progress = Progress(recipe, val_rows, run_dir, sinks, log, score=funcs[0])
    trainer = ScaleRLTrainer(
        model=model,
        args=args,
        reward_funcs=funcs,
        train_dataset=Dataset.from_list(train_rows),
        processing_class=tokenizer,
        callbacks=[progress, *callbacks],
        recipe=recipe,
        peft_config=peft_config(recipe),
    )
    progress.trainer = trainer
    trainer.remove_callback(PrinterCallback)  # Progress prints one line per evaluation instead
    progress.n_params = sum(p.numel() for p in trainer.model.parameters())
    if recipe.model.lora is not None:
        trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
        log(f"[{recipe.name}] LoRA: {trainable:,} trainable adapter parameters of {progress.n_params:,}")
    return trainer, progress


def _resume_point(trainer: ScaleRLTrainer, progress: Progress, run_dir: Path, log) -> Path | None:
    """The last complete checkpoint, its state loaded into ``trainer`` and ``progress``; None to start
    at step 0, refused (``ResumeError``) where metrics past step 0 have no checkpoint to resume from."""
    recipe, ckpt_dir = trainer.recipe, run_dir / "checkpoints"
    last, skipped = last_complete_checkpoint(ckpt_dir) if ckpt_dir.is_dir() else (None, [])
    for why in skipped:
        log(f"[{recipe.name}] skipping {why}")
    if last is not None:
        saved = json.loads((last / STATE_FILE).read_text())
        progress.load_state_dict(saved)
        trainer.load_state_dict(saved)
        log(f"[{recipe.name}] resuming from {last}")
    elif progress.logged_steps - {0}:
        raise ResumeError(
            f"{run_dir} has metrics up to step {max(progress.logged_steps)} but no complete checkpoint to resume "
            f"from{' (' + '; '.join(skipped) + ')' if skipped else ''}; restarting from step 0 would splice a new "
            "run into its history"
        )
    return last


def _train_rest(trainer: ScaleRLTrainer, last: Path | None, layout: Layout, run_dir: Path, log) -> None:
    """Train from ``last`` (None: from the start) to the budget; running out of device memory or
    disk is one ``RecipeError`` or disk-full error saying what a re-run does."""
    recipe, ckpt_dir = trainer.recipe, run_dir / "checkpoints"
    try:
        if last is not None and int(last.name.split("-")[-1]) >= trainer.args.max_steps:
            # killed after its last checkpoint, before done.json: resuming would train a step past the budget
            log(f"[{recipe.name}] {last.name} is the run's last step: nothing left to train")
        else:
            trainer.train(resume_from_checkpoint=str(last) if last is not None else None)
    except torch.OutOfMemoryError as e:
        raise RecipeError(
            f"out of device memory ({str(e).splitlines()[0][:120]}); the estimate's largest part is "
            f"{largest_part(estimate(recipe, layout=layout))}. Finished steps are checkpointed; re-running resumes."
        ) from e
    except Exception as e:
        full = disk_full(e, run_dir, _what_a_rerun_does(ckpt_dir))
        if full is None:
            raise
        raise full from e
