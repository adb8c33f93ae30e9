"""Reading settings from the environment, healthchecks-style: bad values fail loudly."""

from __future__ import annotations

import os

from django.core.exceptions import ImproperlyConfigured


def envstr(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name, default)


def envsecret(name: str, default: str | None = None) -> str | None:
    """NAME, or the contents of the file named by NAME_FILE (Docker/Kubernetes secrets)."""
    path = os.environ.get(f"{name}_FILE")
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                return f.read().strip()
        except OSError as e:
            raise ImproperlyConfigured(f"{name}_FILE={path!r} cannot be read: {e}") from e
    return os.environ.get(name, default)


def envbool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use true/false)")


def envint(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError as e:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer") from e


def envlist(name: str, default: str = "") -> list[str]:
    raw = os.environ.get(name, default)
    return [item.strip() for item in raw.split(",") if item.strip()]
