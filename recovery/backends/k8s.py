"""Kubernetes through the official ``kubernetes`` Python client: cordon, taint, evict, let the job
controller relaunch.

Evicting a machine is what ``kubectl drain`` does, client-side, limited to the job's pods:

1. cordon: ``PATCH /api/v1/nodes/{node}`` ``{"spec": {"unschedulable": true}}`` (``patch_node``);
2. taint it with the reason, so nothing that tolerates cordons lands there either: read the node, add
   ``rankscope.io/evicted=<rule>.<incident>:NoSchedule`` to its taints and the full reason as an annotation;
3. list the job's pods on it (``fieldSelector=spec.nodeName=...`` plus the job's label selector) and evict
   each through the Eviction API (``POST .../pods/{pod}/eviction``, ``create_namespaced_pod_eviction``).
   PodDisruptionBudgets are honoured by the API server: a refused eviction answers 429 and is retried with
   exponential backoff, every refusal reported; after the last try the step fails (no force-delete).

Then the job's controller (Kubeflow's PyTorchJob, JobSet, Volcano) recreates the pods on other nodes and
they resume from the newest complete checkpoint. A dry run contacts no API server: it returns each
request (method, path, body) it would send.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any

from rankscope.spine import InputError

from ..plan import Action, Plan
from .base import StepResult, check_nodes, one_line

TAINT_KEY = "rankscope.io/evicted"
_LABEL_VALUE = re.compile(r"[^A-Za-z0-9_.-]+")


def taint_value(plan: Plan) -> str:
    """A label-safe taint value (<= 63 characters) naming the rule and the incident."""
    v = _LABEL_VALUE.sub("-", f"{plan.rule}.{plan.incident}")[:63].strip("-_.")
    return v or "rankscope"


class K8sBackend:
    name = "k8s"

    def __init__(
        self,
        *,
        namespace: str,
        pod_selector: str = "",
        api_client: Any = None,
        job_name: str = "",
        taint_key: str = TAINT_KEY,
        max_retries: int = 5,
        backoff_seconds: float = 2.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not namespace:
            raise InputError("k8s backend: a namespace is required (the job's pods are evicted there)")
        self.namespace = namespace
        self.pod_selector = pod_selector
        self.job_name = job_name
        self.taint_key = taint_key
        self.max_retries = max_retries
        self.backoff_seconds = backoff_seconds
        self.sleep = sleep
        self._api = api_client

    # -- the client ------------------------------------------------------------------------------------

    def api(self) -> Any:
        """The ApiClient: the one given, else in-cluster config, else ~/.kube/config."""
        if self._api is None:
            from kubernetes import client
            from kubernetes import config as kube_config

            config: Any = kube_config  # the client ships no type hints
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            self._api = client.ApiClient()
        return self._api

    def _core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.api())

    # -- requests, as they are sent --------------------------------------------------------------------

    @staticmethod
    def _req(method: str, path: str, body: Any = None) -> str:
        return f"{method} {path}" + (f" {json.dumps(body, sort_keys=True)}" if body is not None else "")

    def _pods_path(self, node: str) -> str:
        q = f"fieldSelector=spec.nodeName%3D{node}"
        if self.pod_selector:
            from urllib.parse import quote

            q += f"&labelSelector={quote(self.pod_selector, safe='')}"
        return f"/api/v1/namespaces/{self.namespace}/pods?{q}"

    def _eviction_body(self, pod: str) -> dict[str, Any]:
        return {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": self.namespace}}

    # -- actions ---------------------------------------------------------------------------------------

    def evict(self, nodes: tuple[str, ...], plan: Plan, reason: str, *, apply: bool) -> list[StepResult]:
        nodes = check_nodes(nodes)
        value = taint_value(plan)
        taint = {"key": self.taint_key, "value": value, "effect": "NoSchedule"}
        notes = {"rankscope.io/evict-reason": one_line(reason, 1000), "rankscope.io/incident": plan.incident}
        out: list[StepResult] = []
        for node in nodes:
            cordon = {"spec": {"unschedulable": True}}
            if not apply:
                out += [
                    StepResult("evict", self._req("PATCH", f"/api/v1/nodes/{node}", cordon), "dry-run", "cordon"),
                    StepResult("evict", self._req("GET", f"/api/v1/nodes/{node}"), "dry-run", "read its taints"),
                    StepResult(
                        "evict",
                        self._req(
                            "PATCH",
                            f"/api/v1/nodes/{node}",
                            {"metadata": {"annotations": notes}, "spec": {"taints": ["<existing taints>", taint]}},
                        ),
                        "dry-run",
                        "taint with the reason",
                    ),
                    StepResult("evict", self._req("GET", self._pods_path(node)), "dry-run", "the job's pods there"),
                    StepResult(
                        "evict",
                        self._req(
                            "POST",
                            f"/api/v1/namespaces/{self.namespace}/pods/<pod>/eviction",
                            self._eviction_body("<pod>"),
                        ),
                        "dry-run",
                        "for each pod listed; 429 (PodDisruptionBudget) retried with backoff",
                    ),
                ]
                continue
            out += self._evict_node(node, cordon, taint, notes)
            if out and out[-1].outcome in ("failed", "refused"):
                break
        return out

    def _evict_node(
        self, node: str, cordon: dict[str, Any], taint: dict[str, str], notes: dict[str, str]
    ) -> list[StepResult]:
        from kubernetes.client import V1Eviction, V1ObjectMeta
        from kubernetes.client.exceptions import ApiException

        core = self._core()
        out: list[StepResult] = []
        path = f"/api/v1/nodes/{node}"
        try:
            core.patch_node(node, cordon)
            out.append(StepResult("evict", self._req("PATCH", path, cordon), "ok", "cordoned"))
            current = core.read_node(node)
            existing = [self.api().sanitize_for_serialization(t) for t in (current.spec.taints or [])]
            kept = [t for t in existing if t.get("key") != self.taint_key]
            body = {"metadata": {"annotations": notes}, "spec": {"taints": kept + [taint]}}
            core.patch_node(node, body)
            out.append(StepResult("evict", self._req("PATCH", path, body), "ok", "tainted"))
            pods = core.list_namespaced_pod(
                self.namespace, field_selector=f"spec.nodeName={node}", label_selector=self.pod_selector or None
            )
        except ApiException as exc:
            out.append(StepResult("evict", f"{node}", "failed", f"API {exc.status} {exc.reason}: {_message(exc)}"))
            return out
        for pod in pods.items:
            name = pod.metadata.name
            if pod.metadata.deletion_timestamp is not None or (
                pod.status and pod.status.phase in ("Succeeded", "Failed")
            ):
                out.append(StepResult("evict", f"pod {name}", "noop", "already terminating or finished"))
                continue
            req = self._req(
                "POST", f"/api/v1/namespaces/{self.namespace}/pods/{name}/eviction", self._eviction_body(name)
            )
            refusals: list[str] = []
            for attempt in range(self.max_retries + 1):
                try:
                    core.create_namespaced_pod_eviction(
                        name,
                        self.namespace,
                        V1Eviction(
                            api_version="policy/v1",
                            kind="Eviction",
                            metadata=V1ObjectMeta(name=name, namespace=self.namespace),
                        ),
                    )
                except ApiException as exc:
                    if exc.status == 404:
                        out.append(StepResult("evict", req, "noop", "pod already gone"))
                        break
                    if exc.status == 429 and attempt < self.max_retries:
                        wait = self.backoff_seconds * 2**attempt
                        refusals.append(f"try {attempt + 1}: {_message(exc)} (retry in {wait:g} s)")
                        self.sleep(wait)
                        continue
                    refusals.append(f"try {attempt + 1}: API {exc.status}: {_message(exc)}")
                    out.append(
                        StepResult("evict", req, "refused" if exc.status == 429 else "failed", "; ".join(refusals))
                    )
                    break
                else:
                    out.append(
                        StepResult(
                            "evict", req, "ok", ("evicted after " + "; ".join(refusals)) if refusals else "evicted"
                        )
                    )
                    break
            if out[-1].outcome in ("failed", "refused"):
                break
        return out

    def carry_out(self, action: Action, plan: Plan, *, apply: bool) -> list[StepResult]:
        if action.kind == "evict":
            return self.evict(
                action.nodes, plan, f"rankscope {plan.incident} {plan.rule}: {action.reason}", apply=apply
            )
        if action.kind == "restart":
            return [
                StepResult(
                    "restart",
                    "(none)",
                    "noop",
                    "the job controller recreates the evicted pods on other "
                    "nodes; they resume from the newest complete checkpoint",
                )
            ]
        if action.kind == "stop" and self.job_name:
            path = f"/apis/batch/v1/namespaces/{self.namespace}/jobs/{self.job_name}"
            body = {"spec": {"suspend": True}}
            if not apply:
                return [StepResult("stop", self._req("PATCH", path, body), "dry-run", "suspend the Job")]
            from kubernetes import client
            from kubernetes.client.exceptions import ApiException

            try:
                client.BatchV1Api(self.api()).patch_namespaced_job(self.job_name, self.namespace, body)
            except ApiException as exc:
                return [
                    StepResult("stop", self._req("PATCH", path, body), "failed", f"API {exc.status}: {_message(exc)}")
                ]
            return [StepResult("stop", self._req("PATCH", path, body), "ok", "Job suspended")]
        if action.kind in ("stop", "rollback"):
            what = (
                f"roll back to {action.code_version or action.checkpoint or action.step}"
                if action.kind == "rollback"
                else "stop the job"
            )
            return [
                StepResult(
                    action.kind,
                    "(manual)",
                    "noop",
                    f"{what}: not automated on Kubernetes here; a person or the job controller's policy does it",
                )
            ]
        return [StepResult(action.kind, "(none)", "noop", "recorded in the audit trail only")]


def _message(exc: Any) -> str:
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        return str(exc.reason)
    return str(body.get("message") or exc.reason)
