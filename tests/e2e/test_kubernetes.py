"""deploy/kubernetes: every manifest parses, and the pieces fit together (no cluster needed).

What is checked is what breaks silently on a real cluster: probes on the wrong path or port, a Service whose
targetPort names no container port, an HPA aimed at another Deployment or at a metric the server does not export,
a grace period shorter than the drain, an XLA cache folder that is not writable.
"""

from __future__ import annotations

import pytest
import yaml
from repo import ROOT

from typewriter.config import Settings

KUBE = ROOT / "deploy" / "kubernetes"
NOT_MANIFESTS = {"kustomization.yaml", "prometheus-adapter-values.yaml"}


def manifests() -> dict[str, dict]:
    """kind -> the one object of that kind, over every manifest file."""
    objects: dict[str, dict] = {}
    for path in sorted(KUBE.glob("*.yaml")):
        if path.name in NOT_MANIFESTS:
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            assert doc["apiVersion"] and doc["metadata"]["name"], path.name
            assert doc["kind"] not in objects, f"two {doc['kind']}s"
            objects[doc["kind"]] = doc
    return objects


@pytest.fixture(scope="module")
def kube() -> dict[str, dict]:
    return manifests()


@pytest.fixture(scope="module")
def container(kube) -> dict:
    (only,) = kube["Deployment"]["spec"]["template"]["spec"]["containers"]
    return only


def env(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"]}


def port_number(container: dict, port: int | str) -> int:
    if isinstance(port, int):
        return port
    return next(p["containerPort"] for p in container["ports"] if p["name"] == port)


def test_the_kustomization_lists_every_manifest_and_each_has_its_kind(kube):
    listed = yaml.safe_load((KUBE / "kustomization.yaml").read_text())["resources"]
    files = sorted(p.name for p in KUBE.glob("*.yaml") if p.name not in NOT_MANIFESTS)
    assert sorted(listed) == files
    assert set(kube) == {"Deployment", "Service", "Ingress", "HorizontalPodAutoscaler", "PodDisruptionBudget"}
    assert kube["HorizontalPodAutoscaler"]["apiVersion"] == "autoscaling/v2"
    assert kube["Ingress"]["apiVersion"] == "networking.k8s.io/v1"


def test_probes_ask_readyz_and_healthz_on_the_port_the_server_listens_on(container):
    settings = env(container)
    listening = int(settings["TYPEWRITER_PORT"])
    assert port_number(container, "http") == listening
    ready, live = container["readinessProbe"]["httpGet"], container["livenessProbe"]["httpGet"]
    assert (ready["path"], port_number(container, ready["port"])) == ("/readyz", listening)
    assert (live["path"], port_number(container, live["port"])) == ("/healthz", listening)
    assert settings["TYPEWRITER_HOST"] == "0.0.0.0"  # the probes come from the kubelet, not from loopback
    # the probes carry the pod's IP as Host: the server must answer to it
    assert settings["TYPEWRITER_ALLOWED_HOSTS"] == "*"


def test_the_service_selects_the_pods_and_targets_the_container_port(kube, container):
    service, deployment = kube["Service"], kube["Deployment"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    (port,) = service["spec"]["ports"]
    assert port_number(container, port["targetPort"]) == int(env(container)["TYPEWRITER_PORT"])
    backend = kube["Ingress"]["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend["name"] == service["metadata"]["name"] and backend["port"]["name"] == port["name"]


def test_the_ingress_keeps_sockets_open_and_streams_unbuffered(kube):
    notes = kube["Ingress"]["metadata"]["annotations"]
    prefix, defaults = "nginx.ingress.kubernetes.io/", Settings()
    assert int(notes[prefix + "proxy-read-timeout"]) >= defaults.engine.request_timeout_s + defaults.engine.queue_timeout_s
    assert int(notes[prefix + "proxy-send-timeout"]) >= defaults.socket.ping_interval_s
    assert notes[prefix + "proxy-buffering"] == "off"
    assert "http_503" in notes[prefix + "proxy-next-upstream"]
    assert kube["Ingress"]["spec"]["ingressClassName"] == "nginx"


def test_the_ingress_keeps_a_student_on_one_pod_and_moves_them_when_it_fails(kube):
    """The pod a page sticks to holds its conversations' cache and its kept answers; a failed one is left for
    another, where the page continues its answer."""
    notes = kube["Ingress"]["metadata"]["annotations"]
    prefix = "nginx.ingress.kubernetes.io/"
    assert notes[prefix + "affinity"] == "cookie"
    assert notes[prefix + "affinity-mode"] in ("balanced", "persistent")
    assert notes[prefix + "session-cookie-change-on-failure"] == "true"
    assert notes[prefix + "session-cookie-path"] == "/"  # the socket (/ws) and the page share it
    assert notes[prefix + "session-cookie-secure"] == "true" and kube["Ingress"]["spec"]["tls"]
    assert prefix + "upstream-hash-by" not in notes  # one or the other: a hash would override the cookie


def test_the_socket_takes_pages_from_the_host_the_ingress_serves(kube, container):
    host = kube["Ingress"]["spec"]["rules"][0]["host"]
    assert env(container)["TYPEWRITER_ALLOWED_ORIGINS"] == f"https://{host}"
    assert kube["Ingress"]["spec"]["tls"][0]["hosts"] == [host]


def test_the_autoscaler_targets_the_deployment_on_the_queued_requests_the_server_exports(kube):
    from typewriter.server.metrics import Metrics

    hpa = kube["HorizontalPodAutoscaler"]["spec"]
    deployment = kube["Deployment"]
    assert hpa["scaleTargetRef"] == {"apiVersion": deployment["apiVersion"], "kind": "Deployment",
                                     "name": deployment["metadata"]["name"]}
    (metric,) = hpa["metrics"]
    assert metric["type"] == "Pods" and metric["pods"]["target"]["type"] == "AverageValue"
    name = metric["pods"]["metric"]["name"]
    exported = {m.name for m in Metrics(lambda: (0, 0)).registry.collect()}
    assert name == "typewriter_queued_requests" and name in exported
    assert 1 <= hpa["minReplicas"] < hpa["maxReplicas"]
    adapter = yaml.safe_load((KUBE / "prometheus-adapter-values.yaml").read_text())
    assert any(rule["name"]["as"] == name and name in rule["seriesQuery"] for rule in adapter["rules"]["custom"])


def test_the_grace_period_outlasts_the_pre_stop_sleep_the_drain_and_the_shutdown_ends(kube, container):
    settings = env(container)
    pre_stop = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    needed = pre_stop + float(settings["TYPEWRITER_DRAIN_S"]) + float(settings["TYPEWRITER_SHUTDOWN_GRACE_S"])
    assert kube["Deployment"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > needed


def test_the_pod_runs_as_a_user_who_can_write_the_xla_cache_and_nothing_more(kube, container):
    pod = kube["Deployment"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert "fsGroup" in pod["securityContext"]
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    (mount,) = container["volumeMounts"]
    assert mount["mountPath"] == "/var/cache/typewriter"
    assert env(container)["TYPEWRITER_XLA_CACHE"].startswith(mount["mountPath"] + "/")
    assert env(container)["TYPEWRITER_LITE_CACHE"].startswith(mount["mountPath"] + "/")
    (volume,) = pod["volumes"]
    assert volume["name"] == mount["name"] and ("emptyDir" in volume or "persistentVolumeClaim" in volume)
    assert {"cpu", "memory"} <= container["resources"]["requests"].keys()
    assert "memory" in container["resources"]["limits"]


def test_the_manifest_settings_are_ones_the_server_accepts(container):
    settings = Settings.from_env(env(container))  # raises ConfigError on an unknown name or a bad value
    assert (settings.serving.host, settings.serving.port, settings.access.allowed_hosts) == ("0.0.0.0", 8000, "*")
