import pytest

from governance import ledger
from governance.errors import BudgetExceeded


@pytest.mark.django_db
def test_it_admits_within_budget_and_refuses_beyond(make_dataset, analyst, grant):
    ds = make_dataset(epsilon=1.0)
    grant(analyst, ds)
    ledger.admit(ds, analyst, {"kind": "laplace", "epsilon": 0.6})
    with pytest.raises(BudgetExceeded) as e:
        ledger.admit(ds, analyst, {"kind": "laplace", "epsilon": 0.6})
    assert e.value.extra["remaining_epsilon"] == pytest.approx(0.4)
