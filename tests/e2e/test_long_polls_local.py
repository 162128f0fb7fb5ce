"""On the local stack (uvicorn, as `make run` serves the API): a hundred results long polls of one account wait
without holding the server's threads, so another account's calls still answer at once; one more poll than the
account may hold is refused with a 429 and `retry-after`."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from batchinfer.api.app import create_app
from batchinfer.layout import batch_key, long_polls_key
from batchinfer.service import accounts
from batchinfer.settings import Settings
from local.run import start
from local.servers import UvicornThread, free_port
from local.simulated_backend import SimConfig

pytestmark = pytest.mark.e2e
MODEL = "glm-5.3-flash"
POLLS = 100
ANSWERS_WITHIN_SECONDS = 3.0  # generous: each call takes well under a second on an idle stack
WAIT = 25  # each poll's `wait`, the most the API allows: the polls outlast the other account's calls


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    state = tmp_path_factory.mktemp("polls-stack") / ".local"
    settings = Settings(table_name="e2e-polls", bucket_name="e2e-polls", stage="e2e-polls",
                        max_long_polls_per_account=POLLS)
    # The backend holds every model call until the test lets them go: no result finishes while the polls
    # wait, however long the machine takes to start them.
    sim_port = free_port()
    svc, _, stop = start(settings, free_port(), sim_port, sim_config=SimConfig(hold=True), pollers=1,
                         state_dir=state)
    api = UvicornThread(create_app(), free_port()).start()
    yield {"base": f"{api.url}/v1", "svc": svc, "sim": f"http://127.0.0.1:{sim_port}"}
    httpx.put(f"http://127.0.0.1:{sim_port}/_sim/config", json={"hold": False}, trust_env=False)
    api.stop()
    stop()


def client_of(stack: dict, tier: str = "pro") -> httpx.Client:
    account = accounts.create_account(stack["svc"], tier=tier, batch_access=True)
    key = accounts.create_key(stack["svc"], account["id"])
    return httpx.Client(base_url=stack["base"], headers={"Authorization": f"Bearer {key}"}, trust_env=False,
                        timeout=60, limits=httpx.Limits(max_connections=POLLS + 10))


def request(custom_id: str) -> dict:
    return {"custom_id": custom_id, "body": {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}}


def timed(call) -> tuple[float, httpx.Response]:
    started = time.monotonic()
    reply = call()
    return time.monotonic() - started, reply


def test_a_hundred_long_polls_of_one_account_leave_another_accounts_calls_answering_at_once(stack):
    with client_of(stack) as poller, client_of(stack) as other:
        batch = poller.post("/batches", json={"requests": [request("a"), request("b")]}).json()
        holds = long_polls_key(stack["svc"].table.get(*batch_key(batch["id"]))["account_id"])
        polls = ThreadPoolExecutor(max_workers=POLLS)
        try:
            waiting = [polls.submit(poller.get, f"/batches/{batch['id']}/results",
                                    params={"order": "finished", "wait": WAIT}) for _ in range(POLLS)]
            deadline = time.monotonic() + 15
            while (stack["svc"].table.get(*holds) or {}).get("held", 0) < POLLS:  # every poll waits, held
                assert time.monotonic() < deadline, stack["svc"].table.get(*holds)
                time.sleep(0.1)

            mine = other.post("/batches", json={"requests": [request("c")]})
            calls = {
                "models": timed(lambda: other.get("/models")),
                "create": timed(lambda: other.post("/batches", json={"requests": [request("d")]})),
                "retrieve": timed(lambda: other.get(f"/batches/{mine.json()['id']}")),
                "list": timed(lambda: other.get("/batches")),
            }
            for name, (seconds, reply) in calls.items():
                assert reply.status_code == 200, (name, reply.text)
                assert seconds < ANSWERS_WITHIN_SECONDS, (name, seconds)
            # One more poll than the account may hold: refused at once, as a rate limit.
            seconds, refused = timed(lambda: poller.get(f"/batches/{batch['id']}/results",
                                                        params={"order": "finished", "wait": WAIT}))
            assert refused.status_code == 429 and seconds < ANSWERS_WITHIN_SECONDS, refused.text
            assert refused.json()["error"]["type"] == "rate_limit_error" and refused.headers["retry-after"]
            # The hundred were still waiting all along; once the backend answers, each gets the results.
            assert not any(poll.done() for poll in waiting)
            assert httpx.put(f"{stack['sim']}/_sim/config", json={"hold": False}, trust_env=False).is_success
            for poll in waiting:
                page = poll.result(timeout=WAIT + 15)
                assert page.status_code == 200, page.text
                assert {r["custom_id"] for r in page.json()["data"]} <= {"a", "b"} and page.json()["data"], page.text
        finally:
            polls.shutdown(wait=False, cancel_futures=True)
        assert stack["svc"].table.get(*holds)["held"] == 0  # every poll gave its hold back
