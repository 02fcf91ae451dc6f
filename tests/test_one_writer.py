"""One writer per run (#27 items 1-2): a single run's folder belongs to one run identity, and a
folder or a campaign has one writer at a time (that a campaign killed with SIGKILL takes its
trainers with it: tests/test_campaign.py's random kills). Real processes, the tiny model, a real
SQLite MLflow store."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.campaigns import TINY, history_steps, write_campaign
from tests.conftest import empty_store

SETS = [f"--set={k}={json.dumps(v)}" for k, v in {**TINY, "train.steps": 2, "train.save_every": 2}.items()]
SETS += ["--set=eval.every=2"]
LR = "--set=optim.lr=3e-4"  # the baseline recipe's is 1.5e-4


def train_cli(cwd: Path, *args: str, wait: bool = True):
    cmd = [sys.executable, "-m", "runners", "train", "scalerl", *SETS, *args]
    if not wait:
        return subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=900)


def run_folders(cwd: Path) -> list[Path]:
    return sorted(p.parent for p in (cwd / "artifacts" / "runs").glob("*/recipe.yaml"))


def steps_of(folder: Path) -> list[int]:
    return [json.loads(x)["step"] for x in (folder / "metrics.jsonl").read_text().splitlines()]


def trained_steps(folder: Path) -> int:
    """The furthest step any checkpoint of the folder reached."""
    states = (folder / "checkpoints").glob("checkpoint-*/trainer_state.json")
    return max(json.loads(p.read_text())["global_step"] for p in states)


def one_line_error(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    return lines[0]


@pytest.mark.slow
def test_single_runs_with_other_settings_never_share_a_folder_untracked(tiny_base, tmp_path):
    """The issue's two commands, untracked: the second (another lr) gets its own folder and its own
    evaluations; pointed at the first one's folder it is refused naming the key; a second trainer on
    a folder being trained is refused naming the trainer's pid; a finished run re-run trains nothing."""
    first = train_cli(tmp_path, "--untracked", wait=False)
    try:  # hold the first run mid-training (after its step-0 evaluation) while a second one tries
        deadline = time.time() + 600
        while time.time() < deadline and first.poll() is None:
            if any((f / "metrics.jsonl").is_file() for f in run_folders(tmp_path)):
                break
            time.sleep(0.2)
        os.kill(first.pid, signal.SIGSTOP)
        (folder,) = run_folders(tmp_path)
        busy = one_line_error(train_cli(tmp_path, "--untracked"))
        assert f"pid {first.pid}" in busy and str(folder) in busy, busy
    finally:
        os.kill(first.pid, signal.SIGCONT)
    out, err = first.communicate(timeout=900)
    assert first.returncode == 0, out[-2000:] + err[-2000:]
    recipe, metrics = (folder / "recipe.yaml").read_text(), (folder / "metrics.jsonl").read_text()
    assert steps_of(folder) == [0, 2] and trained_steps(folder) == 2

    second = train_cli(tmp_path, LR, "--untracked")
    assert second.returncode == 0, second.stderr[-3000:]
    (other,) = [f for f in run_folders(tmp_path) if f != folder]
    assert "lr: 0.0003" in (other / "recipe.yaml").read_text() and steps_of(other) == [0, 2]
    assert (folder / "recipe.yaml").read_text() == recipe and (folder / "metrics.jsonl").read_text() == metrics

    refused = one_line_error(train_cli(tmp_path, LR, "--untracked", "--run-dir", str(folder)))
    assert str(folder) in refused and "optim.lr: 0.00015 -> 0.0003" in refused, refused
    assert (folder / "recipe.yaml").read_text() == recipe

    again = train_cli(tmp_path, "--untracked")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "finished" in again.stdout and "nothing to train" in again.stdout, again.stdout
    assert (folder / "metrics.jsonl").read_text() == metrics and trained_steps(folder) == 2  # no extra step
    assert len(run_folders(tmp_path)) == 2

    (folder / "done.json").unlink()  # killed after its last checkpoint, before it could record the end
    again = train_cli(tmp_path, "--untracked")
    assert again.returncode == 0 and "checkpoint-2 is the run's last step" in again.stdout, again.stdout
    assert (folder / "metrics.jsonl").read_text() == metrics and trained_steps(folder) == 2
    assert (folder / "done.json").is_file()


def test_a_folder_of_another_run_is_refused_naming_the_keys(tmp_path):
    """A longer budget or another setting is another run; a folder written before identity files
    existed is judged by its recipe.yaml; a run's own folder is accepted again."""
    from runners.recipe import load_recipe
    from runners.runfolder import RunFolderError, claim

    four = load_recipe("scalerl", {"train.steps": 4, "eval.every": 2})
    six = load_recipe("scalerl", {"train.steps": 6, "eval.every": 2, "algorithm.loss": "dapo"})
    claim(tmp_path / "run", four)
    claim(tmp_path / "run", four)  # its own
    with pytest.raises(RunFolderError, match=r"another run \(algorithm.loss: cispo -> dapo, train.steps: 4 -> 6\)"):
        claim(tmp_path / "run", six)
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "recipe.yaml").write_text(four.to_yaml())
    with pytest.raises(RunFolderError, match=r"train.steps: 4 -> 6"):
        claim(legacy, six)
    claim(legacy, four)  # adopted: its identity recorded
    assert (legacy / "identity.json").is_file()
    (tmp_path / "unknown" / "checkpoints").mkdir(parents=True)
    with pytest.raises(RunFolderError, match="no record of its recipe"):
        claim(tmp_path / "unknown", four)


@pytest.mark.slow
def test_single_runs_with_other_settings_never_share_results_tracked(tiny_base, tmp_path, monkeypatch, store_template):
    """Tracked: the second command's MLflow run holds its own evaluations and training steps, never
    the first run's; a finished run re-run adds no MLflow run and no step."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", empty_store(store_template, tmp_path / "mlflow.db"))
    assert train_cli(tmp_path).returncode == 0
    second = train_cli(tmp_path, LR)
    assert second.returncode == 0, second.stderr[-3000:]
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    exp_id = client.get_experiment_by_name("runs").experiment_id
    runs = {r.data.params["optim.lr"]: r for r in client.search_runs([exp_id], "tags.`prl.run_id` != ''")}
    assert sorted(runs) == ["0.00015", "0.0003"]
    for lr, run in runs.items():
        folder = Path(run.data.tags["prl.run_dir"])
        assert f"lr: {float(lr)}" in (folder / "recipe.yaml").read_text()
        mine = {json.loads(x)["step"]: json.loads(x)["val/mean_at_16"] for x in (folder / "metrics.jsonl").open()}
        logged = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "val/mean_at_16")}
        assert logged == mine and sorted(logged) == [0, 2], (lr, logged, mine)
        assert history_steps(client, run.info.run_id, "train/loss") == [1, 2]
    assert runs["0.00015"].data.tags["prl.run_dir"] != runs["0.0003"].data.tags["prl.run_dir"]

    again = train_cli(tmp_path)
    assert again.returncode == 0 and "nothing to train" in again.stdout, again.stdout + again.stderr[-3000:]
    assert len(client.search_runs([exp_id], "tags.`prl.run_id` != ''")) == 2
    assert history_steps(client, runs["0.00015"].info.run_id, "train/loss") == [1, 2]


@pytest.mark.slow
def test_two_campaigns_started_together_one_refuses_naming_the_other(store, tmp_path):
    path = write_campaign(tmp_path / "twice.yaml", "twice", 2, {})
    cmd = [sys.executable, "-m", "runners", "campaign", str(path)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=900) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 2], [o[1][-2000:] for o in outs]
    refused = next(i for i, p in enumerate(procs) if p.returncode == 2)
    holder = procs[1 - refused].pid
    line = [x for x in outs[refused][1].splitlines() if x.strip()]
    assert len(line) == 1 and f"pid {holder}" in line[0] and "campaign twice" in line[0], line
    client = MlflowClient(store)
    exp_id = client.get_experiment_by_name("twice").experiment_id
    (run,) = client.search_runs([exp_id], "tags.`prl.run_id` != ''")  # one run per identity
    assert run.data.tags["prl.done"] == "1" and history_steps(client, run.info.run_id, "val/mean_at_16") == [0, 2]
    (folder,) = (tmp_path / "artifacts" / "campaigns" / "twice").glob("baseline-*")
    assert steps_of(folder) == [0, 2]


# --- #60 item 1: one campaign per store on a tracking server, whatever folder or URI spelling -------


def _lease(url: str, exp_id: str):
    from runners.campaign.runs import ADVICE
    from runners.tracking.lease import Lease

    return Lease(MlflowClient(url), exp_id, f"campaign leased on store {url}", ADVICE)


def test_a_campaign_on_a_server_another_campaign_holds_is_refused_from_any_folder_and_spelling(
    session_server, tmp_path
):
    """A campaign holds its lease on a real tracking server (as http://127.0.0.1:PORT, from one
    folder); the same campaign run from another folder through http://localhost:PORT is refused in
    one line naming the holder and when its lease lapses, before it makes any MLflow run or folder.
    Before: the lock was a file in the campaign's folder keyed by the URI's text, and both trained
    every run (two FINISHED child runs per identity)."""
    import socket

    from runners.tracking import store

    port = session_server.rsplit(":", 1)[1]
    client = MlflowClient(f"http://127.0.0.1:{port}")
    exp_id = store.experiment_id(client, "leased", create=True)
    path = write_campaign(tmp_path / "leased.yaml", "leased", 2, {})
    other = tmp_path / "other"
    other.mkdir()
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"http://localhost:{port}"}
    lease = _lease(f"http://127.0.0.1:{port}", exp_id)
    lease.take()
    try:
        res = subprocess.run(
            [sys.executable, "-m", "runners", "campaign", str(path)],
            cwd=other,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
    finally:
        lease.release()
    line = one_line_error(res)
    assert line.startswith(
        f"error: campaign leased on store http://localhost:{port} is in use by pid {os.getpid()} on "
    ), line
    assert socket.gethostname() in line and "its lease on the store lapses at " in line, line
    assert client.search_runs([exp_id]) == []  # no parent, no child run
    assert not (other / "artifacts").exists()
    assert store.LEASE not in client.get_experiment(exp_id).tags  # released


def test_two_clients_racing_for_a_lease_end_with_one_holder(session_server):
    """Two clients that find a campaign's lease free at the same moment (through two spellings of one
    server) both write it; exactly one holds it and the other is refused naming it."""
    import threading

    from runners.locks import Busy
    from runners.tracking import store

    port = session_server.rsplit(":", 1)[1]
    exp_id = store.experiment_id(MlflowClient(session_server), "raced", create=True)
    leases = [_lease(f"http://{host}:{port}", exp_id) for host in ("127.0.0.1", "localhost")]
    barrier, outcome = threading.Barrier(2), {}

    def take(i: int) -> None:
        barrier.wait()
        try:
            leases[i].take()
            outcome[i] = "held"
        except Busy as e:
            outcome[i] = str(e)

    threads = [threading.Thread(target=take, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert sorted(v == "held" for v in outcome.values()) == [False, True], outcome
        winner = next(i for i, v in outcome.items() if v == "held")
        assert f"is in use by pid {os.getpid()} on " in outcome[1 - winner], outcome
        assert leases[winner].current().token == leases[winner].token
    finally:
        for lease in leases:
            lease.release()


HOLD_LEASE = """
import sys, time
from mlflow.tracking import MlflowClient
from runners.tracking.lease import Lease
Lease(MlflowClient(sys.argv[1]), sys.argv[2], "campaign killed", "wait").take()
print("held", flush=True)
time.sleep(600)
"""


def test_the_lease_of_a_killed_campaign_is_taken_over(session_server):
    """A campaign killed with kill -9 renews its lease no more: on its own host the next campaign takes
    it at once (its pid is gone); a lease of another host is taken only once it has lapsed, and
    until then the refusal says when that is."""
    import json as json_

    from runners.locks import Busy
    from runners.tracking import store
    from runners.tracking.lease import Holder

    client = MlflowClient(session_server)
    exp_id = store.experiment_id(client, "killed", create=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LEASE, session_server, exp_id], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(Busy, match=f"pid {holder.pid} on "):
        _lease(session_server, exp_id).take()
    holder.kill()
    holder.wait()
    mine = _lease(session_server, exp_id)
    mine.take()  # its pid is gone: taken over at once
    mine.release()

    now = time.time()
    for expires, taken in ((now + 100, False), (now - 1, True)):
        gone = Holder("f00d", "gone-machine", 4321, now - 50, "python -m runners campaign x", now - 60, expires)
        client.set_experiment_tag(exp_id, store.LEASE, json_.dumps(gone.__dict__))
        lease = _lease(session_server, exp_id)
        if taken:
            lease.take()
            lease.release()
        else:
            with pytest.raises(Busy) as refused:
                lease.take()
            lapses = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(expires))
            assert "pid 4321 on gone-machine (" in str(refused.value) and f"lapses at {lapses}" in str(refused.value)


def test_clients_creating_one_campaigns_experiment_at_once_end_with_it(session_server):
    """Several clients of one server that find a campaign's experiment missing create it at the same
    moment: each ends with the one experiment, none with MLflow's RESOURCE_ALREADY_EXISTS."""
    import threading

    from runners.tracking import store

    for attempt in range(3):
        name, barrier, found = f"created-together-{attempt}", threading.Barrier(6), []

        def create(name: str = name, barrier: threading.Barrier = barrier, found: list = found) -> None:
            client = MlflowClient(session_server)
            client.get_experiment_by_name("warm-up")  # the connection, before the race
            barrier.wait()
            try:
                found.append(store.experiment_id(client, name, create=True))
            except Exception as e:
                found.append(repr(e)[:300])

        threads = [threading.Thread(target=create) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert (
            len(set(found)) == 1 and found[0] == MlflowClient(session_server).get_experiment_by_name(name).experiment_id
        ), found


def test_a_lease_another_client_overwrote_is_seen_as_lost_and_left_to_it(session_server, monkeypatch):
    """A racer slower than the lease's settle time writes its lease over a held one: the holder's next
    renewal sees it (``lost`` names the other, and the campaign stops on it), stops renewing, and its
    release leaves the other's lease in place."""
    import json as json_

    from runners.tracking import lease as lease_module
    from runners.tracking import store
    from runners.tracking.lease import Holder

    monkeypatch.setattr(lease_module, "RENEW", 0.2)  # a renewal every 0.2 s, not every 30 s
    client = MlflowClient(session_server)
    exp_id = store.experiment_id(client, "overwritten", create=True)
    mine = _lease(session_server, exp_id)
    mine.take()
    now = time.time()
    other = Holder("beef", "other-machine", 1234, now, "python -m runners campaign overwritten", now, now + 180)
    client.set_experiment_tag(exp_id, store.LEASE, json_.dumps(other.__dict__))
    deadline = time.time() + 60
    while mine.lost is None and time.time() < deadline:
        time.sleep(0.1)
    mine.release()
    assert mine.lost is not None and mine.lost.startswith("pid 1234 on other-machine ("), mine.lost
    assert Holder.parse(client.get_experiment(exp_id).tags[store.LEASE]).token == "beef"
