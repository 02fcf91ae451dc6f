"""A campaign's base models in its store: which weights its runs start from, one set per build, shared
and never mixed.

- **Recorded.** Every tracked run carries the sha256 of the weights it starts from
  (``store.BASE_WEIGHTS``, with the build's name in ``store.BASE_MODEL``: ``tag_run``); a campaign's
  parent run holds, per build it uses, the weights its runs of that build started from
  (``store.BASE_WEIGHTS_OF`` + name).
- **Shared.** The campaign logs each build it uses, whole, as an artifact of its parent run
  (``base-models/NAME``: ``publish``). A machine or node whose cache lacks it takes that copy
  (``fetch``) instead of building its own: GPU builds of one key are not the same weights.
- **Never mixed.** A cache that holds other weights under a build its campaign's runs used is
  refused in one line naming both hashes and the ways on (``BaseModelMismatch``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from runners.recipe import Recipe
from runners.runfolder import RunFolderError
from runners.task.weights import base_weights, weights_sha256
from runners.tracking import store


class BaseModelMismatch(RunFolderError):
    """The base model a run would start from is not the one its campaign's runs used; one line with the fix."""


def short(sha: str) -> str:
    """A weight hash as tables and messages show it."""
    return sha[:12]


def recorded(client: MlflowClient, parent: Run, runs: list[Run], name: str) -> str | None:
    """The weights the campaign's runs of build ``name`` started from: its parent run's record, else
    the tag of any of its runs that started from that build (runs tracked before the parent recorded it)."""
    tags = client.get_run(parent.info.run_id).data.tags
    if (sha := tags.get(store.BASE_WEIGHTS_OF + name)) is not None:
        return sha
    return next(
        (
            r.data.tags[store.BASE_WEIGHTS]
            for r in runs
            if r.data.tags.get(store.BASE_MODEL) == name and store.BASE_WEIGHTS in r.data.tags
        ),
        None,
    )


def mismatch(name: str, had: str, have: str, where: Path) -> BaseModelMismatch:
    """The one-line refusal: a build whose weights here differ from those the campaign's runs used."""
    return BaseModelMismatch(
        f"base model {name}: this campaign's runs started from weights {short(had)}, but {where} holds weights "
        f"{short(have)} (built again, or on another machine: GPU builds of one key differ); bring the original "
        "base model (a copy of the store holds it: make import SRC=THAT_STORE ARTIFACTS=ITS_ARTIFACTS, or copy "
        f"that folder from the machine that built it), or run these runs as a new campaign (another name)"
    )


def fetch(client: MlflowClient, parent_id: str, name: str, dest: Path, sha: str) -> bool:
    """Put the copy of build ``name`` that the campaign logged (``publish``) into the cache folder
    ``dest``, whole or not at all, after checking it holds weights ``sha``; False when the store has
    no copy."""
    artifact = f"{store.BASE_MODELS_DIR}/{name}"
    if not any(a.path.endswith("build_info.json") for a in client.list_artifacts(parent_id, artifact)):
        return False
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f"{dest.name}.fetch{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        got = Path(client.download_artifacts(parent_id, artifact, str(tmp)))
        have = base_weights(got)
        if have != sha:
            raise mismatch(name, sha, have, Path(f"the store's copy ({artifact})"))
        if not dest.exists():
            got.rename(dest)  # whole: a kill mid-download leaves only the temporary folder
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return True


def publish(client: MlflowClient, parent_id: str, path: Path) -> None:
    """Log build ``path`` as an artifact of the campaign's parent run, once (other machines and
    nodes ``fetch`` it). Its ``build_info.json`` goes last: a copy that has one is whole, and an upload
    a kill cut short is made again by the next run of the campaign."""
    artifact = f"{store.BASE_MODELS_DIR}/{path.name}"
    if any(a.path.endswith("build_info.json") for a in client.list_artifacts(parent_id, artifact)):
        return
    with tempfile.TemporaryDirectory(prefix="base-model-") as tmp:  # a copy in this process's modes: a
        copy = Path(tmp) / path.name  # local artifact store copies a file's mode, and the cache's may be 0644
        shutil.copytree(path, copy, copy_function=shutil.copyfile)
        for f in sorted(copy.iterdir()):
            if f.is_dir():
                client.log_artifacts(parent_id, str(f), f"{artifact}/{f.name}")
            elif f.name != "build_info.json":
                client.log_artifact(parent_id, str(f), artifact)
        client.log_artifact(parent_id, str(copy / "build_info.json"), artifact)


def tag_run(client: MlflowClient, run_id: str, name: str, sha: str) -> None:
    """Record on a run the base model it starts from: the build's name and its weights' sha256."""
    client.set_tag(run_id, store.BASE_MODEL, name)
    client.set_tag(run_id, store.BASE_WEIGHTS, sha)


def ready(client: MlflowClient, run_id: str, recipe: Recipe, log=print) -> tuple[str, str]:
    """The base model a tracked run starts from, made ready: its name and weights' sha256. A
    campaign's run (``store.EXPECTED_WEIGHTS`` in its environment) never builds one of its own: a
    cache without it takes the campaign's logged copy, and a cache with other weights is refused."""
    m = recipe.model
    if m.size is None:
        return str(m.path), weights_sha256(m.path)
    from runners.task.basemodel import ensure_base_model  # noqa: PLC0415 - torch: the trainer's process

    path = recipe.base_model()
    expected = os.environ.get(store.EXPECTED_WEIGHTS)
    if expected and not (path / "build_info.json").is_file():
        parent = client.get_run(run_id).data.tags.get("mlflow.parentRunId")
        if not parent or not fetch(client, parent, path.name, path, expected):
            raise BaseModelMismatch(
                f"base model {path.name}: not in this machine's cache ({path.parent}), and the campaign's store holds "
                f"no copy of its weights {short(expected)}; a run never builds its own (its weights would differ): "
                "give this machine the campaign's cache folder (PRL_CACHE), or run the campaign where it was built"
            )
        log(f"base model {path.name}: the campaign's own (weights {short(expected)}), from its store")
    path = ensure_base_model(m.size, recipe.data.task, build_seed=m.build_seed, log=log)
    have = base_weights(path)
    if expected and have != expected:
        raise mismatch(path.name, expected, have, path)
    return path.name, have
