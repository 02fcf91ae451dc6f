"""Operations around runs: campaigns (schema and LOO expansion, MLflow bookkeeping, the local and Ray
schedulers, adaptive stops), the MLflow contract (``store``) and run tracking, the PostgreSQL-backed
tracking server, copying stores between machines, and wheels for offline machines."""
