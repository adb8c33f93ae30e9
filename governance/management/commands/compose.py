import json
import sys

from django.core.management.base import BaseCommand, CommandError

from accounting import ACCOUNTANTS
from accounting.events import EventError, parse_events

EVENT_HELP = """
Compose a JSON list of mechanism events and print {"epsilon": ..., "delta": ...}.

Event format (one JSON object per event; numbers finite):
  {"kind": "laplace", "epsilon": 0.1}
  {"kind": "laplace", "scale": 10, "sensitivity": 1}          epsilon = sensitivity/scale
  {"kind": "gaussian", "noise_multiplier": 4.0}                std / L2 sensitivity
  {"kind": "gaussian", "noise_multiplier": 4.0, "delta": 1e-7} delta charged under basic/advanced
  {"kind": "subsampled_gaussian", "sample_rate": 0.004, "noise_multiplier": 1.1, "steps": 3000}
  {"kind": "epsilon_delta", "epsilon": 0.5, "delta": 1e-6}     any (epsilon, delta)-DP release
  {"kind": "self_composed", "event": {...}, "count": 10}
  {"kind": "composed", "events": [{...}, {...}]}
  {"kind": "no_op"}   {"kind": "non_private"}

Gaussian-type events without a "delta" share the accountant's delta pool equally
(basic: all of --delta; advanced: half of it, the other half is delta'); rdp needs none.
rdp is plain composition of the fixed list: the best order is refined off the ledger's
grid (accounting/refine.py), so it can be below what the ledger reports for the same events.
"""


class Command(BaseCommand):
    help = EVENT_HELP.strip().splitlines()[0]

    def create_parser(self, prog_name, subcommand, **kwargs):
        from argparse import RawDescriptionHelpFormatter

        parser = super().create_parser(prog_name, subcommand, **kwargs)
        parser.description = EVENT_HELP
        parser.formatter_class = RawDescriptionHelpFormatter
        return parser

    def add_arguments(self, parser):
        parser.add_argument("file", help="JSON file with a list of events, or - for standard input")
        parser.add_argument("--accountant", choices=sorted(ACCOUNTANTS), default="rdp",
                            help="composition rule (default rdp)")
        parser.add_argument("--delta", type=float, required=True, help="target total delta, in [0, 1)")

    def handle(self, *args, file, accountant, delta, **options):
        try:
            text = sys.stdin.read() if file == "-" else open(file, encoding="utf-8").read()
        except OSError as e:
            raise CommandError(f"cannot read {file}: {e}") from e
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise CommandError(f"{file} is not JSON: {e}") from e
        try:
            events = parse_events(data)
            spent = ACCOUNTANTS[accountant].compose(events, delta)
        except EventError as e:
            raise CommandError(str(e)) from e
        out = {"epsilon": spent.epsilon, "delta": spent.delta}
        self.stdout.write(json.dumps({k: (v if v != float("inf") else "inf") for k, v in out.items()}))
