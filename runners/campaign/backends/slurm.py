"""The SLURM backend (``backend: slurm``): one job per run, submitted through submitit with the
resources of the campaign's ``slurm:`` section (``SlurmSettings``: time limit, partition, account,
qos, GPUs, CPUs, memory).

Each job runs the command the local scheduler runs (``python -m runners train``) with the run's
MLflow run id, so every way a job can end early resumes the run from its last checkpoint into
the same MLflow run:

- SLURM requeues it (preemption in REQUEUE mode, ``scontrol requeue``): the same job runs again;
- it nears its time limit: SLURM warns it with SIGUSR2 (90 s before), it ends its run and
  requeues itself through submitit (at most ``max_retries`` times);
- it ends without finishing (``scancel``, preemption in CANCEL mode, a lost node, its run killed
  by a signal): the campaign submits it again, at most ``max_retries`` times.

A Python error in a run is not retried (it would fail the same way). Job states come from
``squeue`` (no accounting database needed). Interrupting the campaign (Ctrl-C, SIGTERM) cancels
the jobs it submitted, by job id, and no other.

Each run's job files (sbatch script, submitit's pickles, the job's stdout) are in its folder
under ``slurm/``; the run's own output goes to its ``run.log`` as on the other backends. Run
folders, the Python environment and the base-model cache (``PRL_CACHE``) must be on a filesystem
the nodes share, and the tracking URI must be reachable from them.
"""

from __future__ import annotations

import difflib
import getpass
import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

import psutil

from runners.campaign.backends import Backend, Ended, Launch, note_placement, register, tail, with_gpus
from runners.campaign.spec import BackendSettings, CampaignError, RunSpec, whole_numbers
from runners.parent_death import parent_death_preexec

try:
    import submitit

    _Checkpointable: Any = submitit.helpers.Checkpointable
except ImportError:  # the registry still loads; the backend's check names the set-up that installs it
    submitit, _Checkpointable = None, object

POLL_S = 5.0  # seconds between two squeue calls, unless PRL_SLURM_POLL_S says otherwise (poll_s)
GONE_GRACE_S = 30.0  # a job absent from squeue without a result file: wait this long for a shared filesystem
# squeue states of a job that is not over (a requeued job goes back to PENDING under the same id)
LIVE = {
    "PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING",
    "SUSPENDED", "SIGNALING", "STAGE_OUT", "STOPPED", "SPECIAL_EXIT", "RESV_DEL_HOLD",
}  # fmt: skip
NOT_RETRIED = {"FAILED", "COMPLETED"}  # over without a result: the job's own script failed; retrying fails alike


@dataclass(kw_only=True)
class SlurmSettings(BackendSettings):
    """The SLURM backend's campaign keys: the ``slurm:`` section, what each run's job asks for, and
    ``max_retries``."""

    keys: ClassVar[tuple[str, ...]] = ("slurm", "max_retries")
    time: int  # minutes: the job's time limit (a run that reaches it is requeued and resumes)
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    gpus: int = 0  # per run (> 1: DDP through accelerate, as gpus_per_run does locally)
    cpus: int = 1  # per run
    mem_gb: float | None = None  # per run; None: the partition's default
    constraint: str | None = None
    setup: list[str] = field(default_factory=list)  # shell lines run before each run (module load, venv)
    sbatch: dict[str, Any] = field(default_factory=dict)  # any other sbatch option, e.g. {reservation: x}

    @classmethod
    def parse(cls, data: dict[str, Any]) -> SlurmSettings:
        retries = whole_numbers(data, ["max_retries"])
        if "slurm" not in data:
            raise CampaignError("backend slurm needs a slurm section with the jobs' time limit: slurm: {time: 240}")
        if "gpus_per_run" in data:
            raise CampaignError("on SLURM each job's GPUs are slurm.gpus; remove gpus_per_run")
        return cls(**cls._section(data["slurm"]), **retries)

    @classmethod
    def _section(cls, spec: Any) -> dict[str, Any]:
        """The ``slurm:`` section's keys, checked."""
        example = "{time: '4:00:00', partition: gpu, account: lab, gpus: 1, cpus: 8, mem_gb: 64}"
        if not isinstance(spec, dict):
            raise CampaignError(f"slurm = {spec!r}: expected a mapping, e.g. {example}")
        keys = [f.name for f in fields(cls) if f.name != "max_retries"]
        unknown = sorted(set(spec) - set(keys))
        if unknown:
            near = difflib.get_close_matches(str(unknown[0]), keys, n=1)
            hint = f"; did you mean 'slurm.{near[0]}'?" if near else f"; known keys: {', '.join(keys)}"
            raise CampaignError(f"unknown key 'slurm.{unknown[0]}' in the campaign's slurm section{hint}")
        if "time" not in spec:
            raise CampaignError(f"slurm.time missing: each job's time limit, minutes or '[D-]HH:MM:SS', e.g. {example}")
        out = dict(spec, time=_minutes(spec["time"]))
        for key in ("partition", "account", "qos", "constraint"):
            if out.get(key) is not None and (not isinstance(out[key], str) or not out[key].strip()):
                raise CampaignError(f"slurm.{key} = {out[key]!r}: expected a name, e.g. {key}: my-{key}")
        for key, low in (("gpus", 0), ("cpus", 1)):
            v = out.get(key, low)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise CampaignError(f"slurm.{key} = {v!r}: expected a whole number >= {low} per run")
        v = out.get("mem_gb")
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or v <= 0):
            raise CampaignError(f"slurm.mem_gb = {v!r}: expected the memory of each run in GB, e.g. 32")
        v = out.get("setup", [])
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise CampaignError(f"slurm.setup = {v!r}: expected a list of shell lines, e.g. ['module load cuda']")
        v = out.get("sbatch", {})
        if not isinstance(v, dict) or not all(isinstance(x, str | int | float | bool) for x in v.values()):
            raise CampaignError(f"slurm.sbatch = {v!r}: expected sbatch options as a mapping, e.g. {{exclude: node7}}")
        return out


def _minutes(v: Any) -> int:
    """A SLURM time limit as whole minutes: a number of minutes, 'HH:MM:SS' or 'D-HH[:MM[:SS]]'
    (SLURM reads 'A:B' as minutes:seconds, so that ambiguous form is refused)."""
    bad = CampaignError(f"slurm.time = {v!r}: expected minutes (e.g. 240), 'HH:MM:SS' or 'D-HH:MM:SS' ('1-12:00:00')")
    if isinstance(v, int) and not isinstance(v, bool):
        if v < 1:
            raise bad
        return v
    if not isinstance(v, str):
        raise bad
    days, dash, clock = v.strip().rpartition("-")
    parts = clock.split(":")
    if not all(x.isdigit() for x in parts) or (dash and not days.isdigit()) or len(parts) > 3:
        raise bad
    if not dash and len(parts) != 3:
        raise bad
    h, m, s = (int(x) for x in (parts + ["0", "0"])[:3])
    total = (int(days or 0) * 24 + h) * 60 + m + (1 if s else 0)
    if total < 1 or m >= 60 or s >= 60:
        raise bad
    return total


def check_slurm() -> None:
    """Refuse a SLURM campaign where it cannot be submitted, before any MLflow run or job exists."""
    if importlib.util.find_spec("submitit") is None:
        raise CampaignError(
            "backend slurm submits through submitit, which is not installed here: "
            "`make setup` (or pip install -r requirements.lock) installs the pinned submitit"
        )
    missing = [c for c in ("sbatch", "squeue", "scancel") if shutil.which(c) is None]
    if missing:
        raise CampaignError(
            f"backend slurm: {', '.join(missing)} not found on PATH; run the campaign where SLURM's "
            "client commands work (a login node of the cluster)"
        )
    poll_s()


def poll_s() -> float:
    """Seconds between two squeue calls: ``PRL_SLURM_POLL_S`` (the test suite takes 1), else ``POLL_S``."""
    raw = os.environ.get("PRL_SLURM_POLL_S", "").strip()
    try:
        value = float(raw) if raw else POLL_S
    except ValueError:
        value = 0.0
    if not 0 < value <= 600:
        raise CampaignError(f"PRL_SLURM_POLL_S = {raw!r}: expected seconds between two squeue calls (0-600), e.g. 5")
    return value


class RunJob(_Checkpointable):
    """What a job runs: the run's command, its output appended to the run's log. Warned of its
    time limit or a preemption (SIGUSR2), it ends the run and asks submitit to requeue it."""

    def __init__(self, cmd: list[str], env: dict[str, str], cwd: str, log_path: str) -> None:
        self.cmd, self.env, self.cwd, self.log_path = cmd, env, cwd, log_path
        self._proc: subprocess.Popen | None = None

    def __call__(self) -> int:
        job = submitit.JobEnvironment()
        note_placement(self.env, self.log_path, f"slurm job {job.job_id} on {socket.gethostname()}")
        with open(self.log_path, "a") as logf:
            self._proc = subprocess.Popen(
                self.cmd,
                stdout=logf,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONFAULTHANDLER": "1", **self.env},
                cwd=self.cwd,
                preexec_fn=_ignore_usr2_and_die_with_parent(),
            )
            return self._proc.wait()

    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission:
        proc = self._proc
        if proc is not None and proc.returncode is None:  # end it now: requeued, it resumes from its last checkpoint
            proc.terminate()
            try:  # not proc.wait: the wait this handler interrupted holds its lock
                psutil.Process(proc.pid).wait(timeout=30)
            except psutil.TimeoutExpired:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        return super().checkpoint(*args, **kwargs)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_proc": None}  # a process does not pickle (nor survive a requeue)


def _ignore_usr2_and_die_with_parent() -> Callable[[], None]:
    """The run's ``preexec_fn`` (libc looked up here, before the fork): SIGUSR2 ignored, as it is the
    job's warning for ``RunJob`` to act on, and SIGKILL when the job's wrapper dies."""
    die = parent_death_preexec()

    def preexec() -> None:
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
        if die is not None:
            die()

    return preexec


@dataclass
class _Job:
    """One job of the campaign: a run, or the build of a base model its runs share (``spec`` None)."""

    name: str
    spec: RunSpec | None
    cmd: list[str]
    env: dict[str, str]
    folder: Path  # the job's files: sbatch script, submitit's pickles, SLURM's stdout
    log_path: Path  # the command's output
    job: Any = None  # submitit.SlurmJob of the latest submission
    retries: int = 0
    state: str = "SUBMITTED"
    gone_since: float | None = None


@register
class SlurmBackend(Backend):
    """Every run submitted at once as a SLURM job (``_Driver``), after a job has built each base model
    the runs share; SIGTERM interrupts the campaign as Ctrl-C does, and its jobs are cancelled."""

    name = "slurm"
    settings_class = SlurmSettings

    def check(self) -> None:
        check_slurm()

    def start(self, todo: list[RunSpec], root: Path) -> None:
        self.driver = _Driver(self.camp.name, self.settings, self.log)
        self.restore = _sigterm_interrupts()
        self.jobs: dict[Path, _Job] = {}
        self.driver.build_base_models(todo, root)
        self.earlier = self.driver.queue() or {}

    def submit(self, launch: Launch) -> None:
        uri, spec = launch.env["MLFLOW_TRACKING_URI"], launch.spec
        if not self.jobs and urlsplit(uri).hostname in ("127.0.0.1", "localhost"):
            self.log(
                f"note: the jobs write to the tracking server at {uri}, which only jobs on this machine reach; "
                "on a cluster, point MLFLOW_TRACKING_URI at a server the nodes reach"
            )
        cmd = with_gpus(launch.cmd, self.settings.gpus)
        name = f"{spec.variant} seed {spec.seed}"
        j = _Job(name, spec, cmd, launch.env, launch.run_dir / "slurm", launch.run_dir / "run.log")
        self.jobs[launch.run_dir] = j
        if not self.driver.adopt(j, self.earlier):
            self.driver.submit(j)

    def placement(self, launch: Launch) -> str:
        j = self.jobs[launch.run_dir]
        return f" as SLURM job {j.job.job_id} (job files: {j.folder})"

    def poll(self) -> list[Ended]:
        return [Ended(j.spec, ok, why) for j, ok, why in self.driver.step() if j.spec is not None]

    def cancel(self) -> None:
        if hasattr(self, "driver"):
            self.driver.cancel_all()

    def close(self) -> None:
        if hasattr(self, "restore"):
            self.restore()


class _Driver:
    """The campaign's SLURM jobs: submitted, adopted from an earlier invocation, polled through
    ``squeue``, submitted again when they end early, cancelled by id."""

    def __init__(self, campaign: str, settings: SlurmSettings, log: Callable[[str], None]) -> None:
        self.campaign, self.s, self.log = campaign, settings, log
        self.live: dict[str, _Job] = {}  # job id -> job not over yet
        self.user = getpass.getuser()
        self.squeue_down = False

    def executor(self, folder: Path, name: str) -> submitit.SlurmExecutor:
        s = self.s
        ex = submitit.SlurmExecutor(folder=folder, max_num_timeout=s.max_retries)
        optional = {
            "partition": s.partition,
            "account": s.account,
            "qos": s.qos,
            "constraint": s.constraint,
            "mem": f"{int(s.mem_gb * 1024)}MB" if s.mem_gb else None,
            "gpus_per_node": s.gpus or None,
            "setup": list(s.setup) or None,
            "additional_parameters": dict(s.sbatch) or None,
        }
        ex.update_parameters(
            job_name=re.sub(r"[^\w.=-]+", "_", f"prl-{self.campaign}-{name}"),
            time=s.time,
            cpus_per_task=s.cpus,
            stderr_to_stdout=True,
            **{k: v for k, v in optional.items() if v is not None},
        )
        return ex

    def submit(self, j: _Job) -> None:
        task = RunJob(j.cmd, j.env, str(Path.cwd()), str(j.log_path))
        try:
            j.job = self.executor(j.folder, j.name).submit(task)
        except submitit.core.utils.UncompletedJobError as e:  # sbatch refused it: it would refuse every job
            raise CampaignError(f"sbatch refused the job of {j.name}: {_last_line(str(e))}") from None
        j.state, j.gone_since = "SUBMITTED", None
        self.live[j.job.job_id] = j
        if j.spec is None or j.retries:  # a run's first job is on its start line (``SlurmBackend.placement``)
            self.log(f"  submitted job {j.job.job_id}: {j.name} (job files: {j.folder})")

    def adopt(self, j: _Job, states: dict[str, tuple[str, str]]) -> bool:
        """A job that an earlier invocation of the campaign (killed, or its login shell gone) left
        queued or running for this run: wait for it if it writes where this one would, else cancel
        it (its tracking server went with its campaign) so that the run has one writer."""
        earlier = sorted({p.name.split("_")[0] for p in j.folder.glob("*_submitted.pkl")}, key=int)
        for job_id in [i for i in earlier if states.get(i, ("",))[0] in LIVE]:
            job = submitit.SlurmJob(folder=j.folder, job_id=job_id)
            try:
                uri = job.submission().function.env.get("MLFLOW_TRACKING_URI")
            except Exception:  # noqa: BLE001 - unreadable (another version's pickle): not one to wait for
                uri = None
            if uri == j.env.get("MLFLOW_TRACKING_URI"):
                j.job, j.state = job, states[job_id][0]
                self.live[job_id] = j
                self.log(f"  job {job_id} of an earlier invocation still runs {j.name}: waiting for it")
                return True
            subprocess.run(["scancel", job_id], capture_output=True, timeout=60)
            self.log(f"  cancelled job {job_id} of an earlier invocation for {j.name}: its tracking server is gone")
            deadline = time.time() + 120
            while time.time() < deadline and ((self.queue() or {}).get(job_id) or ("",))[0] in LIVE:
                time.sleep(poll_s())  # its run ends before the new job's run starts
        return False

    def build_base_models(self, todo: list[RunSpec], root: Path) -> None:
        """Each distinct embedded base model missing from the cache is built once, by a job, before
        the runs that share it are submitted (runs that each found it missing would all build it)."""
        users: dict[Path, RunSpec] = {}
        for spec in todo:
            if (base := spec.recipe.base_model()) is not None:
                users.setdefault(base, spec)
        builds = []
        for path, spec in users.items():
            if (path / "build_info.json").is_file():
                continue
            folder = (root / f"base-{path.name}").resolve()
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "recipe.yaml").write_text(spec.recipe.to_yaml())
            cmd = [sys.executable, "-m", "runners", "base-model", str(folder / "recipe.yaml")]
            builds.append(_Job(f"base model {path.name}", None, cmd, {}, folder, folder / "build.log"))
            self.submit(builds[-1])
        if builds:
            failed = self.wait(len(builds))
            if failed:  # every run that needs it would fail the same way: say why once
                raise CampaignError(f"building {failed[0][0].name} failed: {_last_line(failed[0][1])}")

    def wait(self, total: int) -> list[tuple[_Job, str]]:
        """Until every submitted job is over (retries included); returns the failed ones and why."""
        failures, done, t0 = [], 0, time.perf_counter()
        while self.live:
            for j, ok, why in self.step():
                done += 1
                where = f"{time.perf_counter() - t0:.0f} s so far, SLURM"
                if ok:
                    self.log(f"[{done}/{total}] done  {j.name}  ({where})")
                else:
                    failures.append((j, why))
                    self.log(f"[{done}/{total}] FAILED {j.name} ({where}): {_last_line(why)}")
        return failures

    def step(self) -> list[tuple[_Job, bool, str]]:
        """Wait ``POLL_S``; the jobs that are over since, done or not, and why (jobs that ended early
        are submitted again, and not over)."""
        time.sleep(poll_s())
        states = self.queue()
        if states is None:
            return []
        over = []
        for job_id, j in list(self.live.items()):
            end = self.poll(job_id, j, states.get(job_id))
            if end is None or end[0] is None:  # not over, or submitted again under a new job id
                continue
            del self.live[job_id]
            over.append((j, end[0], end[1]))
        return over

    def poll(self, job_id: str, j: _Job, state: tuple[str, str] | None) -> tuple[bool | None, str] | None:
        """None while the job is not over; else (True, "") done, (False, why) failed, (None, "")
        ended early and submitted again."""
        if state is not None and state[0] in LIVE:
            if state[0] == "RUNNING" and j.state != "RUNNING":
                self.log(f"  job {job_id} ({j.name}) running")
            elif state[0] in ("PENDING", "REQUEUED", "REQUEUE_HOLD") and j.state in ("RUNNING", "COMPLETING"):
                self.log(f"  job {job_id} ({j.name}) requeued ({state[1]}): it resumes from its checkpoint")
            j.state = state[0]
            return None
        result = j.job.paths.result_pickle
        if state is None and not result.exists():  # left the queue: its result may be on its way
            j.gone_since = j.gone_since or time.time()
            if time.time() - j.gone_since < GONE_GRACE_S:
                return None
        final = state[0] if state is not None else "no longer in the queue"
        log_tail = tail(j.log_path)
        if result.exists():
            try:
                code = j.job.result()
            except submitit.core.utils.UncompletedJobError as e:  # the job's wrapper raised (timed out too often)
                return False, f"{log_tail}\n(job {job_id}: {_last_line(str(e))})"
            if code == 0:
                return True, ""
            if code > 0:  # a Python error: it would fail the same way again
                return False, log_tail
            final = f"{final}, its run killed by signal {-code}"
        elif final in NOT_RETRIED:
            slurm_log = j.job.paths.stdout
            return False, f"job {job_id} ended {final} without a result; its log {slurm_log}:\n{tail(slurm_log)}"
        if j.retries >= self.s.max_retries:
            return False, f"{log_tail}\n(job {job_id} ended {final} after {j.retries} retries)"
        j.retries += 1
        self.log(
            f"  job {job_id} ({j.name}) ended {final}; retry {j.retries}/{self.s.max_retries} "
            "resumes from its checkpoint"
        )
        del self.live[job_id]
        self.submit(j)
        return None, ""

    def queue(self) -> dict[str, tuple[str, str]] | None:
        """State and reason of this user's jobs that SLURM still knows (finished ones for a few minutes)."""
        cmd = ["squeue", "--noheader", "--states=all", f"--user={self.user}", "--format=%i|%T|%r"]
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            out = None
        if out is None or out.returncode != 0:
            if not self.squeue_down:
                self.log(f"  squeue failed ({(out.stderr.strip() if out else 'timed out')}); trying again")
            self.squeue_down = True
            return None
        self.squeue_down = False
        states = {}
        for line in out.stdout.splitlines():
            job_id, _, rest = line.strip().partition("|")
            state, _, reason = rest.partition("|")
            states[job_id] = (state, reason)
        return states

    def cancel_all(self) -> None:
        ids = list(self.live)
        if ids:
            subprocess.run(["scancel", *ids], capture_output=True, timeout=60)
            self.log(f"interrupted: cancelled this campaign's {len(ids)} SLURM job(s): {' '.join(ids)}")
        self.live.clear()


def _sigterm_interrupts() -> Callable[[], None]:
    """While the campaign waits, SIGTERM interrupts it as Ctrl-C does (its jobs are cancelled)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, interrupt)
    return lambda: signal.signal(signal.SIGTERM, old)


def _last_line(text: str) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return lines[-1].strip() if lines else ""
