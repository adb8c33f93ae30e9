"""Codes from the declared schema and values drawn back inside their bins (encoding.py)."""

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from engines.synthesis import encoding

AGE = {"column": "age", "type": "numeric", "lower": 18.0, "upper": 89.0, "bins": 20, "integer": True}
INCOME = {"column": "income", "type": "numeric", "lower": 0.0, "upper": 500_000.0, "bins": 20, "integer": False}
SITE = {"column": "site", "type": "categorical", "domain": ["north", "south"]}


def test_codes_come_from_the_declared_schema_only():
    df = pd.DataFrame({"age": [10, 18, 50, 89, 200, None], "site": ["north", "south", "east", None, "north", "x"]})
    codes = encoding.encode(df, [AGE, SITE])
    assert list(codes["age"]) == [0, 0, 9, 19, 19, 20]  # clamped to the declared range; null -> 20
    assert list(codes["site"]) == [0, 1, 2, 2, 0, 2]  # outside the domain or null -> 2
    narrow = encoding.encode(df.iloc[1:3], [AGE])["age"]  # the data's own range changes nothing
    assert list(narrow) == [0, 9]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 20), min_size=1, max_size=200), st.integers(0, 2**32 - 1))
def test_decoded_values_fall_back_into_their_bin(codes, seed):
    rng = np.random.default_rng(seed)
    codes = np.array(codes)
    for col in (AGE, INCOME):
        values = encoding.decode({col["column"]: codes}, [col], rng)[col["column"]]
        again = encoding.encode(pd.DataFrame({col["column"]: values}), [col])[col["column"]]
        assert list(again) == list(codes)  # same bin (or null) after the round trip
        if col["integer"]:
            present = values.dropna()
            assert (present == np.floor(present)).all()


def test_the_fine_histogram_shapes_values_inside_a_bin():
    rng = np.random.default_rng(0)
    fine = np.zeros(encoding.fine_size(INCOME))
    fine[0] = 1000.0  # all of bin 0's mass in its first tenth: [0, 2500)
    values = encoding.decode({"income": np.zeros(2000, dtype=int)}, [INCOME], rng, {"income": fine})["income"]
    assert values.max() < 2500
    flat = encoding.decode({"income": np.zeros(2000, dtype=int)}, [INCOME], rng)["income"]
    assert flat.max() > 20_000  # without it: uniform over the bin [0, 25000)
    assert values.nunique() > 1900  # never the bin's midpoint


def test_integer_columns_get_one_fine_cell_per_integer():
    assert encoding.fine_size(AGE) == 72
    x = pd.DataFrame({"age": [18, 18.4, 30, 89, None]})
    assert list(encoding.fine_encode(x, AGE)) == [0, 0, 12, 71]
