"""Redis frozen (SIGSTOP: it accepts connections and answers nothing) or gone: /healthz answers
within 2 s naming the broker, and POST /sweeps answers in bounded time instead of hanging.

Each test runs its own redis-server (tests/integration/conftest.py, PrivateRedis), never the
shared one.
"""
from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.integration

BASE = dict(dtype="f16", g=1, seq_len_q=8, seq_len_k=96, num_heads_q=4, num_heads_kv=2, head_dim_qk=64, head_dim_v=64)


@pytest.mark.parametrize("outage", ["frozen", "killed"])
def test_healthz_answers_within_2_s_naming_the_broker(service, private_redis, outage):
    with service.client(broker_url=private_redis.url) as c:
        assert c.get("/healthz").json() == {"status": "ok", "database": "ok", "broker": "ok"}
        private_redis.freeze() if outage == "frozen" else private_redis.kill()
        try:
            for _ in range(3):
                t0 = time.monotonic()
                resp = c.get("/healthz")
                took = time.monotonic() - t0
                assert took < 2.0, took
                assert resp.status_code == 503
                body = resp.json()
                assert body["database"] == "ok" and body["broker"].startswith("error"), body
        finally:
            private_redis.kill()


def test_post_sweeps_answers_in_bounded_time_with_redis_frozen(service, private_redis):
    with service.client(broker_url=private_redis.url) as c:
        private_redis.freeze()
        try:
            t0 = time.monotonic()
            resp = c.post("/sweeps", json={"configs": [BASE], "backend": "cpu"})
            took = time.monotonic() - t0
        finally:
            private_redis.kill()
    print(f"POST /sweeps with Redis frozen answered {resp.status_code} in {took:.1f} s")
    assert took < 20, took
    assert resp.status_code in (202, 503), resp.text
