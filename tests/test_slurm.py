"""The SLURM backend against a real SLURM: Debian's slurmctld, slurmd, slurm-client and munge
(``make slurm`` installs them), a single-node cluster (munged, slurmctld and slurmd on this
machine, no cgroups, no accounting) started by a fixture from a generated slurm.conf in a
temporary folder.

A tiny campaign runs to its fitted table while one job is requeued and the other cancelled
mid-run; an interrupted campaign cancels its own jobs and no other; the ``slurm:`` section's
mistakes are one line each."""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient

from runners.campaign.load import load_campaign
from runners.campaign.runs import run_campaign
from runners.campaign.spec import CampaignError
from runners.tracking.server_processes import free_port
from tests.campaigns import history_steps, write_campaign

DAEMONS = ("munged", "slurmctld", "slurmd")


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory):
    with slurm_on_this_machine(tmp_path_factory.mktemp("slurm")) as d:
        yield d


@contextlib.contextmanager
def slurm_on_this_machine(d: Path):
    """A one-node SLURM cluster on this machine, its files in ``d``; SLURM_CONF points the client
    commands at it."""
    missing = [x for x in (*DAEMONS, "mungekey", "sbatch") if shutil.which(x) is None]
    debs = "slurmctld, slurmd, slurm-client and munge"
    assert not missing, f"the SLURM tests need Debian's {debs} ({missing} missing): make slurm"
    (d / "munge-key").mkdir(mode=0o700)
    (d / "munge").mkdir(mode=0o755)
    for sub in ("state", "spool", "run"):
        (d / sub).mkdir()
    key, sock = d / "munge-key" / "munge.key", d / "munge" / "munge.socket"
    subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True)
    host, user = socket.gethostname(), getpass.getuser()
    cpus, mem_mb = os.cpu_count(), psutil.virtual_memory().total // 2**21  # half the memory, in MB
    conf = d / "slurm.conf"
    conf.write_text(
        f"""ClusterName=prltest
SlurmctldHost={host}(127.0.0.1)
SlurmUser={user}
SlurmdUser={user}
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={sock},cred_expire=10
StateSaveLocation={d / "state"}
SlurmdSpoolDir={d / "spool"}
SlurmctldPidFile={d / "run" / "slurmctld.pid"}
SlurmdPidFile={d / "run" / "slurmd.pid"}
SlurmctldLogFile={d / "slurmctld.log"}
SlurmdLogFile={d / "slurmd.log"}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=2
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
KillWait=5
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={mem_mb} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
    )
    old_conf = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(conf)
    procs = []
    try:
        munge_args = [f"--socket={sock}", f"--key-file={key}", f"--pid-file={d / 'munge' / 'pid'}"]
        munge_args += [f"--seed-file={d / 'munge' / 'seed'}", f"--log-file={d / 'munged.log'}"]
        for cmd in (
            ["munged", "--foreground", "--force", *munge_args],
            ["slurmctld", "-D", "-f", str(conf)],
            ["slurmd", "-D", "-f", str(conf), "-N", host],
        ):
            out = (d / f"{cmd[0]}.out").open("w")
            procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT))
            time.sleep(1.0)
        deadline = time.time() + 60
        while "idle" not in _sinfo():
            assert time.time() < deadline, f"the SLURM node never came up: {_sinfo()}; see {d}"
            assert all(p.poll() is None for p in procs), f"a SLURM daemon exited; see {d}/*.out and *.log"
            time.sleep(1.0)
        yield d
    finally:
        subprocess.run(["scancel", f"--user={user}"], capture_output=True)
        deadline = time.time() + 30
        while _squeue() and time.time() < deadline:
            time.sleep(1.0)
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        if old_conf is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old_conf


def _sinfo() -> str:
    r = subprocess.run(["sinfo", "--noheader", "--format=%T"], capture_output=True, text=True)
    return r.stdout.strip() or r.stderr.strip()


def _squeue(*extra: str) -> list[tuple[str, str, str]]:
    """(job id, state, name) of the jobs SLURM runs or queues."""
    r = subprocess.run(["squeue", "--noheader", "--format=%i|%T|%j", *extra], capture_output=True, text=True)
    return [tuple(line.split("|")) for line in r.stdout.splitlines()]  # type: ignore[misc]


def _job_ids(run_dir: Path) -> list[str]:
    """The SLURM jobs submitted for a run, oldest first (submitit names its files by job id)."""
    return sorted({p.name.split("_")[0] for p in (run_dir / "slurm").glob("*_submitted.pkl")}, key=int)


@contextlib.contextmanager
def disrupt(camp_dir: Path, actions: dict[str, list[str]]):
    """Once a run's first checkpoint is complete, act on its current job (``scontrol requeue``,
    ``scancel``: a preemption, a user or an admin); yields ``{variant: job id}`` of what it did."""
    did: dict[str, str] = {}
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set() and len(did) < len(actions):
            for variant, cmd in actions.items():
                if variant in did:
                    continue
                for run_dir in camp_dir.glob(f"{variant}-seed0-*"):
                    if (run_dir / "checkpoints" / "checkpoint-2" / "prl_state.json").is_file() and _job_ids(run_dir):
                        job = _job_ids(run_dir)[-1]
                        subprocess.run([*cmd, job], check=True)
                        did[variant] = job
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield did
    finally:
        stop.set()
        watcher.join(timeout=5)


@pytest.mark.xdist_group("slurm")
@pytest.mark.slow
def test_a_campaign_on_slurm_survives_a_requeue_and_a_scancel_and_reaches_its_fit(
    slurm_cluster, store, tmp_path, monkeypatch
):
    monkeypatch.setenv("PRL_CACHE", str(tmp_path / "cache"))  # an empty cache: the base model is built by a job
    path = write_campaign(
        tmp_path / "slurm.yaml",
        "tiny-slurm",
        4,
        {"loss": {"key": "algorithm.loss", "values": ["cispo", "dapo"]}},
        backend="slurm",
        max_retries=2,
        slurm={"time": "0:20:00", "partition": "debug", "cpus": 1, "mem_gb": 2},
    )
    camp_dir = tmp_path / "artifacts" / "campaigns" / "tiny-slurm"
    said: list[str] = []
    actions = {"baseline": ["scontrol", "requeue"], "loss-dapo": ["scancel"]}
    with disrupt(camp_dir, actions) as did:
        summary = run_campaign(path, log=said.append)
    assert set(did) == set(actions), f"the watcher did not reach every run: {did}\n" + "\n".join(said)
    assert not summary["failures"] and summary["ran"] == 2, "\n".join(said)
    assert any("submitted job" in m and "base model tiny-" in m for m in said)  # built once, by a job
    assert any(f"job {did['baseline']} (baseline seed 0) requeued" in m for m in said), said
    assert any(f"job {did['loss-dapo']} (loss=dapo seed 0) ended CANCELLED" in m and "retry 1/2" in m for m in said)

    client = MlflowClient(store)
    exp = client.get_experiment_by_name("tiny-slurm")
    children = client.search_runs([exp.experiment_id], "tags.`prl.run_id` != ''")
    assert sorted(r.data.tags["prl.variant"] for r in children) == ["baseline", "loss=dapo"]
    for run in children:
        assert run.data.tags["prl.done"] == "1"
        assert history_steps(client, run.info.run_id, "val/mean_at_16") == [0, 2, 4]  # every step once
        assert history_steps(client, run.info.run_id, "train/loss") == [1, 2, 3, 4]
        assert run.data.tags["prl.placement"].startswith("slurm job ")
    requeued = next(camp_dir.glob("baseline-seed0-*"))
    cancelled = next(camp_dir.glob("loss-dapo-seed0-*"))
    assert _job_ids(requeued) == [did["baseline"]]  # SLURM ran the same job again
    assert len(_job_ids(cancelled)) == 2 and _job_ids(cancelled)[0] == did["loss-dapo"]  # submitted again
    for run_dir in (requeued, cancelled):
        log = (run_dir / "run.log").read_text()
        assert log.count("[placement] slurm job") == 2 and "resuming from" in log
        assert list((run_dir / "slurm").glob("*_log.out"))  # the jobs' own logs, beside the run

    from analysis.loo import write_report
    from runners.campaign.spec import fit_settings

    settings = fit_settings({"a_grid": "0.05:1.0:0.005"})
    table = write_report("tiny-slurm", tmp_path / "fit", settings, log=lambda m: None)
    assert set(table["variant"]) == {"baseline", "loss=dapo"} and (tmp_path / "fit" / "loo_table.md").is_file()


@pytest.mark.xdist_group("slurm")
@pytest.mark.slow
def test_a_warned_job_requeues_itself_a_rerun_has_one_writer_and_an_interrupt_cancels_only_its_jobs(
    slurm_cluster, own_store, tmp_path
):
    """SIGUSR2 is what SLURM sends a job before its time limit (``--signal``) or a preemption: the
    job ends its run and requeues itself (submitit), and runs again from the checkpoint. The
    campaign is then killed (-9) and run again: the job it left, whose tracking server died with
    it, is cancelled before the run's new job starts. SIGTERM to that campaign cancels its job and
    leaves someone else's alone."""
    other = subprocess.run(
        ["sbatch", "--parsable", "--job-name=someone-elses", "--wrap=sleep 900"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    path = write_campaign(tmp_path / "int.yaml", "tiny-slurm-int", 40, {}, backend="slurm", slurm={"time": 30})
    cmd = [sys.executable, "-m", "runners", "campaign", str(path)]
    camp_dir = tmp_path / "artifacts" / "campaigns" / "tiny-slurm-int"
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    second = None
    try:
        with disrupt(camp_dir, {"baseline": ["scancel", "--signal=USR2"]}) as did:
            deadline = time.time() + 600
            while "baseline" not in did:
                assert time.time() < deadline and first.poll() is None, "the run never reached its first checkpoint"
                time.sleep(1.0)
        job = did["baseline"]
        run_dir = next(camp_dir.glob("baseline-seed0-*"))
        while "resuming from" not in (run_dir / "run.log").read_text():  # it runs again, from its checkpoint
            assert time.time() < deadline and first.poll() is None, "the warned job never ran again"
            time.sleep(1.0)
        first.kill()
        out_first = first.communicate(timeout=60)[0].decode()
        second = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        while len(_job_ids(run_dir)) < 2 or (_job_ids(run_dir)[-1], "RUNNING") not in [x[:2] for x in _squeue()]:
            assert time.time() < deadline and second.poll() is None, "the rerun never started the run's new job"
            time.sleep(1.0)
        second.send_signal(signal.SIGTERM)
        out = second.communicate(timeout=60)[0].decode()
    finally:
        for proc in (first, second):
            with contextlib.suppress(ProcessLookupError, AttributeError):
                proc.kill()
    assert _job_ids(run_dir)[0] == job and len(_job_ids(run_dir)) == 2  # requeued as itself, then one new job
    new_job = _job_ids(run_dir)[1]
    job_log = (run_dir / "slurm" / f"{job}_0_log.out").read_text()
    assert "Calling checkpoint method" in job_log and f"Requeued job {job}" in job_log
    assert f"job {job} (baseline seed 0) requeued" in out_first, out_first
    assert f"cancelled job {job} of an earlier invocation for baseline seed 0" in out, out
    assert f"interrupted: cancelled this campaign's 1 SLURM job(s): {new_job}" in out, out
    deadline = time.time() + 30
    while any(name.startswith("prl-tiny-slurm-int") for _, _, name in _squeue()):
        assert time.time() < deadline, _squeue()
        time.sleep(1.0)
    assert [job for job, _, _ in _squeue()] == [other]  # someone else's job is untouched
    subprocess.run(["scancel", other], check=True)
    placements = [x for x in (run_dir / "run.log").read_text().splitlines() if x.startswith("[placement]")]
    assert placements[:2] == [f"[placement] slurm job {job} on {socket.gethostname()}"] * 2


@pytest.mark.xdist_group("slurm")
@pytest.mark.slow
def test_a_slurm_campaign_refused_by_sbatch_says_why_in_one_line(slurm_cluster, store, tmp_path):
    path = write_campaign(
        tmp_path / "bad.yaml", "tiny-slurm-bad", 4, {}, backend="slurm", slurm={"time": 5, "partition": "nowhere"}
    )
    with pytest.raises(CampaignError, match="sbatch refused the job of baseline seed 0: .*[Ii]nvalid partition"):
        run_campaign(path, log=lambda m: None)
    assert not _squeue()


@pytest.mark.parametrize(
    "extra,msg",
    [
        ({"backend": "slurm"}, "backend slurm needs a slurm section with the jobs' time limit"),
        ({"backend": "slurm", "slurm": {"partition": "gpu"}}, "slurm.time missing"),
        ({"slurm": {"time": "4:00"}}, r"slurm.time = '4:00': expected minutes .* 'HH:MM:SS'"),
        ({"slurm": {"time": 0}}, "slurm.time = 0: expected minutes"),
        ({"slurm": {"time": 60, "gpu": 1}}, "unknown key 'slurm.gpu'.*did you mean 'slurm.gpus'"),
        ({"slurm": {"time": 60, "gpus": -1}}, r"slurm.gpus = -1: expected a whole number >= 0"),
        ({"slurm": {"time": 60, "cpus": 0}}, r"slurm.cpus = 0: expected a whole number >= 1"),
        ({"slurm": {"time": 60, "mem_gb": "lots"}}, "slurm.mem_gb = 'lots': expected the memory"),
        ({"slurm": {"time": 60, "partition": 3}}, "slurm.partition = 3: expected a name"),
        ({"slurm": {"time": 60, "setup": "module load cuda"}}, "slurm.setup = .*expected a list of shell lines"),
        ({"slurm": {"time": 60, "sbatch": ["--exclusive"]}}, "slurm.sbatch = .*expected sbatch options"),
        ({"slurm": [60]}, r"slurm = \[60\]: expected a mapping"),
        ({"backend": "slurm", "gpus_per_run": 2, "slurm": {"time": 60}}, "slurm.gpus; remove gpus_per_run"),
        ({"backend": "slurmm"}, "backend = 'slurmm'; choose local, ray or slurm"),
    ],
)
def test_bad_slurm_sections_get_one_clear_line(tmp_path, cli, extra, msg):
    path = write_campaign(tmp_path / "bad.yaml", "bad", 4, {}, **extra)
    with pytest.raises(CampaignError, match=msg):
        load_campaign(path)
    r = cli("runners", "campaign", str(path), "--dry-run")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "error:" in r.stderr


def test_a_slurm_section_reads_times_as_slurm_does(tmp_path):
    for given, minutes in ((90, 90), ("4:00:00", 240), ("1-12:00:00", 2160), ("2-3", 3060), ("0:00:30", 1)):
        path = write_campaign(tmp_path / "ok.yaml", "ok", 4, {}, backend="slurm", slurm={"time": given})
        assert load_campaign(path).backend_settings.time == minutes, given


def test_a_slurm_campaign_without_sbatch_is_refused_before_anything_runs(store, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    path = write_campaign(tmp_path / "s.yaml", "no-slurm", 4, {}, backend="slurm", slurm={"time": 10})
    with pytest.raises(CampaignError, match="sbatch, squeue, scancel not found on PATH"):
        run_campaign(path, log=lambda m: None)
    assert MlflowClient(store).get_experiment_by_name("no-slurm") is None


@pytest.mark.parametrize("value", ["soon", "0", "-5", "nan", "3601"])
def test_a_bad_slurm_poll_interval_is_one_line_before_anything_runs(tmp_path, monkeypatch, value):
    """``PRL_SLURM_POLL_S`` (seconds between two squeue calls) that is not a number of seconds is
    refused by the backend's check, naming the variable, as a bad campaign key is."""
    from runners.campaign.backends.slurm import check_slurm, poll_s

    assert poll_s() == 1.0  # the suite's (tests/conftest.py); 5 s where it is unset
    monkeypatch.setenv("PRL_SLURM_POLL_S", value)
    with pytest.raises(CampaignError, match=rf"PRL_SLURM_POLL_S = '{value}': expected seconds between two squeue"):
        check_slurm()
    monkeypatch.delenv("PRL_SLURM_POLL_S")
    assert poll_s() == 5.0
