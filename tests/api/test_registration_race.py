"""Two registrations of one table under one name at once: the one that fails (an unknown
column in its schema) cleans up its own copy of the file, never the other's. Both copies
had one name (the dataset's and the file's hash): the failing one unlinked it while the
other had stored it but not yet written its row, which then registered an active dataset
without a file (every request failed before the read; ``audit verify`` said ok). The slow
first registration is a delayed ``describe_table``: a larger table widens the window alike."""

import threading
import time

import pytest

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_failed_twin_registration_leaves_the_winners_file(officer, import_dir, monkeypatch, settings):
    from django.db import connection
    from governance.datasets import registry
    from governance.datasets.files import dataset_path
    from tests.conftest import small_frame

    small_frame(2000).to_csv(import_dir / "t.csv", index=False)
    real = registry.describe_table
    b_done = threading.Event()

    def slow_describe(stored, fmt, unit_column, schema, **kwargs):
        out = real(stored, fmt, unit_column, schema, **kwargs)
        if threading.current_thread().name == "A":
            b_done.wait(20)  # A's table read and described; its row not yet written
        return out

    monkeypatch.setattr(registry, "describe_table", slow_describe)
    results = {}

    def reg(tag, schema):
        try:
            results[tag] = registry.register(name="clinic", created_by=officer, path=str(import_dir / "t.csv"),
                                             budget_epsilon=1.0, schema=schema, activate=True)
        except Exception as e:  # noqa: BLE001
            results[tag] = e
        finally:
            if tag == "B":
                b_done.set()
            connection.close()

    a = threading.Thread(target=reg, args=("A", {"age": {"lower": 18, "upper": 90}}), name="A")
    a.start()
    time.sleep(0.5)
    b = threading.Thread(target=reg, args=("B", {"no_such_column": {"lower": 0, "upper": 1}}), name="B")
    b.start()
    a.join(); b.join()
    ds = results["A"]
    assert not isinstance(ds, Exception)
    assert dataset_path(ds).exists(), "the registered (active) dataset's file was deleted by the failed twin"
    assert type(results["B"]).__name__ == "InvalidDataset"
    assert sorted(p.name for p in (settings.DATA_DIR / "datasets").iterdir()) == [ds.file.split("/")[-1]]
