#!/usr/bin/env python
"""Django's command-line utility for the privacy-budget governance service."""
import os
import sys


def main():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "governance.settings")
    from django.core.management import execute_from_command_line

    try:
        execute_from_command_line(sys.argv)
    except BrokenPipeError:  # `manage.py audit export ... | head`: the reader has gone, a quiet end
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (Python flushes stdout at exit)
        sys.exit(141)  # 128 + SIGPIPE, as a shell reports a command ended by it


if __name__ == "__main__":
    main()
