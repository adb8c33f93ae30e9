"""The OpenAPI schema's error answers (a drf-spectacular postprocessing hook).

Every error the API gives is ``{"code", "detail", ...}`` (``errors.py``); the views declare
their successful answers, and this hook adds to every operation the error answers it can
give, with that body: 400, 401, 403 and 406 to all (bad input, body or query parameters;
every route needs a signed-in account, and many a role; an Accept it cannot answer), 404
where the path names an object or a list has pages, 413 / 415 / 409 to those that write,
422 and 429 to ``POST /api/requests/`` (an idempotency key reused with other parameters;
the rate limit), 503 to all (the database or the results disk unavailable, Retry-After).
An answer a view declares itself keeps its own description.
"""

ERROR_SCHEMA = {
    "type": "object",
    "required": ["code", "detail"],
    "properties": {
        "code": {"type": "string", "description": "stable, machine-readable: request.invalid, budget.exceeded, "
                                                  "auth.failed, not_found, rate.limited, database.unavailable, ..."},
        "detail": {"type": "string", "description": "for people"},
        "errors": {"type": "object", "additionalProperties": True,
                   "description": "per field or parameter, what is wrong with it"},
    },
    "additionalProperties": True,
    "description": "Every error answer. Some codes add fields: a refusal by the gate its budget numbers "
                   "(scope, budget, spent_epsilon, remaining_epsilon), SQL errors `part`.",
}

_ALL = {"400": "bad input (a body's field, a query parameter such as ?wait=, ?rows=, a filter): the reason, "
               "per field under errors (request.invalid, and the engine's, event's and SQL's own codes)",
        "401": "not signed in, or the token is no longer valid (auth.required, auth.failed)",
        "403": "signed in, but this route or object is not for your role (permission.denied)",
        "406": "an Accept header the route cannot answer (request.not_acceptable)",
        "503": "the database or the results disk is unavailable for now (database.unavailable, "
               "storage.full); the Retry-After header says when to try again"}
_WRITES = {"409": "a conflict with the state now: the gate's refusal (budget.exceeded, grant.missing), a "
                  "finished request's cancel, a revoked grant, a dataset not active",
           "413": "the body is larger than the service takes (request.too_large)",
           "415": "a media type the route does not take (request.unsupported_media_type)"}
_OBJECT = {"404": "no such object, or not one you may see (not_found)"}
_PAGE = {"404": "a page past the last (?page=), not_found \"Invalid page.\""}
_SUBMIT = {"422": "an Idempotency-Key used before with other parameters (idempotency.key_reused)",
           "429": "past REQUEST_RATE_LIMIT (rate.limited); Retry-After says when"}


def _either_dataset_view(result) -> None:
    """A dataset as an officer sees it (``OfficerDataset``: where its table came from, its
    hash, the registration) or as an analyst does (``Dataset``): the views answer either,
    by role, where the generated schema named the analyst's only."""
    either = {"anyOf": [{"$ref": "#/components/schemas/OfficerDataset"}, {"$ref": "#/components/schemas/Dataset"}],
              "description": "OfficerDataset to privacy officers, Dataset to analysts"}
    schemas = result.get("components", {}).get("schemas", {})
    if "OfficerDataset" not in schemas:
        return
    page = schemas.get("PaginatedDatasetList", {}).get("properties", {}).get("results")
    if page is not None:
        page["items"] = either
    detail = result.get("paths", {}).get("/api/datasets/{name}/", {}).get("get", {})
    content = detail.get("responses", {}).get("200", {}).get("content", {}).get("application/json")
    if content is not None:
        content["schema"] = either


def add_error_responses(result, generator, request, public):
    _either_dataset_view(result)
    result.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR_SCHEMA
    body = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    for path, operations in result.get("paths", {}).items():
        for method, operation in operations.items():
            codes = dict(_ALL)
            if method in ("post", "put", "patch", "delete"):
                codes.update(_WRITES if method != "delete" else {"409": _WRITES["409"]})
            if "{" in path:
                codes.update(_OBJECT)
            elif method == "get" and any(p.get("name") == "page" for p in operation.get("parameters", [])):
                codes.update(_PAGE)
            if method == "post" and path == "/api/requests/":
                codes.update(_SUBMIT)
            responses = operation.setdefault("responses", {})
            for code, text in codes.items():
                if code not in responses:
                    responses[code] = {"description": text, "content": body}
                else:
                    responses[code].setdefault("content", body)
    return result
