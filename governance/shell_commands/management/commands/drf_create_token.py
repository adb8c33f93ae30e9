"""``manage.py drf_create_token NAME [-r]``: Django REST framework's command, through the
service's own token rules (``governance.core.tokens``). DRF's printed the live token of an
account that had one (tokens are shown once, when issued) and, with ``-r``, replaced it
while the web sessions opened with the old one stayed signed in, where they could issue
themselves a new token and lock out the officer's (a probe's)."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from governance.core import tokens


class Command(BaseCommand):
    help = ("Issue an API token for an analyst, auditor or officer and print it (shown this once). An account "
            "that has a token gets a new one only with -r, which ends the old token and the web sessions "
            "opened with it, as POST /api/analysts/{id}/token/ does.")

    def add_arguments(self, parser):
        parser.add_argument("username", type=str)
        parser.add_argument("-r", "--reset", action="store_true", dest="reset_token",
                            help="replace the account's token: the old one and its web sessions stop working")

    def handle(self, *args, username, reset_token, **options):
        user_model = get_user_model()
        try:
            user = user_model._default_manager.get_by_natural_key(username)
        except user_model.DoesNotExist:
            raise CommandError(f"Cannot create the token: user {username} does not exist") from None
        if not user.is_active:
            raise CommandError(f"{username} is deactivated: a token would not work; reactivate the account first")
        held = tokens.current(user)
        if held is not None and not reset_token:
            raise CommandError(f"{username} already has a token (issued {held.created:%Y-%m-%d %H:%M} UTC), never "
                               "shown again; -r issues a new one and ends the old one and its web sessions")
        token = tokens.issue(user)
        self.stdout.write(f"Generated token {token.key} for user {username}")
