"""Paths under /api/ that no route matches, answered the API's way whatever DEBUG says.

Django's ``APPEND_SLASH`` redirects ``/api/requests`` to ``/api/requests/``: a client that
follows a redirect turns a POST into a GET (the request is lost, and the list comes back
as if it had been answered), and under DEBUG (the embedded default) Django refuses a
POST it cannot redirect with a 500. Under DEBUG an unmatched path is Django's HTML debug
page, not the JSON 404 of ``errors.page_not_found``. So, before ``CommonMiddleware``: a
path under /api/ that resolves only with its trailing slash is served as with it (same
method, same body), and one that resolves neither way is the JSON 404. With DEBUG off a
path with its slash is left to Django (``handler404`` answers JSON then), so the common
request pays no extra resolve.
"""

from __future__ import annotations

from django.conf import settings
from django.urls import Resolver404, get_resolver

from .errors import page_not_found

PREFIX = "/api/"


def _resolves(path: str, urlconf) -> bool:
    try:
        get_resolver(urlconf).resolve(path)
    except Resolver404:
        return False
    return True


class ApiPaths:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        path = request.path_info
        under = path.startswith(PREFIX) or path == PREFIX[:-1]
        if under and (settings.DEBUG or not path.endswith("/")):
            urlconf = getattr(request, "urlconf", None)
            if not _resolves(path, urlconf):
                if path.endswith("/") or not _resolves(path + "/", urlconf):
                    return page_not_found(request)
                request.path_info, request.path = path + "/", request.path + "/"
        return self.get_response(request)
