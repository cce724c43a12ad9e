"""The Kubernetes manifests (`make k8s-check`): each overlay rendered with `kubectl kustomize`, every object
valid against the schemas of KUBERNETES_VERSION (kubernetes-validate, strict: an unknown field fails), and
the security properties deploy/kubernetes/README.md promises.

Run by `make k8s-check` alone, offline: the schemas ship inside the kubernetes-validate package, and nothing
is written to disk. Each checker returns what it found wrong, so the negative tests below can show that a bad
object is reported.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from kubernetes_validate import utils as kubernetes_validate

pytestmark = pytest.mark.kubernetes

HERE = Path(__file__).resolve().parent
OVERLAYS = ("dev", "production")
# The newest version the pinned kubernetes-validate bundles schemas for; README.md names it too.
KUBERNETES_VERSION = "1.37.0"

Obj = dict[str, Any]

# The internal gRPC plane and the admin port: never published outside the cluster.
INTERNAL_PORTS = {50051, 50052, 50053, 8081}
WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob", "Pod"}
BAE_IMAGES = ("bae-gateway", "bae-session", "bae-runner", "bae-sandbox")
# Variable names whose value is a secret; a `*_FILE` variable naming one of these points at a file instead.
SECRET_NAME = re.compile(r"(TOKEN|PASSWORD|PASSWD|SECRET|API_KEY|DATABASE_URL|KEY_HASH|PRIVATE_KEY)$")
# Values that look like a credential whatever their variable is called: BAE keys, provider keys, long hex or
# base64 runs, a URL with a password in it.
SECRET_VALUE = re.compile(
    r"bae_(admin_|ses_)?[0-9a-f]{16,}|sk-[A-Za-z0-9_-]{8,}|\b[0-9a-fA-F]{32,}\b|[A-Za-z0-9+=_-]{40,}|://[^/@\s]*:[^/@\s]+@"
)


def render(overlay: str) -> str:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl not found: install Debian's kubernetes-client package (.ci/run does)")
    result = subprocess.run([kubectl, "kustomize", str(HERE / "overlays" / overlay)],
                            capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        pytest.fail(f"kubectl kustomize overlays/{overlay} failed:\n{result.stderr}")
    return result.stdout


@functools.cache
def rendered(overlay: str) -> tuple[Obj, ...]:
    return tuple(doc for doc in yaml.safe_load_all(render(overlay)) if doc)


def name_of(obj: Obj) -> str:
    return f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"


def pod_spec(obj: Obj) -> Obj | None:
    if obj.get("kind") not in WORKLOAD_KINDS:
        return None
    if obj["kind"] == "Pod":
        return dict(obj.get("spec", {}))
    if obj["kind"] == "CronJob":
        return dict(obj["spec"]["jobTemplate"]["spec"]["template"].get("spec", {}))
    return dict(obj["spec"]["template"].get("spec", {}))


def containers(spec: Obj) -> Iterator[Obj]:
    yield from spec.get("initContainers", [])
    yield from spec.get("containers", [])


# --- the checkers ------------------------------------------------------------------------------------------


def schema_problems(obj: Obj, version: str = KUBERNETES_VERSION) -> list[str]:
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = ".".join(str(part) for part in exc.path)
        return [f"{name_of(obj)}: {where}: {exc.message}"]
    except kubernetes_validate.SchemaNotFoundError as exc:
        return [f"{name_of(obj)}: {exc.message}"]
    return []


def security_problems(obj: Obj) -> list[str]:
    """Every container non-root, without privilege escalation or capabilities, with requests and limits."""
    spec = pod_spec(obj)
    if spec is None:
        return []
    problems = []
    pod = spec.get("securityContext", {})
    if spec.get("hostNetwork") or spec.get("hostPID") or spec.get("hostIPC"):
        problems.append(f"{name_of(obj)}: shares a host namespace")
    for container in containers(spec):
        where = f"{name_of(obj)} container {container.get('name')}"
        context = container.get("securityContext", {})
        # A container's own setting wins over the pod's.
        setting = {**pod, **context}.get
        if setting("runAsNonRoot") is not True:
            problems.append(f"{where}: runAsNonRoot is not true")
        if setting("runAsUser") in (None, 0):
            problems.append(f"{where}: no non-zero runAsUser")
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{where}: allowPrivilegeEscalation is not false")
        if context.get("privileged"):
            problems.append(f"{where}: privileged")
        capabilities = context.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []):
            problems.append(f"{where}: capabilities do not drop ALL")
        if capabilities.get("add"):
            problems.append(f"{where}: adds capabilities {capabilities['add']}")
        if (setting("seccompProfile") or {}).get("type") != "RuntimeDefault":
            problems.append(f"{where}: seccompProfile is not RuntimeDefault")
        if str(container.get("image", "")).split("/")[-1].split(":")[0] in BAE_IMAGES \
                and context.get("readOnlyRootFilesystem") is not True:
            problems.append(f"{where}: a BAE service's root filesystem is not read-only")
        resources = container.get("resources", {})
        for bound in ("requests", "limits"):
            for resource in ("cpu", "memory"):
                if resource not in resources.get(bound, {}):
                    problems.append(f"{where}: no {resource} in resources.{bound}")
    return problems


def service_port_numbers(service: Obj, port_ref: Obj) -> set[int]:
    """The Service port an Ingress backend names (by number or name), and the container port it targets."""
    numbers: set[int] = set()
    for port in service.get("spec", {}).get("ports", []):
        if port_ref.get("number") == port.get("port") or (port_ref.get("name") and port_ref["name"] == port.get("name")):
            numbers.add(int(port["port"]))
            if isinstance(port.get("targetPort"), int):
                numbers.add(port["targetPort"])
    if not numbers and isinstance(port_ref.get("number"), int):
        numbers.add(port_ref["number"])
    return numbers


def container_port(objects: tuple[Obj, ...] | list[Obj], name: str) -> set[int]:
    return {int(port["containerPort"]) for obj in objects if (spec := pod_spec(obj)) is not None
            for container in containers(spec) for port in container.get("ports", []) if port.get("name") == name}


def exposure_problems(objects: tuple[Obj, ...] | list[Obj]) -> list[str]:
    """No internal port (gRPC plane, admin) behind an Ingress, a LoadBalancer or a NodePort Service."""
    problems = []
    services = {obj["metadata"]["name"]: obj for obj in objects if obj.get("kind") == "Service"}
    for obj in objects:
        if obj.get("kind") == "Service" and obj.get("spec", {}).get("type") in ("LoadBalancer", "NodePort"):
            for port in obj["spec"].get("ports", []):
                target = port.get("targetPort")
                exposed = {port.get("port")} | (
                    {target} if isinstance(target, int) else container_port(objects, target) if target else set())
                if exposed & INTERNAL_PORTS:
                    problems.append(f"{name_of(obj)}: {obj['spec']['type']} exposes internal port {sorted(exposed)}")
        if obj.get("kind") == "Ingress":
            spec = obj.get("spec", {})
            backends = [spec["defaultBackend"]] if "defaultBackend" in spec else []
            backends += [path["backend"] for rule in spec.get("rules", [])
                         for path in rule.get("http", {}).get("paths", [])]
            for backend in backends:
                target = backend.get("service", {})
                service = services.get(target.get("name"), {})
                ports = service_port_numbers(service, target.get("port", {}))
                for port in service.get("spec", {}).get("ports", []):
                    if isinstance(port.get("targetPort"), str) and int(port["port"]) in ports:
                        ports |= container_port(objects, port["targetPort"])
                if ports & INTERNAL_PORTS or target.get("name") in ("bae-session", "bae-runner", "bae-sandbox"):
                    problems.append(f"{name_of(obj)}: routes to {target.get('name')} port {sorted(ports)}")
    return problems


def secret_problems(obj: Obj) -> list[str]:
    """Secrets are referenced, never inlined: no Secret with data, no credential in an env value, every
    secret-named variable from a secretKeyRef or a `*_FILE` path inside a read-only Secret volume."""
    if obj.get("kind") == "Secret" and (obj.get("data") or obj.get("stringData")):
        return [f"{name_of(obj)}: a Secret with data in the manifests"]
    spec = pod_spec(obj)
    if spec is None:
        return []
    problems = []
    secret_volumes = {volume["name"] for volume in spec.get("volumes", [])
                      if "secret" in volume or any("secret" in source
                                                   for source in volume.get("projected", {}).get("sources", []))}
    for container in containers(spec):
        where = f"{name_of(obj)} container {container.get('name')}"
        secret_dirs = [mount["mountPath"].rstrip("/") + "/" for mount in container.get("volumeMounts", [])
                       if mount.get("name") in secret_volumes and mount.get("readOnly") is True]
        for variable in container.get("env", []):
            name, value = variable["name"], variable.get("value")
            if value is not None and SECRET_VALUE.search(str(value)):
                problems.append(f"{where}: {name} has a value that looks like a credential")
            if name.endswith("_FILE") and SECRET_NAME.search(name.removesuffix("_FILE")):
                if value is None or not any(str(value).startswith(directory) for directory in secret_dirs):
                    problems.append(f"{where}: {name} does not point into a read-only Secret volume")
            elif SECRET_NAME.search(name):
                reference = variable.get("valueFrom", {})
                if "secretKeyRef" not in reference and not (name == "BAE_DATABASE_URL" and value is not None
                                                            and not SECRET_VALUE.search(str(value))):
                    problems.append(f"{where}: {name} is not from a secretKeyRef or a *_FILE path")
        for source in container.get("envFrom", []):
            if "configMapRef" in source:
                problems.append(f"{where}: envFrom a ConfigMap may carry secrets past these checks")
    return problems


def env_of(obj: Obj, container_name: str) -> dict[str, Obj]:
    spec = pod_spec(obj) or {}
    return {variable["name"]: variable for container in containers(spec) if container["name"] == container_name
            for variable in container.get("env", [])}


def find(objects: tuple[Obj, ...], kind: str, name: str) -> Obj:
    matches = [obj for obj in objects if obj.get("kind") == kind and obj["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind}/{name}, found {len(matches)}"
    return matches[0]


# --- the rendered overlays ---------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_is_valid_for_the_kubernetes_version(overlay: str) -> None:
    objects = rendered(overlay)
    assert objects
    assert [problem for obj in objects for problem in schema_problems(obj)] == []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_runs_unprivileged_with_requests_and_limits(overlay: str) -> None:
    assert [problem for obj in rendered(overlay) for problem in security_problems(obj)] == []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_internal_ports_are_never_exposed(overlay: str) -> None:
    objects = rendered(overlay)
    assert exposure_problems(objects) == []
    # The admin port is not even declared: it listens on the pod's loopback.
    assert not [port for obj in objects if (spec := pod_spec(obj)) is not None for container in containers(spec)
                for port in container.get("ports", []) if port["containerPort"] == 8081]
    assert not any(port.get("port") == 8081 for obj in objects if obj.get("kind") == "Service"
                   for port in obj["spec"].get("ports", []))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_secrets_are_referenced_never_inlined(overlay: str) -> None:
    objects = rendered(overlay)
    assert not [obj for obj in objects if obj.get("kind") == "Secret"]
    assert [problem for obj in objects for problem in secret_problems(obj)] == []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_service_has_the_internal_token_and_its_probes(overlay: str) -> None:
    objects = rendered(overlay)
    for kind, name, port in (("Deployment", "bae-session", 50051), ("Deployment", "bae-runner", 50052),
                             ("DaemonSet", "bae-sandbox", 50053)):
        service = find(objects, kind, name)
        container = (pod_spec(service) or {})["containers"][0]
        assert "BAE_INTERNAL_TOKEN_FILE" in env_of(service, container["name"])
        for probe in ("readinessProbe", "livenessProbe"):
            assert container[probe]["grpc"]["port"] == port, f"{name} {probe}"
    gateway = find(objects, "Deployment", "bae-gateway")
    container = (pod_spec(gateway) or {})["containers"][0]
    assert "BAE_INTERNAL_TOKEN_FILE" in env_of(gateway, "gateway")
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert env_of(gateway, "gateway")["BAE_ADMIN_ADDR"]["value"] == "127.0.0.1:8081"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_replicas_find_each_other(overlay: str) -> None:
    objects = rendered(overlay)
    session = env_of(find(objects, "Deployment", "bae-session"), "session")
    assert session["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert session["BAE_SESSION_ADVERTISE_ADDR"]["value"] == "$(POD_IP):50051"
    # Dependent variables expand only from variables declared before them.
    assert list(session).index("POD_IP") < list(session).index("BAE_SESSION_ADVERTISE_ADDR")
    for service, variable, value in (("bae-session", "BAE_SESSION_GRPC_ADDRS", "bae-session:50051"),
                                     ("bae-sandbox", "BAE_SANDBOX_GRPC_ADDRS", "bae-sandbox:50053")):
        user = "bae-gateway" if service == "bae-session" else "bae-session"
        container = user.removeprefix("bae-")
        assert env_of(find(objects, "Deployment", user), container)[variable]["value"] == value
        assert find(objects, "Service", service)["spec"]["clusterIP"] == "None", f"{service} must be headless"


def test_production_pins_registry_images_and_replicas() -> None:
    objects = rendered("production")
    images = [container["image"] for obj in objects if (spec := pod_spec(obj)) is not None
              for container in containers(spec)]
    assert images and all("/" in image and ":" in image.split("/")[-1] for image in images), images
    assert not [image for image in images if image.endswith(":latest")]
    for name in ("bae-gateway", "bae-session"):
        assert find(objects, "Deployment", name)["spec"]["replicas"] >= 3


def test_the_docs_name_the_validated_version() -> None:
    major_minor = ".".join(KUBERNETES_VERSION.split(".")[:2])
    assert f"Kubernetes {major_minor}" in (HERE / "README.md").read_text(encoding="utf-8")


# --- the checkers catch what they look for -----------------------------------------------------------------


def bad_deployment() -> Obj:
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "bad"},
        "spec": {"selector": {"matchLabels": {"app": "bad"}}, "template": {
            "metadata": {"labels": {"app": "bad"}},
            "spec": {"containers": [{
                "name": "bad", "image": "registry.example.com/bae-session:1", "ports": [{"name": "grpc", "containerPort": 50051}],
                "securityContext": {"runAsUser": 0, "capabilities": {"add": ["NET_ADMIN"]}},
                "resources": {"requests": {"cpu": "100m"}},
                "env": [{"name": "BAE_INTERNAL_TOKEN", "value": "0123456789abcdef0123456789abcdef"},
                        {"name": "BAE_DATABASE_URL", "value": "postgresql://bae:hunter2@db:5432/bae"},
                        {"name": "BAE_DATABASE_PASSWORD_FILE", "value": "/etc/bae/password"},
                        {"name": "PLAIN", "value": "bae_admin_0123456789abcdef0123456789abcdef0123456789abcdef"}],
            }]},
        }},
    }


def test_security_checker_reports_a_root_container() -> None:
    problems = "\n".join(security_problems(bad_deployment()))
    for expected in ("runAsNonRoot is not true", "no non-zero runAsUser", "allowPrivilegeEscalation is not false",
                     "do not drop ALL", "adds capabilities", "seccompProfile", "not read-only",
                     "no memory in resources.requests", "no cpu in resources.limits"):
        assert expected in problems


def test_secret_checker_reports_inlined_secrets() -> None:
    problems = "\n".join(secret_problems(bad_deployment()))
    assert "BAE_INTERNAL_TOKEN has a value that looks like a credential" in problems
    assert "BAE_INTERNAL_TOKEN is not from a secretKeyRef" in problems
    assert "BAE_DATABASE_URL has a value that looks like a credential" in problems
    assert "BAE_DATABASE_PASSWORD_FILE does not point into a read-only Secret volume" in problems
    assert "PLAIN has a value that looks like a credential" in problems
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "bae-secrets"},
              "stringData": {"internal-token": "x"}}
    assert secret_problems(secret) == ["Secret/bae-secrets: a Secret with data in the manifests"]


def test_exposure_checker_reports_published_internal_ports() -> None:
    load_balancer = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "bae-session"},
                     "spec": {"type": "LoadBalancer", "ports": [{"port": 443, "targetPort": "grpc"}]}}
    ingress = {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": "admin"},
               "spec": {"rules": [{"http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": {
                   "service": {"name": "bae-gateway", "port": {"number": 8081}}}}]}}]}}
    problems = exposure_problems([bad_deployment(), load_balancer, ingress])
    assert any("LoadBalancer exposes internal port" in problem for problem in problems), problems
    assert any("Ingress/admin: routes to bae-gateway port [8081]" in problem for problem in problems), problems


def test_schema_checker_rejects_an_unknown_field() -> None:
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"},
               "spec": {"ports": [{"port": 80}], "clusterIp": "None"}}
    assert schema_problems(service) != []
    del service["spec"]["clusterIp"]
    assert schema_problems(service) == []
