"""A private PostgreSQL cluster for the shared MLflow tracking server (Debian's PostgreSQL binaries).

``PostgresCluster(data_dir).start()`` runs ``initdb`` once, starts the server on 127.0.0.1 (and a
Unix socket in the data folder) and creates the ``mlflow`` database; ``uri`` is what
``mlflow server --backend-store-uri`` takes. PostgreSQL refuses to run as root, so as root the
cluster runs as the ``postgres`` system user (``runuser``).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import time
from pathlib import Path


class PostgresError(RuntimeError):
    pass


def find_bin(name: str) -> str:
    """A PostgreSQL program from PATH or Debian's /usr/lib/postgresql/<version>/bin."""
    found = shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None)
    if found is None:
        raise PostgresError(
            f"PostgreSQL's {name} not found; install Debian's server: apt-get install postgresql "
            "(or pass an existing database with --db-uri postgresql://user@host/db)"
        )
    return found


class PostgresCluster:
    def __init__(self, data_dir: Path, port: int, database: str = "mlflow") -> None:
        self.data_dir, self.port, self.database = Path(data_dir).resolve(), port, database
        self.user = "postgres" if os.geteuid() == 0 else None  # who runs the server

    @property
    def uri(self) -> str:
        # initdb's superuser, through psycopg2 (SQLAlchemy 2.1's default PostgreSQL driver is psycopg 3)
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/{self.database}"

    def _run(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
        full = ["runuser", "-u", self.user, "--", *cmd] if self.user else list(cmd)
        res = subprocess.run(full, capture_output=True, text=True, timeout=120, cwd="/")
        if check and res.returncode != 0:
            raise PostgresError(f"{' '.join(cmd[:2])} failed: {(res.stderr or res.stdout).strip()[-500:]}")
        return res

    def start(self) -> PostgresCluster:
        if self.user:  # the data folder must be reachable by the postgres user
            self.data_dir.parent.mkdir(parents=True, exist_ok=True)
            os.chmod(self.data_dir.parent, 0o755)
            if self._run("test", "-x", str(self.data_dir.parent), check=False).returncode != 0:
                raise PostgresError(
                    f"{self.data_dir.parent}: the postgres user cannot reach this folder (PostgreSQL does not run "
                    "as root, so it runs as 'postgres'); choose a data folder whose parents are world-searchable"
                )
        if not (self.data_dir / "PG_VERSION").is_file():
            self.data_dir.mkdir(parents=True, exist_ok=True)
            if self.user:
                shutil.chown(self.data_dir, self.user, self.user)
            self._run(find_bin("initdb"), "-D", str(self.data_dir), "-A", "trust", "-U", self.user or "postgres")
        opts = f"-p {self.port} -k {self.data_dir} -c listen_addresses=127.0.0.1"
        log = self.data_dir / "server.log"
        self._run(find_bin("pg_ctl"), "-D", str(self.data_dir), "-o", opts, "-l", str(log), "-w", "start")
        deadline = time.time() + 30
        while time.time() < deadline:
            res = self._run(find_bin("psql"), *self._conn("postgres"), "-tAc", "select 1", check=False)
            if res.returncode == 0:
                break
            time.sleep(0.3)
        exists = self._run(
            find_bin("psql"),
            *self._conn("postgres"),
            "-tAc",
            f"select 1 from pg_database where datname='{self.database}'",
        )
        if exists.stdout.strip() != "1":
            self._run(
                find_bin("createdb"),
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                self.user or "postgres",
                self.database,
            )
        return self

    def _conn(self, db: str) -> list[str]:
        return ["-h", "127.0.0.1", "-p", str(self.port), "-U", self.user or "postgres", "-d", db]

    def stop(self) -> None:
        self._run(find_bin("pg_ctl"), "-D", str(self.data_dir), "-m", "fast", "-w", "stop", check=False)

    def __enter__(self) -> PostgresCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
