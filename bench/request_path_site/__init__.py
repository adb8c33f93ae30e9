"""Bench-only Django settings, URLs and a Celery task for bench/bench_request_path.py.

Loaded only by that benchmark (``DJANGO_SETTINGS_MODULE=request_path_site.settings`` with
bench/ on ``PYTHONPATH``): the production URLconf and settings never include the two
baseline endpoints and the no-op task defined here.
"""
