"""Where the project's MLflow store is, from any working folder: a notebook's kernel starts in the
notebook's folder (``analysis/``), ``jupyter nbconvert`` wherever it is called."""

from __future__ import annotations

import os
from pathlib import Path

from runners.tracking.store import DEFAULT_STORE, StoreError, existing_store

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def find_store(start: Path | None = None, root: Path = PROJECT_ROOT) -> str:
    """The tracking URI to read: ``MLFLOW_TRACKING_URI`` when set, else the ``mlflow.db`` nearest
    above ``start`` (the working folder), else the project's own (``root``); an error that says what
    to set when there is none."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return existing_store(uri)
    start = (start or Path.cwd()).resolve()
    for folder in (start, *start.parents, root):
        if (folder / DEFAULT_STORE).is_file():
            return existing_store(f"sqlite:///{folder / DEFAULT_STORE}")
    raise StoreError(
        f"no MLflow store: no {DEFAULT_STORE} in {start}, the folders above it, or the project ({root}). Run a"
        f" campaign in the project first (make ablation), or set MLFLOW_TRACKING_URI before starting Jupyter:"
        f" MLFLOW_TRACKING_URI=sqlite:////path/to/{DEFAULT_STORE} for a file, http://127.0.0.1:5001 for a server"
    )
