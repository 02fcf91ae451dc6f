"""Campaigns of runs: what a campaign is (``spec``), its file read, checked and expanded into runs
(``load``), running them with their MLflow bookkeeping (``runs``) through a backend (``backends``:
local processes, Ray tasks, SLURM jobs), the stops an adaptive campaign makes (``adaptive``), the
tracking server a campaign starts and watches (``watch``), and what MLflow's UI opens on for a
campaign (``ui``). Below it: ``runners.tracking`` (MLflow) and ``runners.locks``."""
