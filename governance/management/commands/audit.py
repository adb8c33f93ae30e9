"""``manage.py audit verify`` and ``manage.py audit export``."""

import os
import sys
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from ...audit import export as audit_export, verification

HELP = """
Check and export the audit trail (one hash-chained record per release, refund, refusal
and replay; see governance/ledger/trail.py).

  audit verify [--dataset D ...] [--all]
      Re-hash every record, check each links to the one before, and check the chain
      agrees with the ledger (each final ledger entry has its record with the same event
      and charge; running totals re-compose from the ledger). Prints each chain's head
      hash (file it elsewhere to anchor the chain) and exits 1 naming the first broken
      record, or 0. Warns (exit status unchanged) when RESULTS_DIR holds released files of
      requests the database does not know: a restore from a backup older than them.

  audit export --dataset D [--dataset E ...] --format {json,csv,pdf} [--output FILE [--force]]
      The dataset's records, budget, totals, accounting rules and verification result.
      JSON is re-verifiable by a third party: python tools/recompose_audit.py FILE.
      --dataset all exports every dataset. Without --output, JSON and CSV go to standard
      output; PDF needs --output. An existing FILE is replaced only with --force.
      JSON and CSV are streamed (they do not hold the records); FILE appears only
      once it is whole (written as FILE.part, then renamed).
"""


class Command(BaseCommand):
    help = HELP.strip().splitlines()[0]

    def create_parser(self, prog_name, subcommand, **kwargs):
        from argparse import RawDescriptionHelpFormatter

        parser = super().create_parser(prog_name, subcommand, **kwargs)
        parser.description = HELP
        parser.formatter_class = RawDescriptionHelpFormatter
        return parser

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        v = sub.add_parser("verify", help="check the hash chains and their agreement with the ledger")
        v.add_argument("--dataset", action="append", help="a dataset name (repeatable; default: all)")
        v.add_argument("--all", action="store_true", help="list every problem, not only the first")
        e = sub.add_parser("export", help="export records as JSON, CSV or PDF")
        e.add_argument("--dataset", action="append", required=True, help="a dataset name (repeatable), or all")
        e.add_argument("--format", choices=["json", "csv", "pdf"], default="json")
        e.add_argument("--output", "-o", type=Path, help="file to write (default: standard output; PDF needs it)")
        e.add_argument("--force", action="store_true", help="replace --output if it exists")

    def handle(self, *args, **opts):
        datasets = _datasets(opts.get("dataset"))
        if opts["action"] == "verify":
            return self.verify(datasets, opts["all"])
        return self.export(datasets, opts["format"], opts.get("output"), opts.get("force", False))

    def verify(self, datasets, show_all: bool):
        result = verification.verify(datasets, stop_at_first=not show_all)
        for name, head in result.heads.items():
            self.stdout.write(f"{name}: {head['seq']} records, head {head['hash']}")
        if unknown := unknown_results():
            self.stderr.write(self.style.WARNING(
                f"warning: RESULTS_DIR holds the released files of {len(unknown)} request(s) this database does not "
                f"know, or knows as still queued (e.g. {unknown[0]}): was it restored from a backup older than them? "
                "Their releases are not in the ledger; re-record them, and run `manage.py recover --restored` before "
                "any worker starts (deploy/README.md, Restore)."))
        if result.ok:
            self.stdout.write(self.style.SUCCESS(
                f"ok: {result.records} records in {result.datasets} chain(s) verify and agree with the ledger"))
            return
        first = result.first_broken
        self.stderr.write(f"BROKEN: {first}")
        for problem in result.findings[1:]:
            self.stderr.write(f"also: {problem}")
        sys.exit(1)

    def export(self, datasets, fmt: str, output: Path | None, force: bool = False):
        if fmt == "pdf" and output is None:
            raise CommandError("--format pdf needs --output FILE")
        if fmt == "pdf":
            pieces = iter([audit_export.pdf(datasets)])
        else:  # streamed: the records are not held
            pieces = audit_export.stream(datasets, None, fmt)
        if output is None:
            for piece in pieces:
                self.stdout.write(piece.decode(), ending="")
            return
        if output.is_dir() or not str(output).strip():
            raise CommandError(f"--output {str(output)!r} is not a file name")
        if output.exists() and not force:  # never replace a file by accident
            raise CommandError(f"{output} exists; pass --force to replace it")
        part = output.with_name(output.name + ".part")  # a file that is there is whole
        size = 0
        try:
            output.parent.mkdir(parents=True, exist_ok=True)
            with open(part, "wb") as f:
                for piece in pieces:
                    f.write(piece)
                    size += len(piece)
            if output.exists() and not force:  # it appeared meanwhile
                raise CommandError(f"{output} exists; pass --force to replace it")
            os.replace(part, output)
        except OSError as e:
            raise CommandError(f"cannot write {output}: {e.strerror or e}") from None
        finally:
            part.unlink(missing_ok=True)
        self.stdout.write(f"wrote {output} ({size:,} bytes, {fmt})")


def _datasets(names):
    try:
        return audit_export.datasets_named(names)
    except LookupError as e:
        raise CommandError(str(e)) from e


def unknown_results() -> list[str]:
    """The request ids of RESULTS_DIR's directories that no request of this database has,
    or a request it has as still queued (which never has files), in name order: files
    released after the backup a restored database was made from (the chains verify then:
    only a head filed after the backup, or these, show the loss). Nothing on a host that
    does not hold RESULTS_DIR."""
    from django.conf import settings

    from ...models import Request

    root = Path(settings.RESULTS_DIR)
    try:
        ids = sorted(p.name for p in root.iterdir() if p.is_dir() and _is_uuid(p.name))
    except OSError:
        return []
    known: set[str] = set()
    for i in range(0, len(ids), 500):
        known.update(str(pk) for pk in Request.objects.filter(pk__in=ids[i:i + 500]).exclude(
            status=Request.Status.QUEUED).values_list("pk", flat=True))
    return [i for i in ids if i not in known]


def _is_uuid(name: str) -> bool:
    import uuid

    try:
        return str(uuid.UUID(name)) == name
    except ValueError:
        return False
