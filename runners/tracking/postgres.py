"""A private PostgreSQL cluster for the shared MLflow tracking server (Debian's PostgreSQL binaries).

``PostgresCluster(data_dir).start()`` runs ``initdb`` once, starts the server on 127.0.0.1 (and a
Unix socket in the data folder) and creates the ``mlflow`` database; ``uri`` is what
``mlflow server --backend-store-uri`` takes. PostgreSQL refuses to run as root, so as root the
cluster runs as the ``postgres`` system user (``runuser``).

Nobody else on the machine gets in: TCP connections need a password (scram-sha-256), the Unix
socket admits only the OS user that runs the server (peer), as the cluster's superuser. MLflow
connects as ``mlflow``, a role that is no superuser and owns only its database, with a generated
secret kept in a libpq password file (mode 0600) beside the data folder; the URI names the file,
never the secret, so the secret is not on any command line. A cluster made by an older version
with ``trust`` authentication is switched over on its next start.

A server that runs on the data folder already (``postmaster.pid``) is refused with the command
that stops it; ``stop_leftover`` stops one that a killed tracking server left.
"""

from __future__ import annotations

import getpass
import glob
import os
import secrets
import shutil
import subprocess
import time
from pathlib import Path

import psutil

ROLE = "mlflow"  # the role MLflow connects as
HBA = (
    "# written by runners/tracking/postgres.py: the server's own OS user on the socket, passwords on TCP\n"
    "local all all peer\n"
    "host all all 127.0.0.1/32 scram-sha-256\n"
    "host all all ::1/128 scram-sha-256\n"
)


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
        self.superuser = self.user or getpass.getuser()  # peer authentication maps the OS user to this role

    @property
    def passfile(self) -> Path:
        """The libpq password file with the ``mlflow`` role's secret (mode 0600, owned by the caller)."""
        return self.data_dir.parent / f"{self.data_dir.name}.pgpass"

    @property
    def uri(self) -> str:
        # through psycopg2 (SQLAlchemy 2.1's default PostgreSQL driver is psycopg 3); libpq reads the secret
        return f"postgresql+psycopg2://{ROLE}@127.0.0.1:{self.port}/{self.database}?passfile={self.passfile}"

    def _run(self, *cmd: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess:
        full = ["runuser", "-u", self.user, "--", *cmd] if self.user else list(cmd)
        res = subprocess.run(full, capture_output=True, text=True, timeout=120, cwd="/", input=stdin)
        if check and res.returncode != 0:
            raise PostgresError(f"{' '.join(cmd[:2])} failed: {(res.stderr or res.stdout).strip()[-500:]}")
        return res

    def running(self) -> tuple[int, int] | None:
        """(pid, port) of the PostgreSQL server that runs on this data folder (its ``postmaster.pid``), or None."""
        try:
            lines = (self.data_dir / "postmaster.pid").read_text().splitlines()
            pid, port = int(lines[0]), int(lines[3])
            proc = psutil.Process(pid)
            try:  # the postmaster works in its data folder; a reused pid does not
                ours = Path(proc.cwd()).resolve() == self.data_dir
            except psutil.AccessDenied:  # another user's process, seen without root
                ours = proc.name() in ("postgres", "postmaster")
            if ours and proc.status() != psutil.STATUS_ZOMBIE:
                return pid, port
        except (OSError, ValueError, IndexError, psutil.Error):
            pass
        return None

    @property
    def stop_command(self) -> str:
        pg_ctl = f"{find_bin('pg_ctl')} -D {self.data_dir} -m fast stop"
        return f"runuser -u {self.user} -- {pg_ctl}" if self.user else pg_ctl

    def stop_leftover(self, log=print) -> None:
        """Stop a server left running on this data folder by a tracking server that was killed
        (its caller knows no live process owns it)."""
        found = self.running()
        if found is None:
            return
        log(
            f"stopping PostgreSQL (pid {found[0]}, port {found[1]}) left running on {self.data_dir} "
            "by a tracking server that was killed"
        )
        self.stop()
        if self.running() is not None:
            raise PostgresError(f"PostgreSQL (pid {found[0]}) on {self.data_dir} did not stop: {self.stop_command}")

    def start(self) -> PostgresCluster:
        if (found := self.running()) is not None:
            raise PostgresError(
                f"PostgreSQL already runs on {self.data_dir} (pid {found[0]}, port {found[1]}); "
                f"stop it first: {self.stop_command}"
            )
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
            self._run(
                find_bin("initdb"),
                "-D",
                str(self.data_dir),
                "--auth-local=peer",
                "--auth-host=scram-sha-256",
                "-U",
                self.superuser,
            )
        self._secure_hba()
        opts = f"-p {self.port} -k {self.data_dir} -c listen_addresses=127.0.0.1"
        log = self.data_dir / "server.log"
        self._run(find_bin("pg_ctl"), "-D", str(self.data_dir), "-o", opts, "-l", str(log), "-w", "start")
        deadline = time.time() + 30
        while self._sql("select 1", check=False).returncode != 0:
            if time.time() > deadline:
                raise PostgresError(f"PostgreSQL did not accept connections within 30 s; see {log}")
            time.sleep(0.3)
        secret = self._secret()
        # on stdin, not the command line: other users can read command lines
        self._sql(
            f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{ROLE}') THEN "
            f"CREATE ROLE {ROLE}; END IF; END $$;\n"
            f"ALTER ROLE {ROLE} WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD '{secret}';"
        )
        if self._sql(f"select 1 from pg_database where datname = '{self.database}'").stdout.strip() != "1":
            self._sql(f'CREATE DATABASE "{self.database}" OWNER {ROLE};')
        else:  # made by an older version, owned by the superuser: hand it and its tables to the role
            self._sql(f'ALTER DATABASE "{self.database}" OWNER TO {ROLE};')
            self._sql(
                "DO $$ DECLARE r record; BEGIN FOR r IN SELECT c.relname FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public' "
                f"AND c.relkind IN ('r', 'S', 'v') AND pg_get_userbyid(c.relowner) <> '{ROLE}' LOOP "
                f"EXECUTE format('ALTER TABLE public.%I OWNER TO {ROLE}', r.relname); END LOOP; END $$;",
                db=self.database,
            )
        self._sql(f'REVOKE ALL ON DATABASE "{self.database}" FROM PUBLIC;')
        return self

    def _secure_hba(self) -> None:
        """Password on TCP, peer on the socket: also for a cluster an older version made with ``trust``."""
        hba = self.data_dir / "pg_hba.conf"
        if self._run("cat", str(hba)).stdout != HBA:
            tmp = self.data_dir / "pg_hba.conf.new"
            self._run("tee", str(tmp), stdin=HBA)
            self._run("mv", str(tmp), str(hba))

    def _secret(self) -> str:
        """The role's password: read from the password file, or generated and written (mode 0600,
        atomically) on first start."""
        if self.passfile.is_file():
            line = self.passfile.read_text().strip()
            return line.rsplit(":", 1)[1]
        secret = secrets.token_urlsafe(24)  # letters, digits, - and _: safe in SQL quotes and the file
        tmp = self.passfile.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"127.0.0.1:*:{self.database}:{ROLE}:{secret}\n")
        os.replace(tmp, self.passfile)
        return secret

    def _sql(self, sql: str, db: str = "postgres", check: bool = True) -> subprocess.CompletedProcess:
        """Run SQL as the superuser over the socket (peer authentication), the statements on stdin."""
        conn = ["-h", str(self.data_dir), "-p", str(self.port), "-U", self.superuser, "-d", db]
        return self._run(find_bin("psql"), *conn, "-X", "-w", "-v", "ON_ERROR_STOP=1", "-tA", check=check, stdin=sql)

    def stop(self) -> None:
        self._run(find_bin("pg_ctl"), "-D", str(self.data_dir), "-m", "fast", "-w", "stop", check=False)

    def __enter__(self) -> PostgresCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
