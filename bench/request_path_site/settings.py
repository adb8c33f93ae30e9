"""The service's settings, plus the baselines' URLconf and task module (benchmark only)."""

from governance.settings import *  # noqa: F401,F403

ROOT_URLCONF = "request_path_site.urls"
CELERY_IMPORTS = ("request_path_site.tasks",)
BENCH_TABLE = "bench_request_path_row"  # created by the benchmark, not by a migration
