"""The bridge from Django models to the engines' plain types."""

from engines.types import DatasetMeta

from ..models import Dataset


def dataset_meta(ds: Dataset) -> DatasetMeta:
    return DatasetMeta(name=ds.name, columns=ds.columns, unit_column=ds.unit_column or None,
                       n_rows=ds.n_rows, n_units=ds.n_units, delta=ds.budget_delta,
                       allow_pld=ds.pld_certification)
