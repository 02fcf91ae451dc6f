"""The tracking server's PostgreSQL lets no one in but MLflow's own role (issue: trust authentication);
`make tracking-server` survives a kill -9 of its owner and, with --auth, refuses strangers (issue 27)
and takes a campaign's concurrent runs."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest
import sqlalchemy
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from runners.campaign.runs import run_campaign
from runners.tracking.postgres import ROLE, PostgresCluster, find_bin
from runners.tracking.run import MlflowSink
from runners.tracking.server_processes import free_port
from tests.campaigns import assert_ran_together, history_steps, write_campaign

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another local user (runuser)")


def _as_nobody(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", "nobody", "--", *cmd], capture_output=True, text=True, timeout=60, cwd="/")


@pytest.fixture
def cluster(request):
    root = Path(tempfile.mkdtemp(prefix="prl-pg-", dir="/tmp"))  # reachable by the postgres user
    os.chmod(root, 0o755)
    request.addfinalizer(lambda: shutil.rmtree(root, ignore_errors=True))
    pg = PostgresCluster(root / "data", port=free_port()).start()
    request.addfinalizer(pg.stop)
    return pg


@pytest.mark.slow
def test_an_unauthorised_local_user_is_refused(cluster):
    psql, port = find_bin("psql"), str(cluster.port)
    for user in ("postgres", ROLE):  # over TCP without the secret: no password, no entry
        r = _as_nobody(psql, "-h", "127.0.0.1", "-p", port, "-U", user, "-d", "mlflow", "-w", "-c", "select 1")
        assert r.returncode != 0 and "password" in r.stderr, r.stderr
    # over the Unix socket: only the server's own OS user. Asked as root (who can reach the socket in its
    # 0700 folder, unlike nobody), so that what refuses is PostgreSQL's peer check, not the folder's mode
    _assert_peer_refuses(cluster)


def _assert_peer_refuses(cluster) -> None:
    r = subprocess.run(
        [find_bin("psql"), "-h", str(cluster.data_dir), "-p", str(cluster.port), "-U", "postgres", "-d", "mlflow"]
        + ["-w", "-c", "select 1"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
    assert r.returncode != 0 and "Peer authentication failed" in r.stderr, r.stderr


@pytest.mark.slow
def test_mlflow_connects_as_a_role_that_is_no_superuser_and_owns_its_database(cluster):
    assert "secret" not in cluster.uri and str(cluster.passfile) in cluster.uri  # the URI names the file only
    assert stat.S_IMODE(cluster.passfile.stat().st_mode) == 0o600
    engine = sqlalchemy.create_engine(cluster.uri)
    with engine.connect() as conn:
        user, superuser = conn.execute(
            sqlalchemy.text("select current_user, rolsuper from pg_roles where rolname = current_user")
        ).one()
        owner = conn.execute(
            sqlalchemy.text("select pg_get_userbyid(datdba) from pg_database where datname = current_database()")
        ).scalar()
    engine.dispose()
    assert (user, superuser, owner) == (ROLE, False, ROLE)


@pytest.mark.slow
def test_a_cluster_made_with_trust_is_locked_on_its_next_start(cluster):
    hba = cluster.data_dir / "pg_hba.conf"
    cluster.stop()
    hba.write_text("local all all trust\nhost all all 127.0.0.1/32 trust\n")  # what the old initdb -A trust left
    cluster.start()
    r = _as_nobody(
        find_bin("psql"), "-h", "127.0.0.1", "-p", str(cluster.port), "-U", "postgres", "-w", "-c", "select 1"
    )
    assert r.returncode != 0 and "password" in r.stderr, r.stderr
    _assert_peer_refuses(cluster)  # the socket too: trust is gone from both
    engine = sqlalchemy.create_engine(cluster.uri)  # the same secret still lets MLflow in
    with engine.connect() as conn:
        assert conn.execute(sqlalchemy.text("select 1")).scalar() == 1
    engine.dispose()


# --- make tracking-server: owned, restartable after kill -9, basic authentication (issue 27) ---------


def _start_tracking_server(root: Path, port: int, log: Path, workers: int = 1) -> subprocess.Popen:
    with log.open("a") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "runners", "tracking-server", "--root", str(root), "--port", str(port)]
            + ["--workers", str(workers), "--auth"],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=Path(__file__).resolve().parent.parent,
        )


def _wait_for(log: Path, text: str, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    while text not in log.read_text():
        assert proc.poll() is None, log.read_text()
        assert time.time() < deadline, log.read_text()
        time.sleep(0.5)


def _rest(url: str, path: str, body: dict, auth: tuple[str, str] | None = None) -> int:
    req = urllib.request.Request(
        f"{url}/api/2.0/mlflow/{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    if auth:
        req.add_header("Authorization", "Basic " + base64.b64encode(":".join(auth).encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


@pytest.mark.slow
def test_tracking_server_with_auth_refuses_strangers_and_comes_back_after_kill_9(
    request, monkeypatch, tiny_base, tmp_path
):
    """`tracking-server --auth`: a REST request without the generated credentials is refused (401;
    before, any local account created and deleted experiments), with them it works, and an MLflow
    client given them in its environment (as a campaign's runs get them) logs a run. kill -9 of the
    owner left PostgreSQL (and MLflow) running, and the next start failed with 'pg_ctl: another
    server might be running'; now the next start stops what it left and serves the same store.
    Then a campaign's three runs write to it at once through two server workers, with the
    credentials in their environment as ``set -a; . credentials.env`` gives them."""
    root = Path(tempfile.mkdtemp(prefix="prl-ts-", dir="/tmp"))  # reachable by the postgres user
    os.chmod(root, 0o755)
    request.addfinalizer(lambda: shutil.rmtree(root, ignore_errors=True))
    port, log = free_port(), root / "ts.log"
    url = f"http://127.0.0.1:{port}"
    first = _start_tracking_server(root, port, log)
    request.addfinalizer(lambda: first.poll() is None and first.kill())
    _wait_for(log, "basic authentication on", first)
    creds = root / "auth" / "credentials.env"
    assert stat.S_IMODE(creds.stat().st_mode) == 0o600 and stat.S_IMODE((root / "auth").stat().st_mode) == 0o700
    env = dict(line.split("=", 1) for line in creds.read_text().splitlines() if not line.startswith("#"))
    user, password = env["MLFLOW_TRACKING_USERNAME"], env["MLFLOW_TRACKING_PASSWORD"]
    cmdlines = " ".join(" ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"]))
    assert password not in cmdlines  # on no command line

    assert _rest(url, "experiments/create", {"name": "stranger"}) == 401
    assert _rest(url, "experiments/create", {"name": "stranger"}, (user, "wrong")) == 401
    assert _rest(url, "experiments/create", {"name": "owner"}, (user, password)) == 200
    for _ in range(3):  # after the password was accepted too: the workers cache checked credentials only
        assert _rest(url, "experiments/create", {"name": "stranger"}, (user, "wrong")) == 401
    monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    with pytest.raises(MlflowException, match="401|not authenticated"):
        MlflowClient(url).search_experiments()
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", user)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", password)
    client = MlflowClient(url)
    exp = client.create_experiment("tracked")
    run_id = client.create_run(exp).info.run_id
    sink = MlflowSink(client, run_id, log=lambda m: None)  # the sink a campaign's runs log through
    sink({"train/loss": 0.5}, 1)
    (root / "note.txt").write_text("artifact")
    client.log_artifact(run_id, str(root / "note.txt"))  # through the server's artifact proxy
    client.set_terminated(run_id)

    second = subprocess.run(  # a second owner of the same root is refused, naming the first
        [sys.executable, "-m", "runners", "tracking-server", "--root", str(root), "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert second.returncode == 2 and f"runs already (pid {first.pid}, MLflow port {port})" in second.stderr

    pg_pid = int((root / "pgdata" / "postmaster.pid").read_text().split()[0])
    first.kill()  # kill -9 of the owner: PostgreSQL stays up, with no owner
    first.wait()
    assert psutil.pid_exists(pg_pid)
    log = root / "ts-again.log"
    again = _start_tracking_server(root, port, log, workers=2)
    request.addfinalizer(lambda: again.poll() is None and again.kill())
    _wait_for(log, "basic authentication on", again)
    assert f"stopping PostgreSQL (pid {pg_pid}" in log.read_text() and not psutil.pid_exists(pg_pid)
    run = client.get_run(run_id)  # the same store, the same credentials
    assert run.data.metrics == {"train/loss": 0.5} and run.info.status == "FINISHED"
    assert [a.path for a in client.list_artifacts(run_id)] == ["note.txt"]
    assert _rest(url, "experiments/delete", {"experiment_id": exp}) == 401

    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES")  # the runs retry as a user's would
    monkeypatch.chdir(tmp_path)
    camp = write_campaign(
        tmp_path / "pg.yaml", "tiny-pg", 4, {"loss": {"key": "algorithm.loss", "values": ["cispo", "dapo", "gspo"]}},
        parallel=3,
    )  # fmt: skip
    lines: list[str] = []
    summary = run_campaign(camp, log=lines.append)
    assert not summary["failures"] and summary["ran"] == 3 and summary["tracking_uri"] == url
    children = client.search_runs([client.get_experiment_by_name("tiny-pg").experiment_id], "tags.`prl.run_id` != ''")
    assert len(children) == 3
    for child in children:
        assert history_steps(client, child.info.run_id, "val/mean_at_16") == [0, 2, 4]
        for key in ("train/loss", "train/reward", "train/time/generation_seconds"):
            assert history_steps(client, child.info.run_id, key) == [1, 2, 3, 4], key
        assert "samples_table.json" in {a.path for a in client.list_artifacts(child.info.run_id)}
    assert_ran_together(lines, client, children)

    pg_pid = int((root / "pgdata" / "postmaster.pid").read_text().split()[0])
    again.send_signal(signal.SIGTERM)  # a clean stop takes PostgreSQL and every MLflow process along
    assert again.wait(timeout=120) == 0
    deadline = time.time() + 60  # the postmaster exits after its last backend; an exited one may await its reaper
    while psutil.pid_exists(pg_pid) and time.time() < deadline:
        with contextlib.suppress(psutil.NoSuchProcess):
            if psutil.Process(pg_pid).status() == psutil.STATUS_ZOMBIE:
                break
        time.sleep(0.5)
    gone = not psutil.pid_exists(pg_pid) or psutil.Process(pg_pid).status() == psutil.STATUS_ZOMBIE
    assert gone and not (root / "pgdata" / "postmaster.pid").exists()
    assert not [p for p in psutil.net_connections("inet") if p.status == "LISTEN" and p.laddr.port == port]
