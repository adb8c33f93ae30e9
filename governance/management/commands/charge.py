import json

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = ("Record a release made outside the service, or one a restored database lost, as POST "
            "/api/datasets/{name}/charges/ does: through the gate (refused if it does not fit) and committed at "
            "once, with its audit record. Needs no web service: after a restore, the lost releases are "
            "re-recorded before anyone may ask again (deploy/README.md, Restore).")

    def add_arguments(self, parser):
        parser.add_argument("dataset", help="the dataset's name")
        parser.add_argument("--event", required=True,
                            help='the release\'s mechanism event as JSON, e.g. \'{"kind": "laplace", "epsilon": 0.3}\' '
                                 "(`manage.py compose --help` lists the kinds; an audit export's record carries it)")
        parser.add_argument("--officer", required=True, help="the username of the privacy officer recording it")
        parser.add_argument("--analyst",
                            help="the username of the analyst the release went to: charged to her, under her grant "
                                 "too; without it the charge is the officer's own")
        parser.add_argument("--reference", default="", help="what was released and where (at most 200 characters)")

    def handle(self, *args, dataset, event, officer, analyst=None, reference="", **options):
        from ...api.serializers import ChargeInputSerializer
        from ...core.errors import UserError
        from ...ledger import actions as ledger
        from ...models import Dataset

        ds = Dataset.objects.filter(name=dataset).first()
        if ds is None:
            raise CommandError(f"no dataset named {dataset!r}")
        who = get_user_model().objects.filter(username=officer, is_active=True, is_staff=True).first()
        if who is None:
            raise CommandError(f"no active privacy officer is named {officer!r}")
        try:
            parsed = json.loads(event)
        except ValueError as e:
            raise CommandError(f"--event is not JSON: {e}") from None
        data = ChargeInputSerializer(data={"event": parsed, "reference": reference,
                                           **({"analyst": analyst} if analyst is not None else {})})
        if not data.is_valid():
            raise CommandError("; ".join(f"{k}: {' '.join(map(str, v))}" for k, v in data.errors.items()))
        charged = data.validated_data.get("analyst")
        try:
            entry = ledger.charge(ds, charged or who, data.validated_data["event"],
                                  reference=data.validated_data["reference"], recorded_by=who if charged else None)
        except ledger.GATE_REFUSALS as e:
            raise CommandError(f"refused ({e.code}): {e}") from None
        except UserError as e:
            raise CommandError(f"{e.code}: {e}") from None
        spent = entry.charge.get(ds.policy, {})
        self.stdout.write(f"charged: ledger entry {entry.pk} on {ds.name} to {entry.analyst.get_username()}, "
                          f"{ds.policy} epsilon {spent.get('epsilon')}")
