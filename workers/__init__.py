"""Celery workers: ``celery -A workers worker -Q cpu,gpu`` (or ``manage.py worker``)."""

from .celery import app

__all__ = ["app"]
