"""The Kubernetes backend: the official client's real requests, answered by recorded API responses.

No API server runs here. A loopback HTTP server answers with responses shaped as a real API server sends
them (tests/recovery/k8s_exchanges.json); the real ``kubernetes`` client serialises and sends real HTTP
requests, and the tests assert on exactly what it sent (method, path, query, content type, body).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

kubernetes = pytest.importorskip("kubernetes", reason="the kubernetes client is not installed (pip install kubernetes)")

from rankscope.recovery.audit import JsonlAuditLog  # noqa: E402
from rankscope.recovery.backends.k8s import K8sBackend, taint_value  # noqa: E402
from rankscope.recovery.executor import execute  # noqa: E402
from rankscope.recovery.plan import Action, Plan  # noqa: E402

EXCHANGES = json.loads((Path(__file__).parent / "k8s_exchanges.json").read_text())


class FakeApi:
    """Answers (method, path) from queues of recorded responses; records every request."""

    def __init__(self) -> None:
        self.script: dict[tuple[str, str], list[tuple[int, Any]]] = {}
        self.requests: list[dict[str, Any]] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                path, _, query = self.path.partition("?")
                api.requests.append(
                    {
                        "method": self.command,
                        "path": path,
                        "query": query,
                        "content_type": self.headers.get("Content-Type"),
                        "body": json.loads(raw) if raw else None,
                    }
                )
                queue = api.script.get((self.command, path))
                status, body = (
                    (queue.pop(0) if len(queue) > 1 else queue[0])
                    if queue
                    else (404, {"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404})
                )
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = _serve

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def on(self, method: str, path: str, *responses: tuple[int, Any]) -> None:
        self.script[(method, path)] = list(responses)

    def client(self) -> Any:
        cfg = kubernetes.client.Configuration()
        cfg.host = f"http://127.0.0.1:{self.server.server_address[1]}"
        return kubernetes.client.ApiClient(cfg)


@pytest.fixture
def api() -> Iterator[FakeApi]:
    fake = FakeApi()
    fake.thread.start()
    try:
        yield fake
    finally:
        fake.server.shutdown()
        fake.server.server_close()


def _plan() -> Plan:
    return Plan(
        job="llm",
        incident="inc-0123456789abcdef",
        category="machine",
        rule="machine-event",
        confidence=0.98,
        actions=(
            Action("evict", "Xid 79 (GPU has fallen off the bus) on gpu-7", nodes=("gpu-7",)),
            Action("restart", "on warm standbys", exclude=("gpu-7",)),
        ),
        time=0.0,
    )


def _script_node(api: FakeApi) -> None:
    api.on("PATCH", "/api/v1/nodes/gpu-7", (200, EXCHANGES["cordoned"]))
    api.on("GET", "/api/v1/nodes/gpu-7", (200, EXCHANGES["cordoned"]))
    api.on("GET", "/api/v1/namespaces/train/pods", (200, EXCHANGES["pods"]))


def test_cordon_taint_and_evict_through_the_eviction_api(api: FakeApi, tmp_path: Path) -> None:
    _script_node(api)
    api.on(
        "POST",
        "/api/v1/namespaces/train/pods/llm-worker-3/eviction",
        (429, EXCHANGES["pdb_refused"]),
        (429, EXCHANGES["pdb_refused"]),
        (201, EXCHANGES["evicted"]),
    )
    slept: list[float] = []
    backend = K8sBackend(
        namespace="train", pod_selector="job-name=llm", api_client=api.client(), sleep=slept.append, backoff_seconds=1.5
    )
    rep = execute(_plan(), backend, audit=JsonlAuditLog(tmp_path / "audit.jsonl"), lock_dir=tmp_path, apply=True)
    assert rep.ok, rep.explain()

    reqs = api.requests
    assert [(r["method"], r["path"]) for r in reqs] == [
        ("PATCH", "/api/v1/nodes/gpu-7"),
        ("GET", "/api/v1/nodes/gpu-7"),
        ("PATCH", "/api/v1/nodes/gpu-7"),
        ("GET", "/api/v1/namespaces/train/pods"),
    ] + [("POST", "/api/v1/namespaces/train/pods/llm-worker-3/eviction")] * 3
    cordon, _, taint, pods, evict = reqs[0], reqs[1], reqs[2], reqs[3], reqs[4]
    assert cordon["body"] == {"spec": {"unschedulable": True}}
    assert cordon["content_type"] in (
        "application/strategic-merge-patch+json",
        "application/merge-patch+json",
        "application/json-patch+json",
    )
    assert taint["body"]["spec"]["taints"] == [
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},  # the node's own taint is kept
        {"key": "rankscope.io/evicted", "value": "machine-event.inc-0123456789abcdef", "effect": "NoSchedule"},
    ]
    notes = taint["body"]["metadata"]["annotations"]
    assert notes["rankscope.io/incident"] == "inc-0123456789abcdef" and "Xid 79" in notes["rankscope.io/evict-reason"]
    assert pods["query"] == "fieldSelector=spec.nodeName%3Dgpu-7&labelSelector=job-name%3Dllm"
    assert evict["body"] == {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": "llm-worker-3", "namespace": "train"},
    }
    # the pod already being deleted is not evicted again; two PDB refusals were retried with backoff
    assert not any("llm-worker-old" in r["path"] for r in reqs)
    assert slept == [1.5, 3.0]
    ok = [s for s in rep.steps if "llm-worker-3" in s.command][0]
    assert ok.outcome == "ok" and ok.detail.count("disruption budget") == 2
    assert rep.steps[-1].action == "restart" and rep.steps[-1].outcome == "noop"  # the controller relaunches
    rec = JsonlAuditLog(tmp_path / "audit.jsonl").records("llm")
    assert [(r.what, r.outcome, r.backend) for r in rec] == [("evict", "ok", "k8s"), ("restart", "ok", "k8s")]


def test_pdb_refusing_every_try_is_reported_and_stops_the_plan(api: FakeApi, tmp_path: Path) -> None:
    _script_node(api)
    api.on("POST", "/api/v1/namespaces/train/pods/llm-worker-3/eviction", (429, EXCHANGES["pdb_refused"]))
    slept: list[float] = []
    backend = K8sBackend(
        namespace="train",
        pod_selector="job-name=llm",
        api_client=api.client(),
        sleep=slept.append,
        max_retries=3,
        backoff_seconds=1.0,
    )
    rep = execute(_plan(), backend, audit=JsonlAuditLog(tmp_path / "audit.jsonl"), lock_dir=tmp_path, apply=True)
    assert not rep.ok
    refused = [s for s in rep.steps if s.outcome == "refused"]
    assert len(refused) == 1 and refused[0].detail.count("disruption budget") == 4 and slept == [1.0, 2.0, 4.0]
    assert rep.steps[-1].command == "(not attempted)"  # no restart after a failed eviction
    outcomes = [(r.what, r.outcome) for r in JsonlAuditLog(tmp_path / "audit.jsonl").records()]
    assert outcomes == [("evict", "failed"), ("restart", "skipped")]


def test_suspend_the_job_on_stop(api: FakeApi) -> None:
    api.on("PATCH", "/apis/batch/v1/namespaces/train/jobs/llm", (200, EXCHANGES["job_suspended"]))
    backend = K8sBackend(namespace="train", job_name="llm", api_client=api.client())
    plan = _plan()
    steps = backend.carry_out(Action("stop", "too many evictions"), plan, apply=True)
    assert steps[0].outcome == "ok"
    assert api.requests[0]["method"] == "PATCH" and api.requests[0]["body"] == {"spec": {"suspend": True}}


def test_dry_run_sends_nothing_and_prints_the_requests(api: FakeApi) -> None:
    backend = K8sBackend(namespace="train", pod_selector="job-name=llm", api_client=api.client())
    plan = _plan()
    steps = backend.carry_out(plan.actions[0], plan, apply=False)
    assert api.requests == []
    assert steps[0].command == 'PATCH /api/v1/nodes/gpu-7 {"spec": {"unschedulable": true}}'
    assert (
        steps[3].command == "GET /api/v1/namespaces/train/pods?fieldSelector=spec.nodeName%3Dgpu-7"
        "&labelSelector=job-name%3Dllm"
    )
    assert steps[4].command.startswith("POST /api/v1/namespaces/train/pods/<pod>/eviction")
    assert all(s.outcome == "dry-run" for s in steps)


def test_taint_value_is_label_safe() -> None:
    v = taint_value(
        Plan(job="j", incident="inc-" + "f" * 60, category="c", rule="escalate widen!", confidence=1.0, actions=())
    )
    assert len(v) <= 63 and all(c.isalnum() or c in "-_." for c in v) and v[0].isalnum() and v[-1].isalnum()
