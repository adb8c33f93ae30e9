"""``manage.py generateschema``: the OpenAPI schema, as ``manage.py spectacular`` writes it.

Django REST framework's own command of this name uses DRF's schema generator, which the
service's views (documented with drf-spectacular) do not support: it ended in a TypeError.
"""

from django.core.management import call_command
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = ("Write the service's OpenAPI schema (YAML; --format openapi-json for JSON) to standard output or "
            "--file: the same as `manage.py spectacular`, which takes more options.")

    def add_arguments(self, parser):
        parser.add_argument("--format", choices=["openapi", "openapi-json"], default="openapi")
        parser.add_argument("--file", help="write to this file instead of standard output")

    def handle(self, *args, **options):
        kwargs = {"format": options["format"]}
        if options["file"]:
            kwargs["file"] = options["file"]
        call_command("spectacular", **kwargs, stdout=self.stdout, stderr=self.stderr)
