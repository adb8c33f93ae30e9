"""client/ is a package of its own: it builds into a wheel with few dependencies, typed, and
imports from that wheel alone, without Django or anything else of this repository."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    build = tmp_path_factory.mktemp("build")
    # --no-build-isolation: setuptools from this venv, no index needed
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                    "-w", str(out), str(ROOT / "client")], check=True, cwd=build,
                   env={"PATH": "/usr/bin:/bin", "PIP_NO_INDEX": "1", "HOME": str(build)})
    for leftover in ("build", "privacy_client.egg-info"):  # setuptools builds in the source tree
        subprocess.run(["rm", "-rf", str(ROOT / "client" / leftover)], check=True)
    (whl,) = out.glob("privacy_client-*.whl")
    return whl


def test_the_wheel_holds_the_typed_package_and_few_dependencies(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"privacy_client/__init__.py", "privacy_client/client.py", "privacy_client/errors.py",
            "privacy_client/py.typed"} <= names
    (meta,) = [n for n in names if n.endswith("METADATA")]
    text = zipfile.ZipFile(wheel).read(meta).decode()
    requires = sorted(line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:"))
    assert requires == ['duckdb>=1.0; extra == "dummy"', 'ipywidgets>=8; extra == "progress"', "pandas>=1.5",
                        "pyarrow>=12", "requests>=2.28", 'tqdm>=4.60; extra == "progress"']
    entry = [n for n in names if n.endswith("entry_points.txt")]
    assert entry and "privacy-client = privacy_client.cli:main" in zipfile.ZipFile(wheel).read(entry[0]).decode()


def test_it_imports_from_the_wheel_without_django_or_this_repository(wheel, tmp_path):
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import privacy_client as pc; "
            "assert pc.__file__.startswith(sys.argv[1]), pc.__file__; "
            "assert not [m for m in sys.modules if m.split('.')[0] in ('django', 'governance', 'engines')]; "
            "print(pc.__version__, pc.Client('http://x').url)")
    out = subprocess.run([sys.executable, "-c", code, str(wheel)], cwd=tmp_path, capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0.1.0", "http://x"]
