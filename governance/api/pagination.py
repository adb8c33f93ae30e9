from rest_framework.pagination import PageNumberPagination

from ..core.errors import InvalidRequest


class Pagination(PageNumberPagination):
    """?page=N&page_size=M (at most 1000; more is read as 1000). A page_size that is not a
    positive whole number is a 400: DRF ignores it, and a probe's ``page_size=garbage``
    answered the default page as if asked for it."""

    page_size_query_param = "page_size"
    max_page_size = 1000

    def get_page_size(self, request):
        raw = request.query_params.get(self.page_size_query_param)
        if raw is not None and not (raw.isascii() and raw.isdigit() and int(raw) > 0):
            raise InvalidRequest(f"page_size must be a whole number from 1 to {self.max_page_size}.",
                                 errors={"page_size": f"a whole number from 1 to {self.max_page_size}"})
        return super().get_page_size(request)
