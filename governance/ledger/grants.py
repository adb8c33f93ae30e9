"""Grants as an officer changes them: given (or given again after a revocation), their cap
changed, revoked. Each change is a ``grant`` record in the dataset's audit chain naming the
officer, the analyst and the cap before and after, written in the change's transaction
under the dataset's budget row lock (the gate's lock, taken first as the gate takes it),
so the trail tells who could spend on a dataset, and within what share, at every point.
A change that changes nothing (a revocation of a revoked grant, the same cap again) writes
no record.
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from ..core.errors import DatasetNotActive, GrantRevoked
from ..models import AuditRecord, Budget, Dataset, Grant
from . import trail

__all__ = ["give", "change_cap", "revoke"]


def _caps(grant: Grant) -> tuple:
    return grant.cap_epsilon, grant.cap_delta


def _cap(value: float | None) -> float | None:
    return None if value is None else value + 0.0  # -0.0 stored (and listed) as 0.0


def _record(budget: Budget, grant: Grant, actor: str, outcome: str, before: tuple) -> None:
    caps = {name: [old, new] for name, old, new in zip(("cap_epsilon", "cap_delta"), before, _caps(grant))}
    params = {"analyst": grant.analyst.get_username(), "grant": grant.pk, **caps}
    moved = ", ".join(f"{n} {o!r} -> {v!r}" for n, (o, v) in caps.items() if o != v)
    detail = f"{outcome} for {params['analyst']}" + (f": {moved}" if moved else "")
    ctx = trail.Context(outcome=outcome, params=params, detail=detail)
    trail.append(budget, grant.dataset.name, grant.dataset.budget_delta, action=AuditRecord.Action.GRANT,
                 actor=actor, ctx=ctx)


UNREGISTERED = (Dataset.Status.PENDING, Dataset.Status.FAILED)


def give(analyst, dataset, actor, *, cap_epsilon=None, cap_delta=None) -> Grant | None:
    """The analyst's grant on ``dataset`` with these caps: a new one, or their revoked one
    active again. None if they hold an active one already (the caller refuses).
    ``DatasetNotActive`` while the dataset's table is being read or failed to be (checked
    under the lock): a failed registration's name is freed by deleting it, which a grant
    (and its audit record) would block for good."""
    cap_epsilon, cap_delta = _cap(cap_epsilon), _cap(cap_delta)
    with transaction.atomic():
        budget = Budget.objects.select_for_update().get(pk=dataset.pk)
        status = Dataset.objects.filter(pk=dataset.pk).values_list("status", flat=True).get()
        if status in UNREGISTERED:
            raise DatasetNotActive(f"{dataset.name} is {status}: its table is not registered (yet); give the grant "
                                   "once it is draft or active.")
        grant = Grant.objects.select_for_update().filter(analyst=analyst, dataset=dataset).first()
        if grant is not None and grant.active:
            return None
        before = (None, None)
        if grant is None:
            grant = Grant.objects.create(analyst=analyst, dataset=dataset, created_by=actor, cap_epsilon=cap_epsilon,
                                         cap_delta=cap_delta)
        else:
            grant.revoked_at, grant.cap_epsilon, grant.cap_delta = None, cap_epsilon, cap_delta
            grant.save(update_fields=["revoked_at", "cap_epsilon", "cap_delta"])
        _record(budget, grant, actor.get_username(), "granted", before)
        return grant


def change_cap(grant: Grant, actor, **caps) -> Grant:
    """``grant`` with ``cap_epsilon`` and / or ``cap_delta`` set (None: no cap of its own).
    ``GrantRevoked`` if it is revoked (checked under the lock): the trail's next record of a
    revoked grant is its giving again, which sets the caps; a cap changed meanwhile was a
    record of a revoked grant, and ``audit verify`` failed for good."""
    with transaction.atomic():
        budget = Budget.objects.select_for_update().get(pk=grant.dataset_id)
        grant = Grant.objects.select_for_update().select_related("analyst", "dataset").get(pk=grant.pk)
        if not grant.active:
            raise GrantRevoked(f"The grant of {grant.analyst.get_username()} on {grant.dataset.name} is revoked: "
                               "give it again (POST /api/grants/) with the cap.")
        before = _caps(grant)
        for key, value in caps.items():
            setattr(grant, key, _cap(value))
        if _caps(grant) != before:
            grant.save(update_fields=list(caps))
            _record(budget, grant, actor.get_username(), "changed", before)
        return grant


def revoke(grant: Grant, actor) -> bool:
    """Revoke ``grant`` (kept, with its history, for the ledger); False if it was revoked.
    The analyst's requests still queued on the dataset are cancelled and refunded with it
    (``queued.cancel_queued``): given back later, the grant does not run them."""
    from .queued import cancel_queued

    with transaction.atomic():
        budget = Budget.objects.select_for_update().get(pk=grant.dataset_id)
        grant = Grant.objects.select_for_update().select_related("analyst", "dataset").get(pk=grant.pk)
        if not grant.active:
            return False
        grant.revoked_at = timezone.now()
        grant.save(update_fields=["revoked_at"])
        _record(budget, grant, actor.get_username(), "revoked", _caps(grant))
        cancel_queued(grant.dataset_id, "grant.missing", f"{grant.analyst}'s grant on dataset {grant.dataset.name} "
                      "was revoked", analyst_id=grant.analyst_id)
        return True
