"""The tracking server's PostgreSQL lets no one in but MLflow's own role (issue: trust authentication)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest
import sqlalchemy

from runners.ops.postgres import ROLE, PostgresCluster, find_bin
from runners.ops.tracking import free_port

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
