"""MLflow around runs: the contract every side reads and writes by (``store``), a local server's
life cycle (``mlflow_server``) and its processes (``server_processes``), a tracked run (``run``: its MLflow run,
the metric sink, training inside it), the shared tracking server (``shared``) on PostgreSQL
(``postgres``) with basic authentication (``auth``), and copying stores between machines
(``transfer``). It knows nothing of campaigns."""
