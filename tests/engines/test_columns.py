"""engines/columns.py: the null count registration and the distributed profile share."""

import math

import pyarrow as pa

from engines.columns import null_count


def test_nulls_and_nan_count_and_nothing_else_does():
    assert null_count(pa.array([1, None, 3, None])) == 2
    assert null_count(pa.array([1.0, math.nan, None, -0.0, math.inf])) == 2  # NaN and null; -0.0 and inf are values
    assert null_count(pa.array(["a", None, "NaN"])) == 1  # the text "NaN" is a value
    assert null_count(pa.chunked_array([[math.nan, 1.0], [None, math.nan]])) == 3
    assert null_count(pa.array([], type=pa.float64())) == 0
