"""The Celery app's reliability settings, queue routing, batching by kernel variant, GPU pinning."""
from __future__ import annotations


from attnconfig import parse_config
from settings import Settings
from workers.app import create_celery, queue_kind
from workers.enqueue import batches, variant_key
from workers.start import worker_argv

BASE = dict(dtype="f16", g=1, seq_len_q=4, seq_len_k=64, num_heads_q=2, num_heads_kv=1, head_dim_qk=32, head_dim_v=32)


def test_long_task_settings_follow_celerys_guide():
    settings = Settings(config_time_limit_s=120, config_time_grace_s=30, task_batch_size=8)
    conf = create_celery(settings).conf
    assert conf.task_acks_late and conf.task_reject_on_worker_lost
    assert conf.worker_prefetch_multiplier == 1
    assert conf.task_serializer == "json" and conf.accept_content == ["json"]
    # Celery's hard limit only backs the per-config watchdog: a full batch of configs that each
    # ran to limit + grace still fits.
    assert conf.task_time_limit >= 8 * (120 + 30)
    # Redis's visibility timeout is a lease that live workers renew (workers.lease), so it is
    # short (a dead worker's tasks run again within minutes) and renewed well before it expires;
    # expired leases are put back every 10 s, not kombu's default 100 s.
    options = conf.broker_transport_options
    assert options["visibility_timeout"] == settings.visibility_timeout_s == 120
    assert settings.lease_renew_s * 4 <= options["visibility_timeout"]
    assert options["unacked_restore_interval"] * options["unacked_restore_throttle"] <= 10
    # A frozen or vanished Redis hangs no client: connect and command timeouts are set.
    assert options["socket_connect_timeout"] > 0 and options["socket_timeout"] > 1
    assert conf.task_publish_retry_policy["max_retries"] <= 1


def test_the_lease_is_settable():
    settings = Settings(visibility_timeout_s=600)
    assert create_celery(settings).conf.broker_transport_options["visibility_timeout"] == 600
    assert settings.lease_renew_s == 75


def test_backends_route_to_their_queue():
    assert queue_kind("cpu") == "cpu"
    assert {queue_kind(b) for b in ("auto", "cuda", "hip")} == {"gpu"}
    settings = Settings(queue_prefix="farm1-")
    assert (settings.queue_name("cpu"), settings.queue_name("gpu")) == ("farm1-cpu", "farm1-gpu")


def test_batches_are_full_in_variant_order_and_hold_every_config_once():
    dims = [32, 64, 128, 40, 256, 300, 32, 64]  # head-dim buckets 32, 64, 128, 64, 256, any, 32, 64
    configs = [parse_config({**BASE, "head_dim_qk": d, "head_dim_v": d, "dtype": dt, "data_seed": i})
               for i, (d, dt) in enumerate((d, dt) for d in dims for dt in ("f16", "bf16"))]
    out = batches(configs, size=3)
    flat = [h for b in out for h, _ in b]
    assert sorted(flat) == sorted(c.content_hash() for c in configs)
    by_hash = {c.content_hash(): c for c in configs}
    assert [len(b) for b in out] == [3, 3, 3, 3, 3, 1]   # full batches, the rest in the last
    keys = [variant_key(by_hash[h]) for h in flat]
    # 16 configs in 10 variants, (f16|bf16) x (32: 2, 64: 3, 128, 256, any): each variant's
    # configs are contiguous, in their sampled order
    assert keys == sorted(keys) and len(set(keys)) == 10
    for key in set(keys):
        seeds = [by_hash[h].data_seed for h in flat if variant_key(by_hash[h]) == key]
        assert seeds == sorted(seeds)
    assert variant_key(configs[0], ["causal_off_by_one"]) != variant_key(configs[0])


def test_worker_argv_consumes_one_queue_with_the_given_concurrency():
    argv = worker_argv("farm1-gpu", 1, "gpu0@h", "INFO")
    assert argv[0] == "worker"
    assert argv[argv.index("--queues") + 1] == "farm1-gpu"
    assert argv[argv.index("--concurrency") + 1] == "1"
    assert argv[argv.index("--hostname") + 1] == "gpu0@h"
    assert argv[argv.index("--pool") + 1] == "prefork"  # tasks in a child: the main process heartbeats
