"""MLflow around runs: the contract every side reads and writes by (``store``), a local server's
life cycle (``serve``) and its processes (``servers``), a tracked run (``run``: its MLflow run,
the metric sink, training inside it), the shared tracking server (``shared``) on PostgreSQL
(``postgres``) with basic authentication (``auth``), and copying stores between machines
(``transfer``). It knows nothing of campaigns."""
