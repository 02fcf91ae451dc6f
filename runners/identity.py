"""A run's identity: the fully resolved recipe under a code version, and the build of its embedded
base model. Campaigns key their runs by it, a single run's folder is named by it, and a finished run
is reused only while it is unchanged."""

from __future__ import annotations

import hashlib
import json

from runners.losses import LOSSES
from runners.recipe import Recipe
from runners.task.sizes import BUILD_VERSION, build_key

# The code's part of a run's identity. Bump it when a change alters what a run with the same
# recipe produces (training, evaluation, compute accounting or the embedded base model); a
# finished run is reused only while its recipe and this version are unchanged. Refactors,
# fixes elsewhere and new options that default to the old behaviour leave it alone.
RUN_VERSION = 2

# The first losses' settings: every identity recorded before losses declared their own settings (issue
# 61) holds them, whichever loss ran. Any later loss's settings name a run only where they matter.
FIRST_LOSS_SETTINGS = ("cispo_epsilon_max", "dapo_epsilon", "gspo_epsilon")


def code_version() -> str:
    """The code's part of a run's identity: the run version and the base model's build version."""
    return f"run{RUN_VERSION}-build{BUILD_VERSION}"


def run_key(recipe: Recipe, **context: str) -> str:
    """Identity of a run: hash of the fully resolved recipe (seed included; ``model.build_seed`` only
    when set), ``code_version()``, the build key of its embedded base model (a size names its shape
    and SFT only through it: a size whose SFT changes gives its runs new identities, so no run
    trained on the old build is reused)
    and any context that also names it (a single run's folder)."""
    m = recipe.model
    base = {"base": build_key(m.size, recipe.data.task, m.build_seed)} if m.size else {}
    resolved = recipe.to_dict()
    if m.build_seed is None:  # the key is newer than most runs: left out unset, their identities stay
        del resolved["model"]["build_seed"]
    for key in idle_loss_settings(recipe):  # newer too: left out where they change nothing
        del resolved["algorithm"][key]
    blob = json.dumps({"recipe": resolved, "code": code_version(), **base, **context}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def idle_loss_settings(recipe: Recipe) -> list[str]:
    """The loss settings left out of a run's identity: those of a loss the recipe does not run, at
    their default, other than :data:`FIRST_LOSS_SETTINGS` (so no recorded identity changes, and a
    value that differs from its default still names another run)."""
    a = recipe.algorithm
    return [
        s.key
        for loss in LOSSES.values()
        if loss.name != a.loss
        for s in loss.settings
        if s.key not in FIRST_LOSS_SETTINGS and getattr(a, s.key) == s.default
    ]
