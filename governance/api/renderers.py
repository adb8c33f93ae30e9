"""The API's JSON renderer: DRF's, strict, with one way out for numbers JSON cannot hold.

A body that holds NaN or an infinity (an error saying the spend under a new delta would be
infinite, a report of a non-private release) made DRF's strict renderer raise, so the
answer became a 500. Such a number is written as the string "NaN", "Infinity" or
"-Infinity" instead. Bodies without one render exactly as before; the walk over the data
happens only after the strict rendering failed.
"""

from __future__ import annotations

import math

from rest_framework.renderers import JSONRenderer


def finite_json(data):
    """``data`` with every non-finite float replaced by its name as a string."""
    if isinstance(data, float) and not math.isfinite(data):
        return "NaN" if math.isnan(data) else ("Infinity" if data > 0 else "-Infinity")
    if isinstance(data, dict):
        return {k: finite_json(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [finite_json(v) for v in data]
    return data


class SafeJSONRenderer(JSONRenderer):
    def render(self, data, accepted_media_type=None, renderer_context=None):
        try:
            return super().render(data, accepted_media_type, renderer_context)
        except ValueError:  # "Out of range float values are not JSON compliant"
            return super().render(finite_json(data), accepted_media_type, renderer_context)
