"""The manifests of deploy/k8s, loaded and checked offline, for test_k8s.py and
test_k8s_invariants.py.

The CRD schemas: the v1 openAPIV3Schema of RayCluster and RayJob from KubeRay v1.7.0, in
tests/data/kuberay/ (README there). They are Kubernetes "structural" schemas, turned into JSON
Schema the way the API server reads them (`_json_schema`):
- a field an object schema does not list is an error (the server drops it, and kubectl's
  default strict field validation refuses it): additionalProperties false, unless the schema
  says x-kubernetes-preserve-unknown-fields;
- x-kubernetes-int-or-string: an integer or a string (these CRDs also spell it as anyOf);
- x-kubernetes-list-type set: unique items; map: unique x-kubernetes-list-map-keys (checked);
  atomic, and x-kubernetes-map-type: merge strategies only, nothing to validate;
- nullable: null allowed; formats int32/int64: their ranges;
- defaults are filled in first, as the API server does (so a required field that has a
  default, like a worker group's minReplicas, may be left out);
- x-kubernetes-validations (CEL) are not evaluated: test_k8s.py's `test_no_cel_rule_applies`
  shows that none of the fields they guard appears in the manifests;
- the top-level metadata (ObjectMeta) is the API server's, checked by hand (`_check_meta`).
KubeRay's operator refuses more than its schema does (ray-operator/controllers/ray/utils/
validation.go): `_kuberay_errors` restates the rules that the manifests could break.
Kubernetes' own OpenAPI is not here; the MLflow Deployment's pod template is validated against
the core/v1 PodTemplateSpec schema that KubeRay's CRD embeds, the rest by hand.
"""

from __future__ import annotations

import copy
import gzip
import json
import re
from functools import cache
from pathlib import Path

import yaml
from jsonschema import Draft7Validator, FormatChecker, ValidationError, validators

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "k8s"
CRDS = Path(__file__).resolve().parent / "data" / "kuberay"
KUBERAY = "v1.7.0"  # the KubeRay release the schemas come from (tests/data/kuberay/README.md)
SCHEMAS = {("ray.io/v1", "RayCluster"): "rayclusters", ("ray.io/v1", "RayJob"): "rayjobs"}
PLAIN = {("v1", "ServiceAccount"), ("v1", "ConfigMap"), ("v1", "PersistentVolumeClaim"),
         ("v1", "Service"), ("apps/v1", "Deployment"), ("networking.k8s.io/v1", "NetworkPolicy")}
MANIFESTS = ("raycluster.yaml", "rayjob.yaml")
QUANTITY = re.compile(r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
                      r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$")
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
RAY_NAME_MAX = {"RayCluster": 53, "RayJob": 47}  # KubeRay's MaxRayClusterNameLength, - 6


# ---------------------------------------------------------------------------- loading


def load(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((K8S / name).read_text()) if d is not None]


def docs(kind: str | None = None, files=MANIFESTS) -> list[dict]:
    out = [d for name in files for d in load(name)]
    return [d for d in out if kind is None or d["kind"] == kind]


def one(kind: str, files=MANIFESTS) -> dict:
    (doc,) = docs(kind, files)
    return doc


# ---------------------------------------------------------------------------- CRD schemas


@cache
def crd_schema(stem: str) -> dict:
    return json.loads(gzip.decompress((CRDS / f"{stem}.v1.json.gz").read_bytes()))


VENDOR = {"x-kubernetes-int-or-string", "x-kubernetes-list-type", "x-kubernetes-list-map-keys",
          "x-kubernetes-map-type", "x-kubernetes-validations",
          "x-kubernetes-preserve-unknown-fields", "x-kubernetes-embedded-resource"}


def _json_schema(node: dict) -> dict:
    """A structural schema node as JSON Schema with the API server's reading (module doc)."""
    unknown = {k for k in node if k.startswith("x-") and k not in VENDOR}
    assert not unknown, f"a schema extension this test does not know: {unknown}"
    out = {k: v for k, v in node.items() if k not in VENDOR and k != "nullable"}
    if node.get("x-kubernetes-int-or-string") and "anyOf" not in node:
        out["type"] = ["integer", "string"]
    if node.get("nullable") and "type" in out:
        out["type"] = [*([out["type"]] if isinstance(out["type"], str) else out["type"]), "null"]
    if node.get("x-kubernetes-list-type") == "set":
        out["uniqueItems"] = True
    if node.get("x-kubernetes-list-type") == "map":
        out["x-kubernetes-list-map-keys"] = node["x-kubernetes-list-map-keys"]
    if "properties" in node:
        out["properties"] = {k: _json_schema(v) for k, v in node["properties"].items()}
    for key in ("items", "additionalProperties", "not"):
        if isinstance(node.get(key), dict):
            out[key] = _json_schema(node[key])
    for key in ("anyOf", "allOf", "oneOf"):
        if key in node:
            out[key] = [_json_schema(v) for v in node[key]]
    if (node.get("type") == "object" and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def _unique_map_keys(validator, keys, instance, schema):
    if not validator.is_type(instance, "array"):
        return
    seen: dict[str, int] = {}
    for i, item in enumerate(instance):
        if isinstance(item, dict):
            key = json.dumps([item.get(k) for k in keys])
            if key in seen:
                yield ValidationError(f"items {seen[key]} and {i} have the same {keys}: {key}")
            seen.setdefault(key, i)


Validator = validators.extend(Draft7Validator, {"x-kubernetes-list-map-keys": _unique_map_keys})
FORMATS = FormatChecker()
FORMATS.checks("int32")(lambda v: not isinstance(v, int) or -(2**31) <= v < 2**31)
FORMATS.checks("int64")(lambda v: not isinstance(v, int) or -(2**63) <= v < 2**63)


@cache
def validator(stem: str) -> Validator:
    schema = _json_schema(crd_schema(stem))
    schema["properties"]["metadata"] = {"type": "object"}  # ObjectMeta: _check_meta
    Validator.check_schema(schema)
    return Validator(schema, format_checker=FORMATS)


@cache
def pod_template_validator() -> Validator:
    """core/v1 PodTemplateSpec, as KubeRay's RayCluster CRD embeds it (head pod template)."""
    spec = crd_schema("rayclusters")["properties"]["spec"]["properties"]
    schema = _json_schema(spec["headGroupSpec"]["properties"]["template"])
    Validator.check_schema(schema)
    return Validator(schema, format_checker=FORMATS)


def defaulted(schema: dict, value):
    """`value` with the schema's defaults filled in, as the API server does before it
    validates (a required field with a default, e.g. minReplicas, may be left out)."""
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for name, sub in props.items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                value[name] = defaulted(sub, value[name])
        if isinstance(schema.get("additionalProperties"), dict):
            for name in set(value) - set(props):
                value[name] = defaulted(schema["additionalProperties"], value[name])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        value = [defaulted(schema["items"], item) for item in value]
    return value


def _messages(v: Validator, instance) -> list[str]:
    return sorted(f"{'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
                  for e in v.iter_errors(instance))


def _check_meta(doc: dict) -> list[str]:
    meta = doc.get("metadata") or {}
    kind = doc["kind"]
    # a generateName gets 5 random characters [a-z0-9] appended
    name = meta.get("name") or (meta.get("generateName", "") + "x0x0x" if meta.get(
        "generateName") else "")
    errors = [f"metadata: unknown {k}" for k in set(meta) - {
        "name", "generateName", "namespace", "labels", "annotations"}]
    if kind in RAY_NAME_MAX:  # KubeRay: a DNS-1035 label, short enough for its derived names
        if not (DNS1035_LABEL.match(name) and len(name) <= RAY_NAME_MAX[kind]):
            errors.append(f"{kind} name {name!r}: DNS-1035 label of <= {RAY_NAME_MAX[kind]}")
    elif kind == "Service":
        if not (DNS1035_LABEL.match(name) and len(name) <= 63):
            errors.append(f"Service name {name!r} is not a DNS-1035 label")
    elif not (DNS1123_SUBDOMAIN.match(name) and len(name) <= 253):
        errors.append(f"{kind} name {name!r} is not a DNS-1123 subdomain")
    for key in ("labels", "annotations"):
        if not all(isinstance(v, str) for v in (meta.get(key) or {}).values()):
            errors.append(f"metadata.{key}: values must be strings")
    if "status" in doc:
        errors.append("status is the operator's, not the manifest's")
    return errors


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def _kuberay_errors(kind: str, spec: dict) -> list[str]:
    """What KubeRay's operator refuses beyond its schema (validation.go at KUBERAY): the rules
    of ValidateRayClusterSpec / ValidateRayJobSpec that these manifests could break, with the
    feature gates at their defaults. Fields whose rules are not restated are reported."""
    return _rayjob_errors(spec) if kind == "RayJob" else _raycluster_errors(spec)


def _rayjob_errors(spec: dict) -> list[str]:
    """ValidateRayJobSpec's rules, then its own cluster's, if it has one."""
    errors = []
    shutdown = spec.get("shutdownAfterJobFinishes", False)
    selector = spec.get("clusterSelector") or {}
    if spec.get("ttlSecondsAfterFinished", 0) > 0 and not shutdown:
        errors.append("ttlSecondsAfterFinished needs shutdownAfterJobFinishes")
    if spec.get("suspend") and (not shutdown or selector):
        errors.append("suspend needs shutdownAfterJobFinishes and no clusterSelector")
    if "deletionStrategy" in spec:
        errors.append("deletionStrategy: KubeRay's rules for it are not restated here")
    if not selector and "rayClusterSpec" not in spec:
        errors.append("one of rayClusterSpec or clusterSelector must be set")
    if selector:
        if not selector.get("ray.io/cluster"):
            errors.append("clusterSelector needs ray.io/cluster: the RayCluster's name")
        if spec.get("submissionMode") == "SidecarMode":
            errors.append("clusterSelector is not supported in SidecarMode")
        if spec.get("backoffLimit", 0) > 0:
            errors.append("backoffLimit is incompatible with clusterSelector")
    if "runtimeEnvYAML" in spec and not isinstance(yaml.safe_load(spec["runtimeEnvYAML"]),
                                                   dict):
        errors.append("runtimeEnvYAML is not a YAML mapping")
    for key in ("activeDeadlineSeconds", "preRunningDeadlineSeconds"):
        if key in spec and spec[key] <= 0:
            errors.append(f"{key} must be positive")
    if "rayClusterSpec" in spec:
        errors += _raycluster_errors(spec["rayClusterSpec"])
    return errors


def _raycluster_errors(spec: dict) -> list[str]:
    """ValidateRayClusterSpec's rules: each group's, then the cluster's own."""
    auto = spec.get("enableInTreeAutoscaling", False)
    v2 = (spec.get("autoscalerOptions") or {}).get("version") == "v2"
    head = spec["headGroupSpec"]
    groups = [("head", head), *((g["groupName"], g) for g in spec.get("workerGroupSpecs", []))]
    errors = [e for name, group in groups for e in _group_errors(name, group, auto, v2)]
    if (spec.get("autoscalerOptions") or {}).get("idleTimeoutSeconds", 0) < 0:
        errors.append("autoscalerOptions.idleTimeoutSeconds is negative")
    token = (spec.get("authOptions") or {}).get("mode") == "token"
    if token and _version(spec.get("rayVersion", "0")) < (2, 52, 0):
        errors.append("authOptions.mode token needs rayVersion 2.52.0 or later")
    for field in ("networkPolicy", "tlsOptions", "historyServerOptions",
                  "gcsFaultToleranceOptions"):  # feature gates (off by default), or many rules
        if field in spec:
            errors.append(f"{field}: KubeRay's rules for it are not restated here")
    return errors


def _group_errors(name: str, group: dict, auto: bool, v2: bool) -> list[str]:
    """The rules for the head group (``name`` "head") or a worker group, with the autoscaler
    enabled or not (``auto``) and of version 2 or not (``v2``)."""
    errors = []
    pod = group["template"].get("spec", {})
    if not pod.get("containers"):
        errors.append(f"{name}: no container")
    params = group.get("rayStartParams") or {}
    if group.get("resources") and {"num-cpus", "num-gpus", "memory", "resources"} & set(
            params):
        errors.append(f"{name}: resources both in rayStartParams and resources")
    if "labels" in params:
        errors.append(f"{name}: rayStartParams['labels'], use the labels field")
    if v2 and auto and pod.get("restartPolicy", "Never") != "Never":
        errors.append(f"{name}: restartPolicy must be Never or unset with autoscaler v2")
    if name == "head":
        return errors
    low, high = group.get("minReplicas"), group.get("maxReplicas")
    if not auto and (low is None or high is None):
        errors.append(f"{name}: minReplicas and maxReplicas without autoscaling")
    if low is not None and high is not None and low > high:
        errors.append(f"{name}: minReplicas {low} > maxReplicas {high}")
    if "idleTimeoutSeconds" in group and not v2:
        errors.append(f"{name}: idleTimeoutSeconds needs autoscaler v2")
    if group.get("suspend") and auto:
        errors.append(f"{name}: suspended with the autoscaler enabled")
    return errors


def kuberay_errors(doc: dict) -> list[str]:
    """Everything wrong with a ray.io custom resource: schema, metadata, operator rules."""
    stem = SCHEMAS.get((doc.get("apiVersion"), doc.get("kind")))
    if stem is None:
        return [f"no CRD schema here for {doc.get('apiVersion')} {doc.get('kind')}"]
    full = defaulted(crd_schema(stem), copy.deepcopy(doc))  # the operator sees defaults too
    return (_messages(validator(stem), full) + _check_meta(doc)
            + _kuberay_errors(doc["kind"], full.get("spec") or {}))


def plain_errors(doc: dict, all_docs: list[dict]) -> list[str]:
    """The plain Kubernetes objects, by hand (their API's OpenAPI is not available offline)."""
    kind, spec = doc["kind"], doc.get("spec") or {}
    if (doc.get("apiVersion"), kind) not in PLAIN:
        return [f"unexpected object {doc.get('apiVersion')} {kind}"]
    errors = _check_meta(doc)
    allowed = {"ServiceAccount": {"apiVersion", "kind", "metadata",
                                  "automountServiceAccountToken"},
               "ConfigMap": {"apiVersion", "kind", "metadata", "data"}}
    extra = set(doc) - allowed.get(kind, {"apiVersion", "kind", "metadata", "spec"})
    errors += [f"{kind}: unknown top-level field {k}" for k in extra]
    if kind == "ConfigMap":
        errors += _configmap_errors(doc.get("data") or {})
    elif kind == "PersistentVolumeClaim":
        errors += _pvc_errors(spec)
    elif kind == "Deployment":
        errors += _deployment_errors(spec)
    elif kind == "Service":
        errors += _service_errors(spec, all_docs)
    elif kind == "NetworkPolicy":
        errors += _network_policy_errors(spec, all_docs)
    if kind == "ServiceAccount" and not isinstance(doc.get("automountServiceAccountToken",
                                                           True), bool):
        errors.append("ServiceAccount automountServiceAccountToken must be a boolean")
    return errors


def _network_policy_errors(spec: dict, all_docs: list[dict]) -> list[str]:
    """A NetworkPolicy's spec: it selects a pod template here, its policy types and its
    ingress peers (pod selectors with valid label selectors) and ports are valid."""
    errors = [f"NetworkPolicy: unknown {k}" for k in set(spec) - {
        "podSelector", "policyTypes", "ingress", "egress"}]
    pods = [d["spec"]["template"] for d in all_docs if d["kind"] == "Deployment"]
    wanted = spec.get("podSelector", {}).get("matchLabels", {})
    if not wanted or not any(all(t["metadata"].get("labels", {}).get(k) == v
                                 for k, v in wanted.items()) for t in pods):
        errors.append("NetworkPolicy: its podSelector matches no pod template here")
    if set(spec.get("policyTypes", [])) - {"Ingress", "Egress"}:
        errors.append("NetworkPolicy policyTypes")
    for rule in spec.get("ingress", []):
        errors += [f"NetworkPolicy ingress: unknown {k}" for k in set(rule) - {"from", "ports"}]
        for peer in rule.get("from", []):
            for expression in peer.get("podSelector", {}).get("matchExpressions", []):
                if expression.get("operator") not in ("In", "NotIn", "Exists", "DoesNotExist"):
                    errors.append(f"NetworkPolicy matchExpressions operator {expression}")
        for port in rule.get("ports", []):
            if not isinstance(port.get("port"), int | str):
                errors.append(f"NetworkPolicy port {port}")
    return errors


def _configmap_errors(data: dict) -> list[str]:
    """A ConfigMap's data: keys [-._a-zA-Z0-9]+, values strings."""
    errors = []
    for key, value in data.items():
        if not re.fullmatch(r"[-._a-zA-Z0-9]+", key) or not isinstance(value, str):
            errors.append(f"ConfigMap data {key}: keys [-._a-zA-Z0-9]+, values strings")
    return errors


def _pvc_errors(spec: dict) -> list[str]:
    """A PersistentVolumeClaim's spec: access modes, a storage quantity, no unknown field."""
    errors = []
    modes = spec.get("accessModes") or []
    if not modes or set(modes) - {"ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany",
                                  "ReadWriteOncePod"}:
        errors.append(f"PVC accessModes {modes}")
    if not QUANTITY.match(str(spec.get("resources", {}).get("requests", {}).get("storage"))):
        errors.append("PVC resources.requests.storage is not a quantity")
    errors += [f"PVC: unknown {k}" for k in set(spec) - {
        "accessModes", "resources", "storageClassName", "volumeMode"}]
    return errors


def _deployment_errors(spec: dict) -> list[str]:
    """A Deployment's spec: its selector, strategy and fields, its pod template's schema."""
    errors = []
    template = spec.get("template", {})
    labels = template.get("metadata", {}).get("labels", {})
    match = spec.get("selector", {}).get("matchLabels", {})
    if not match or any(labels.get(k) != v for k, v in match.items()):
        errors.append("Deployment: selector.matchLabels must match the template's labels")
    if spec.get("strategy", {}).get("type", "RollingUpdate") not in ("Recreate",
                                                                      "RollingUpdate"):
        errors.append("Deployment: strategy.type")
    errors += [f"Deployment: unknown {k}" for k in set(spec) - {
        "replicas", "selector", "strategy", "template", "revisionHistoryLimit",
        "minReadySeconds", "progressDeadlineSeconds", "paused"}]
    pod_schema = crd_schema("rayclusters")["properties"]["spec"]["properties"][
        "headGroupSpec"]["properties"]["template"]
    errors += [f"Deployment template: {m}" for m in _messages(
        pod_template_validator(), defaulted(pod_schema, copy.deepcopy(template)))]
    return errors


def _service_errors(spec: dict, all_docs: list[dict]) -> list[str]:
    """A Service's spec: it selects a pod template of ``all_docs`` whose container ports it
    names, its ports are valid, and its type is known."""
    errors = []
    pods = [d["spec"]["template"] for d in all_docs if d["kind"] == "Deployment"]
    chosen = [t for t in pods if spec.get("selector") and all(
        t["metadata"].get("labels", {}).get(k) == v for k, v in spec["selector"].items())]
    if not chosen:
        errors.append("Service: its selector matches no pod template here")
    names = {p.get("name") for t in chosen for c in t["spec"]["containers"]
             for p in c.get("ports", [])}
    for port in spec.get("ports") or [{}]:
        if not (isinstance(port.get("port"), int) and 0 < port["port"] < 65536):
            errors.append(f"Service port {port}")
        target = port.get("targetPort", port.get("port"))
        if isinstance(target, str) and target not in names:
            errors.append(f"Service targetPort {target!r} names no container port")
    if spec.get("type", "ClusterIP") not in ("ClusterIP", "NodePort", "LoadBalancer"):
        errors.append("Service type")
    return errors


# ---------------------------------------------------------------------------- manifests


def standalone_rayjob() -> dict:
    """rayjob.yaml's documented variant: a cluster of its own, deleted after the job."""
    job = copy.deepcopy(one("RayJob"))
    del job["spec"]["clusterSelector"]
    job["spec"]["rayClusterSpec"] = copy.deepcopy(one("RayCluster")["spec"])
    job["spec"].update(shutdownAfterJobFinishes=True, ttlSecondsAfterFinished=600)
    return job
