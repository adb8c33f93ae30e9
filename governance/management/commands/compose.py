import contextlib
import json
import sys

from django.core.management.base import BaseCommand, CommandError

from accounting import ACCOUNTANTS, work
from accounting.events import EventError, parse_events

from ...core import json_text

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

--dataset NAME composes that dataset's committed releases instead (the events the ledger
stores, non-private parts excepted) at --delta (default: the dataset's delta), and also
prints "ledger_epsilon", the grid figure of the ledger's cost vector (what the gate's
filter and the stored charges use; the ledger's reports show "epsilon" here as rdp's
refined_epsilon).
"""


# A command is run by someone at a shell, not by every analyst at once: a minute by default
# (the API's bound is about one CPU second, ``accounting.work.MAX_UNITS``)
MAX_WORK_SECONDS = 60


def _work(text: str) -> float:
    import argparse
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or value < 0 or value > 10**6:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1e6 seconds, got {text!r}")
    return value


class Command(BaseCommand):
    help = EVENT_HELP.strip().splitlines()[0]

    def create_parser(self, prog_name, subcommand, **kwargs):
        from argparse import RawDescriptionHelpFormatter

        parser = super().create_parser(prog_name, subcommand, **kwargs)
        parser.description = EVENT_HELP
        parser.formatter_class = RawDescriptionHelpFormatter
        return parser

    def add_arguments(self, parser):
        parser.add_argument("file", nargs="?", help="JSON file with a list of events, or - for standard input")
        parser.add_argument("--dataset", help="compose this dataset's committed releases instead of a file")
        parser.add_argument("--accountant", choices=sorted(ACCOUNTANTS), default="rdp",
                            help="composition rule (default rdp)")
        parser.add_argument("--delta", type=float, help="target total delta, in [0, 1) (required with a file)")
        parser.add_argument("--max-work", type=_work, default=MAX_WORK_SECONDS, metavar="SECONDS",
                            help="refuse a file of events whose RDP curves would take more than about this many "
                                 f"CPU seconds, counted before any is computed (default {MAX_WORK_SECONDS}; 0: no "
                                 "bound; POST /api/compose/ allows about 1)")

    def handle(self, *args, file, accountant, delta, dataset=None, max_work=MAX_WORK_SECONDS, **options):
        if (file is None) == (dataset is None):
            raise CommandError("give either a file of events or --dataset NAME")
        if dataset is not None:
            return self._dataset(dataset, accountant, delta)
        if delta is None:
            raise CommandError("--delta is required with a file of events")
        try:
            text = sys.stdin.read() if file == "-" else open(file, encoding="utf-8").read()
        except (OSError, UnicodeDecodeError) as e:
            raise CommandError(f"cannot read {file} as UTF-8 text: {str(e)[:200]}") from None
        try:
            data = json_text.loads(text)
        except ValueError as e:  # not JSON, or past the API's limits (depth, digits, NaN, repeated keys)
            raise CommandError(f"{file} is {e}") from None
        try:
            events = parse_events(data)
            with work.limit(int(max_work * work.MAX_UNITS)) if max_work else contextlib.nullcontext():
                work.charge_grid(events)  # the refinement's zooms are charged as they come
                spent = ACCOUNTANTS[accountant].compose(events, delta)
        except EventError as e:
            raise CommandError(str(e)) from e
        except work.TooCostly as e:
            raise CommandError(f"composing these events needs more than {e.limit:,} work units (--max-work "
                               f"{max_work:g}: about that many CPU seconds); counted before computing: {e.needed:,}, "
                               "nearly all of it one RDP curve per distinct (sample_rate, noise_multiplier) of "
                               "subsampled_gaussian events; pass a larger --max-work (0: no bound)") from None
        out = {"epsilon": spent.epsilon, "delta": spent.delta}
        self._write(out)

    def _write(self, out: dict):
        self.stdout.write(json.dumps({k: (v if v != float("inf") else "inf") for k, v in out.items()}))

    def _dataset(self, name, accountant, delta):
        from accounting import events as ev
        from accounting.costs import Cost
        from ...models import Dataset, LedgerEntry

        ds = Dataset.objects.filter(name=name).first()
        if ds is None:
            raise CommandError(f"no dataset {name!r}")
        delta = ds.budget_delta if delta is None else delta
        entries = LedgerEntry.objects.filter(dataset=ds, status=LedgerEntry.Status.COMMITTED).order_by("id")
        events, cost = [], Cost.zero()
        for entry in entries.only("event", "committed_event", "cost", "committed_cost"):
            event = ev.parse_event(entry.committed_event or entry.event)
            events.append(ev.without_non_private(event) if ev.has_non_private(event) else event)
            cost = cost + Cost.from_json(entry.committed_cost or entry.cost)
        acc = ACCOUNTANTS[accountant]
        try:
            spent = acc.compose(events, delta)
            ledger = acc.spent(cost, delta)
        except EventError as e:
            raise CommandError(str(e)) from e
        self._write({"epsilon": spent.epsilon, "delta": spent.delta, "ledger_epsilon": ledger.epsilon,
                     "releases": len(events)})
