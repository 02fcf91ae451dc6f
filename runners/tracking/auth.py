"""MLflow's basic authentication for the shared tracking server (``make tracking-server AUTH=1``).

``BasicAuth(folder).prepare()`` generates the admin's password once (like PostgreSQL's secret:
``secrets.token_urlsafe``, written atomically with mode 0600) into ``credentials.env``, a file a
client sources to send it (``MLFLOW_TRACKING_USERNAME`` and ``MLFLOW_TRACKING_PASSWORD``, which
MLflow's client and every process a campaign starts read from the environment). Users and their
permissions live in a SQLite file beside it (``auth.db``, 0600), MLflow's config in ``auth.ini``;
the folder itself is 0700. The password reaches the server in its environment, never on a command
line. MLflow creates the admin user on the first start and keeps it: the file and the database
belong together.
"""

from __future__ import annotations

import importlib.util
import os
import secrets
from pathlib import Path

from runners.tracking.server_processes import ServerError

USER = "admin"
# How long a worker trusts a credential it has checked. Each check is a deliberately slow password
# hash, ~0.3 s of server CPU a request on 2 cores without the cache: three tiny campaign runs at once
# through basic-auth took 110 s, 37 s with it. A password changed or a user deleted through one
# worker still gets in through the others for up to this long (MLflow's basic_auth.ini).
CACHE_SECONDS = 300


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` with mode 0600, atomically."""
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


class BasicAuth:
    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder).resolve()

    @property
    def credentials(self) -> Path:
        """``MLFLOW_TRACKING_USERNAME=...`` and ``MLFLOW_TRACKING_PASSWORD=...``, for ``set -a; . FILE``."""
        return self.folder / "credentials.env"

    @property
    def database(self) -> Path:
        return self.folder / "auth.db"

    @property
    def config(self) -> Path:
        return self.folder / "auth.ini"

    def prepare(self) -> BasicAuth:
        """Check MLflow's auth extra is installed; write the credentials (first time), the config
        and an empty 0600 user database for MLflow to fill."""
        if importlib.util.find_spec("flask_wtf") is None:
            raise ServerError(
                "--auth needs MLflow's auth extra (Flask-WTF): `make setup` installs the pinned one "
                "(or pip install -r requirements.lock)"
            )
        self.folder.mkdir(parents=True, exist_ok=True)
        os.chmod(self.folder, 0o700)
        if not self.credentials.is_file():
            if self.database.is_file() and self.database.stat().st_size > 0:
                raise ServerError(
                    f"{self.database} holds MLflow's users but their credentials file {self.credentials} "
                    f"is gone: restore it, or delete {self.database} to start over with a new password"
                )
            _write_private(
                self.credentials,
                "# MLflow credentials of the tracking server (written by python -m runners tracking-server "
                "--auth)\n# use: set -a; . THIS_FILE; set +a\n"
                f"MLFLOW_TRACKING_USERNAME={USER}\nMLFLOW_TRACKING_PASSWORD={secrets.token_urlsafe(24)}\n",
            )
        _write_private(
            self.config,
            "[mlflow]\n"
            "default_permission = READ\n"
            f"database_uri = sqlite:///{self.database}\n"
            f"admin_username = {USER}\n"
            "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
            f"auth_cache_ttl_seconds = {CACHE_SECONDS}\n",
        )
        if not self.database.exists():  # SQLite keeps the mode of an existing file (and gives it to its journal)
            os.close(os.open(self.database, os.O_WRONLY | os.O_CREAT, 0o600))
        return self

    def client_env(self) -> dict[str, str]:
        """``MLFLOW_TRACKING_USERNAME`` and ``MLFLOW_TRACKING_PASSWORD`` from the credentials file."""
        lines = self.credentials.read_text().splitlines()
        return dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))

    def server_env(self) -> dict[str, str]:
        """The environment of ``mlflow server --app-name basic-auth``: its config, the admin's
        password (used on the first start only) and a fresh secret key for its sign-up form."""
        return {
            "MLFLOW_AUTH_CONFIG_PATH": str(self.config),
            "MLFLOW_AUTH_ADMIN_USERNAME": USER,
            "MLFLOW_AUTH_ADMIN_PASSWORD": self.client_env()["MLFLOW_TRACKING_PASSWORD"],
            "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(32),
        }
