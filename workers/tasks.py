"""Tasks take ids, never model objects; the request row exists (queued) before the task is
sent. User errors are not retried; a second delivery of a task changes nothing."""

from celery import shared_task


@shared_task(name="workers.run_request", acks_late=True, ignore_result=True, bind=True)
def run_request(self, request_id: str) -> str:
    """Run an admitted request through its engine and commit (or refund) its charge."""
    from governance.execution import execute

    return execute(request_id, worker=self.request.hostname or "")


@shared_task(name="workers.sweep", ignore_result=True)
def sweep() -> dict:
    """The recovery sweep (governance.recovery), run every minute by Celery beat."""
    from governance.recovery import sweep as run_sweep

    return run_sweep()
