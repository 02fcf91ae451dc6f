"""The backend protocol (runners/campaign/backends): a backend that leaves out a member is refused, the
registry's names are the only ``backend:`` values a campaign takes (one line listing them), each
backend's keys are parsed into its typed settings, and a new backend is one module, as
docs/extending.md writes it: its code block, found by the registry in the backends folder, runs
a real campaign."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from runners.campaign import backends
from runners.campaign.backends import Backend, Ended, Launch, register, registered, unregister
from runners.campaign.load import load_campaign
from runners.campaign.runs import run_campaign
from runners.campaign.spec import BackendSettings, CampaignError
from tests.campaigns import history_steps, write_campaign
from tests.conftest import documented_module

ROOT = Path(__file__).resolve().parents[1]
MEMBERS = ("check", "submit", "placement", "poll", "cancel")


@pytest.fixture
def registry():
    """The registry as it was, back after the test (a test registers backends of its own)."""
    before = registered()
    yield
    for name in registered().keys() - before.keys():
        unregister(name)


def _complete(**without: object) -> type[Backend]:
    """A backend class with every member, less those in ``without``."""
    body = {m: (lambda self, *a: []) for m in MEMBERS if m not in without}
    return type("Partial", (Backend,), {"name": "partial", "settings_class": BackendSettings, **body})


@pytest.mark.parametrize("member", MEMBERS)
def test_a_backend_that_leaves_out_a_member_is_refused_when_it_registers(registry, member):
    with pytest.raises(TypeError, match=f"backend 'partial' is incomplete: it needs {member}"):
        register(_complete(**{member: None}))
    assert "partial" not in registered()
    register(_complete())  # with every member it registers
    assert "partial" in registered()


def test_the_builtin_backends_implement_the_protocol_and_own_their_keys():
    found = registered()
    assert sorted(found) == ["local", "ray", "slurm"]
    for name, cls in found.items():
        assert cls.name == name and issubclass(cls, Backend) and not cls.__abstractmethods__, name
        assert issubclass(cls.settings_class, BackendSettings) and "max_retries" in cls.settings_class.keys
    local_keys = ("parallel", "runs_per_gpu", "gpus_per_run", "max_retries", "builds_at_once")
    assert found["local"].settings_class.keys == local_keys
    assert found["ray"].settings_class.keys == ("ray_address", "gpus_per_run", "max_retries")
    assert found["slurm"].settings_class.keys == ("slurm", "max_retries")


def test_a_campaign_carries_its_backends_settings_typed(tmp_path):
    local = load_campaign(write_campaign(tmp_path / "l.yaml", "l", 4, {}, parallel=3, max_retries=1))
    assert (local.backend, local.backend_settings.parallel, local.backend_settings.max_retries) == ("local", 3, 1)
    ray = load_campaign(write_campaign(tmp_path / "r.yaml", "r", 4, {}, backend="ray", ray_address="auto"))
    assert (ray.backend_settings.ray_address, ray.backend_settings.gpus_per_run) == ("auto", 1)
    slurm = load_campaign(write_campaign(tmp_path / "s.yaml", "s", 4, {}, backend="slurm", slurm={"time": 60}))
    assert (slurm.backend_settings.time, slurm.backend_settings.max_retries) == (60, 3)
    assert not hasattr(local, "parallel") and not hasattr(slurm, "slurm")  # not flattened into the campaign


@pytest.mark.parametrize(
    "extra,msg",
    [
        ({"backend": "kubernetes"}, "backend = 'kubernetes'; choose local, ray or slurm"),
        ({"parallel": 0}, "parallel = 0: expected a whole number >= 1"),
        ({"backend": "ray", "max_retries": -1}, "max_retries = -1: expected a whole number >= 0"),
        ({"backend": "ray", "ray_address": 6379}, "ray_address = 6379: expected auto, HEAD:6379"),
        ({"ray_address": ""}, "ray_address = '': expected auto"),  # another backend's key is checked too
    ],
)
def test_a_bad_backend_is_one_line_naming_the_fix(tmp_path, cli, extra, msg):
    path = write_campaign(tmp_path / "bad.yaml", "bad", 4, {}, **extra)
    with pytest.raises(CampaignError, match=re.escape(f"{path}: {msg}")):
        load_campaign(path)
    r = cli("runners", "campaign", str(path), "--dry-run")
    assert r.returncode == 2 and r.stderr.startswith(f"error: {path}: {msg}") and len(r.stderr.splitlines()) == 1


def test_an_unknown_backend_lists_every_registered_one(tmp_path, registry):
    register(_complete())
    path = write_campaign(tmp_path / "bad.yaml", "bad", 4, {}, backend="k8s")
    with pytest.raises(CampaignError, match=r"backend = 'k8s'; choose local, partial, ray or slurm$"):
        load_campaign(path)


class _Failing(Backend):
    """A backend whose runs fail at once: the loop reports them with their log's tail."""

    name = "failing"
    settings_class = BackendSettings

    def check(self) -> None:
        pass

    def submit(self, launch: Launch) -> None:
        self.ended = [*getattr(self, "ended", []), Ended(launch.spec, False, "line 1\nTheError: why")]

    def placement(self, launch: Launch) -> str:
        return " nowhere"

    def poll(self) -> list[Ended]:
        out, self.ended = getattr(self, "ended", []), []
        return out

    def cancel(self) -> None:
        pass


def _documented_backend(tmp_path: Path) -> str:
    """docs/extending.md's backend module, as the page writes it, in a folder of the backends package."""
    return str(documented_module(tmp_path, "## Adding a backend", "more-backends", "serial.py"))


@pytest.mark.slow
def test_the_documented_backend_runs_a_campaign(store, tmp_path, monkeypatch, registry):
    """The page's module, dropped into the backends folder and nothing else changed: the registry
    finds it, the campaign takes ``backend: serial`` and its key, the run trains to the end and its
    failures come back through the same loop."""
    monkeypatch.setattr(backends, "__path__", [*backends.__path__, _documented_backend(tmp_path)])
    monkeypatch.delitem(sys.modules, "runners.campaign.backends.serial", raising=False)
    registered(rescan=True)
    bad = write_campaign(tmp_path / "bad.yaml", "tiny-serial", 2, {}, backend="serial", nice=42)
    with pytest.raises(CampaignError, match="nice = 42: expected a whole number from 0 to 19"):
        load_campaign(bad)
    path = write_campaign(tmp_path / "serial.yaml", "tiny-serial", 2, {}, backend="serial", nice=5)
    said: list[str] = []
    summary = run_campaign(path, log=said.append)
    assert "serial" in registered() and not summary["failures"] and summary["ran"] == 1, "\n".join(said)
    assert any(re.match(r"\[1/1\] start baseline seed 0 \(nice 5\)$", m) for m in said), said
    client = MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name("tiny-serial").experiment_id], "tags.`prl.run_id` != ''")
    assert run.data.tags["prl.done"] == "1" and run.data.tags["prl.placement"].startswith("serial on ")
    assert history_steps(client, run.info.run_id, "train/loss") == [1, 2]

    register(_Failing)
    failing = write_campaign(tmp_path / "failing.yaml", "tiny-failing", 2, {}, backend="failing")
    said.clear()
    summary = run_campaign(failing, log=said.append)
    ((spec, why),) = summary["failures"]
    assert spec.variant == "baseline" and why.endswith("TheError: why")
    assert "[1/1] start baseline seed 0 nowhere" in said and "[1/1] FAILED baseline seed 0: TheError: why" in said


def test_a_campaign_started_on_some_gpus_runs_its_runs_on_those():
    """Measured on a 2 x H200 machine (issue 44's study): a campaign started with
    CUDA_VISIBLE_DEVICES=1 placed its runs on GPU 0, beside another campaign's, because each run was
    given its index among the visible GPUs (``0``) as its own CUDA_VISIBLE_DEVICES."""
    from runners.campaign.backends.local import visible_ids

    assert visible_ids("1", 1) == ["1"]
    assert visible_ids("2, 3", 2) == ["2", "3"]
    assert visible_ids("GPU-3b20,GPU-53ec", 2) == ["GPU-3b20", "GPU-53ec"]  # UUIDs pass through
    assert visible_ids("0,7", 1) == ["0"]  # CUDA stops at an entry it cannot use: as many as it sees
    assert visible_ids("", 0) == [] and visible_ids(None, 2) == ["0", "1"]  # no GPU; unset: every GPU
