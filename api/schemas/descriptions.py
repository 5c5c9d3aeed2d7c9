"""What each field of the API's bodies and parameters means, for /docs and /redoc.

Models whose fields carry `Field(description=...)` keep theirs; this one table fills every field
left without one, by `Model.field` first, then by the field's name, so a name means the same
thing wherever it appears (docs/spec.md §1 for config fields, §7 for outcomes, §8 for names).
A field or parameter that neither names is caught by tests/unit/api/test_openapi_descriptions.py.
"""
from __future__ import annotations

from typing import Any

_OUTCOMES = "pass, fail, nan, fault, unsafe, error, timeout, oom, not_applicable (docs/spec.md §7)"

BY_NAME: dict[str, str] = {
    # The config (docs/spec.md §1).
    "dtype": "storage type of Q, K and V: f16, bf16, f32 or i8",
    "g": "batch entries",
    "seq_len_q": "query rows per batch entry and head",
    "seq_len_k": "key and value rows",
    "num_heads_q": "query heads; a multiple of num_heads_kv",
    "num_heads_kv": "key/value heads (grouped-query attention when fewer than num_heads_q)",
    "head_dim_qk": "width of a Q and K row, 1 to 1024",
    "head_dim_v": "width of a V and O row, 1 to 1024",
    "with_attn_scale": "logits multiplied by 1/sqrt(head_dim_qk)",
    "with_attn_bias": "a bias [g, num_heads_q, seq_len_q, seq_len_k] added to the logits",
    "causal": "key j hidden from query row q when j > q + prefix_offset[b]",
    "prefix_offset": "per batch entry, the causal diagonal's shift (needs causal); null: 0",
    "current_seq_len": "KV-cache mode: per batch entry, the index of the last valid key (inclusive); null: all keys",
    "trans_q": "Q stored [..., head_dim, seq] instead of [..., seq, head_dim]",
    "trans_k": "K stored [..., head_dim, seq] instead of [..., seq, head_dim]",
    "trans_v": "V stored [..., head_dim, seq] instead of [..., seq, head_dim]",
    "trans_o": "O stored [..., head_dim, seq] instead of [..., seq, head_dim]",
    "return_lse": "the kernel also returns each query row's log-sum-exp",
    "split_kv": "partitions of the key axis (docs/spec.md §3); above 1 needs return_lse",
    "rms_threshold": "the config's own RMS tolerance, which beats the policy (docs/spec.md §5); null: the policy",
    "data_seed": "seed of the input tensors: the same bytes on every machine",
    "data_regime": "shape of the input values: normal, sink, outliers, large_logits, uniform or cancellation (docs/spec.md §1)",
    "has_prefix_offset": "the config has a prefix_offset",
    "kv_cache": "the config is in KV-cache mode (current_seq_len set)",
    # The kernel under test (docs/plugins.md).
    "kernel": "the kernel under test: attnsweep (the project's own, on the backend), a shipped plug-in "
              "(torch-sdpa:math|flash|efficient|cudnn, xformers-splitk) or an installed entry point (GET /kernels)",
    "kernel_name": "the name the kernel ran as",
    "kernel_version": "the kernel's version: a package version or a digest of its source",
    "only_one_total": "configs failing on exactly one kernel while the others passed them, all of them",
    # Sweep requests (docs/spec.md §6, §8).
    "samples": "configs to run: drawn until this many pass every prefilter",
    "seed": "seed of the sampling stream (default: the ISO week number)",
    "dtypes": "dtypes to draw from, uniformly",
    "backend": "auto, cpu, cuda or hip; cpu goes to the cpu queue, the others to the GPU queue",
    "label": "free-text name of the sweep",
    "max_tokens": "prefilter: a draw is dropped when max(seq_len_q, seq_len_k) * g exceeds this",
    "splitkv_extra_bytes_limit": "prefilter: most bytes of split-KV partial buffers (default: device memory // 8 in [1, 8] GiB)",
    "reference_flops_limit": "prefilter: most floating-point operations the host reference may spend on a config",
    "reference_bytes_limit": "prefilter: most bytes the host reference may hold for a config",
    "ranges": "sampled ranges to override, {field: [lo, hi]} inclusive",
    "max_draws": "most draws before the sweep gives up (default 1000 * samples)",
    "err_ratio_gate": "also fail configs whose out_err_ratio exceeds this (default: err_ratio is only reported)",
    "data_regimes": "input regimes to draw, {regime: share} or a list (equal shares); default: half normal, a tenth each other regime",
    "coverage_guided": "prefer draws that land in the least covered coverage cells (docs/spec.md §6)",
    "coverage_prior_sweeps": "with coverage_guided: the cells of the newest N finished sweeps of the store count as "
                             "reached already (0 to 100; 0: none)",
    "defects": "known bugs compiled into the kernels, to show that the sweep catches them",
    # Sweeps.
    "id": "the row's id",
    "sweep_id": "id of the sweep",
    "status": "sweep state: queued, running, done, cancelled or failed",
    "queue": "the broker queue its configs go to",
    "device": "the device that ran it (name and memory), or the cpu emulation",
    "configs_total": "configs accepted by the prefilters",
    "configs_done": "configs with a stored outcome",
    "outcomes": f"configs per outcome: {_OUTCOMES}",
    "not_applicable_reasons": "not_applicable configs per reason",
    "filtered": "draws rejected per prefilter reason (docs/spec.md §6), over every draw",
    "draws": "configs drawn, accepted or not",
    "splitkv_budget": "the split-KV partial-buffer budget the prefilter used, in bytes",
    "budget_source": "where the budget came from: the request, the device's memory, or the default without a GPU",
    "rerun_of": "the sweep this one reruns, if any",
    "error": "why the sweep failed or was cancelled",
    "created_at": "when it was accepted (UTC, ISO 8601)",
    "started_at": "when its first config started (UTC, ISO 8601)",
    "finished_at": "when it ended (UTC, ISO 8601)",
    "request": "the request it was made from, as stored",
    "tasks": "tasks published to the broker",
    "data": "the rows of this page",
    "count": "rows matching in all (null unless asked for)",
    "has_more": "more rows follow this page",
    # Results (docs/spec.md §4, §7).
    "seq": "position of the config in the sweep's sampled order",
    "config_hash": "content hash of the config (the same config has the same hash in every sweep)",
    "config": "the attention config (docs/spec.md §1)",
    "state": "queued, running, done or cancelled",
    "outcome": f"the config's outcome: {_OUTCOMES}",
    "failed_gate": "the gate a failure is charged to: rms, row, lse, partials or err_ratio",
    "detail": "what went wrong, as the verifier or the runner wrote it",
    "not_applicable_reason": "why a backend could not run the config",
    "threshold_reason": "where the RMS threshold came from: explicit, saturated_softmax, bf16, default or strict",
    "gates": "every bound the verdict used: rms, rms_reason, row and, where they apply, lse and err_ratio",
    "driver_version": "GPU driver version",
    "compiler_version": "kernel compiler version (nvrtc, hiprtc)",
    "variant": "name of the compiled kernel variant",
    "block_n": "keys per KV tile of the variant that ran (docs/spec.md §3)",
    "source_hash": "hash of the kernel sources the config ran",
    "metrics": "the verifier's metrics (docs/spec.md §4); non-finite values as \"nan\", \"inf\", \"-inf\"",
    "timings": "seconds spent compiling, making inputs, running, in the reference and verifying",
    "reproducer": "one command that runs this config again with the same gates",
    "worker": "the worker that stored it",
    "attempts": "deliveries of the config to a worker",
    "check": "the metric that decided the failure, against its bound",
    "gate": "the gate that decided",
    "metric": "the metric the gate compares",
    # Summaries.
    "by": "the fields rows are grouped by",
    "key": "the group's values of the grouped fields",
    "runs": "finished configs",
    "failures": "configs that ended in a failing outcome (fail, nan, fault, unsafe, error, timeout, oom)",
    "failure_rate": "failures / (finished configs - not_applicable); null when nothing ran",
    "groups": "one entry per group",
    "cells": "one entry per pair of field values",
    # CI.
    "commit_sha": "the commit swept",
    "repository": "owner/name of the repository",
    "ref": "the branch, refs/heads/NAME",
    "event": "push or pull_request",
    "base_ref": "a pull request's base branch",
    "pr_number": "a pull request's number",
    "verdict": "pending, pass, fail or error",
    "configs": "configs of the sweep",
    "new_failure_count": "failures the base branch's latest sweep did not have",
    "known_failure_count": "failures the base branch's latest sweep had too",
    "base_sweep_id": "the base branch's sweep compared with",
    "base_commit_sha": "the commit of that base sweep",
    "new_failures": "failures that fail the check",
    "known_failures": "failures the base branch already had (listed, not failing the check)",
    "junit_url": "this sweep as JUnit XML",
    "status_url": "the commit's CI state",
    # Workers and health.
    "name": "worker name",
    "gpu": "GPU index the worker owns",
    "concurrency": "worker processes",
    "arch": "GPU architecture (sm_90, gfx942)",
    "versions": "versions of the worker's software",
    "hostname": "host the worker runs on",
    "pid": "process id of the worker",
    "last_heartbeat": "the worker's last heartbeat (UTC)",
    "stopped_at": "when the worker stopped (UTC); null while it runs",
    "alive": "only workers with a recent heartbeat (true) or only stale ones (false)",
    "database": "whether the database answers",
    "broker": "whether the broker (Redis) answers",
    # Errors.
    "field": "the field or parameter that is wrong",
    "rule": "the rule it breaks",
    "limit": "most rows to return",
    "offset": "rows to skip",
    # Headers of the CI webhook.
    "X-GitHub-Event": "the event's name: push and pull_request start sweeps, others are ignored",
    "X-GitHub-Delivery": "the delivery's unique id: a redelivery returns the first one's sweep",
    "X-Hub-Signature-256": "sha256=HMAC of the body with ATTNSWEEP_WEBHOOK_SECRET",
}

BY_MODEL: dict[str, str] = {
    "Health.status": "ok when the database and the broker answer, else degraded",
    "Message.detail": "what happened",
    "Problems.detail": "every problem found, each naming a field and a rule",
    "CiWebhookReply.status": "started, replayed or ignored",
    "CiWebhookReply.configs_total": "configs the sweep runs",
    "SweepAccepted.status": "the new sweep's state (queued)",
    "HTTPValidationError.detail": "every problem found",
    "ValidationError.loc": "where the problem is: body, query or path, then the field",
    "ValidationError.msg": "what is wrong",
    "ValidationError.type": "the kind of problem",
    "ValidationError.input": "the value given",
    "ValidationError.ctx": "the rule's parameters",
    "SweepsPublic.count": "sweeps matching in all",
    "WorkersPublic.count": "workers listed",
    "FailureRowsPublic.count": "failures matching in all",
    "ConfigRunsPublic.count": "rows matching in all (null unless with_count)",
    "FailureSummary.runs": "finished configs matching the filters",
    "SummaryGroup.outcomes": "configs per outcome in the group",
    "RateCell.outcomes": "configs per outcome in the cell",
    "WorkerPublic.backend": "cpu, cuda or hip",
    "WorkerPublic.queue": "the queue it takes configs from",
    "WorkerPublic.started_at": "when the worker started (UTC)",
    "WorkerPublic.device": "the device it runs configs on",
}


def _lookup(model: str, name: str) -> str | None:
    return BY_MODEL.get(f"{model}.{name}") or BY_NAME.get(name)


def describe(schema: dict[str, Any]) -> dict[str, Any]:
    """Fill the OpenAPI document's missing property and parameter descriptions in place."""
    for model, body in schema.get("components", {}).get("schemas", {}).items():
        for name, prop in body.get("properties", {}).items():
            if not prop.get("description") and _lookup(model, name):
                prop["description"] = _lookup(model, name)
    for item in schema.get("paths", {}).values():
        for op in item.values():
            for param in op.get("parameters", []) if isinstance(op, dict) else []:
                text = param.get("description") or param.get("schema", {}).get("description") or BY_NAME.get(param["name"])
                if text:
                    param["description"] = text
    return schema
