"""privacy_client: the analyst's Python client for the privacy-budget governance service.

Five lines from a token to a DataFrame::

    from privacy_client import Client
    client = Client("http://localhost:8000", token="...")
    print(client.datasets_frame())
    result = client.sql('SELECT gender, AVG(realrinc) FROM "gss-wages" GROUP BY gender', epsilon=0.2)
    result.df        # value, ci_low, ci_high per group

See ``Client`` for every call and ``privacy_client.errors`` for the typed errors.
"""

from .client import Client, PlaintextWarning
from .errors import (
    ApiError,
    AuthenticationError,
    BudgetExceeded,
    Conflict,
    IdempotencyKeyReused,
    InvalidRequest,
    NotFound,
    PermissionDenied,
    RateLimited,
    RequestFailed,
    RequestTooLarge,
    ServerError,
    ServerTimeout,
    ServerUnreachable,
    SqlError,
    SqlUnsupported,
    UnsupportedMediaType,
    WaitTimeout,
)
from .results import Dataset, Estimate, Result
from .waiting import Backoff

__version__ = "0.1.0"
__all__ = [
    "ApiError", "AuthenticationError", "Backoff", "BudgetExceeded", "Client", "Conflict", "Dataset", "Estimate",
    "IdempotencyKeyReused", "InvalidRequest", "NotFound", "PermissionDenied", "PlaintextWarning", "RateLimited", "RequestFailed",
    "RequestTooLarge", "Result", "ServerError", "ServerTimeout", "ServerUnreachable", "SqlError", "SqlUnsupported",
    "UnsupportedMediaType", "WaitTimeout",
]
