"""The API token's authentication (governance.core.security: one written-out statement per call,
never cached) gives the user as stored and counts a deactivation at once."""

import pytest

pytestmark = pytest.mark.django_db


def test_a_token_authenticates_its_user_as_stored_and_a_deactivated_user_at_once(api, analyst):
    client = api(analyst)
    me = client.get("/api/me/")
    assert me.status_code == 200 and me.json()["username"] == "ann"
    type(analyst).objects.filter(pk=analyst.pk).update(is_active=False)
    r = client.get("/api/me/")
    assert r.status_code == 401 and r.json()["detail"] == "User inactive or deleted."
    bad = api()
    bad.credentials(HTTP_AUTHORIZATION="Token " + "0" * 40)
    assert bad.get("/api/me/").json()["detail"] == "Invalid token."
