"""The bridge from Django models to the engines' plain types."""

from engines.types import DatasetMeta

from ..models import Dataset


def dataset_meta(ds: Dataset) -> DatasetMeta:
    if ds.execution == Dataset.Execution.FEDERATED:  # its sites, with their public row counts
        from engines.federated.types import FederatedDatasetMeta

        from .federated import site_rows

        return FederatedDatasetMeta(name=ds.name, columns=ds.columns, unit_column=None, n_rows=ds.n_rows,
                                    n_units=ds.n_units, delta=ds.budget_delta, allow_pld=ds.pld_certification,
                                    sites=site_rows(ds))
    return DatasetMeta(name=ds.name, columns=ds.columns, unit_column=ds.unit_column or None,
                       n_rows=ds.n_rows, n_units=ds.n_units, delta=ds.budget_delta,
                       allow_pld=ds.pld_certification,
                       distributed=ds.execution == Dataset.Execution.DISTRIBUTED)
