"""deploy/k8s, offline: the KubeRay manifests pass KubeRay's CRD schemas and the checks its
operator makes, the plain Kubernetes objects are well formed, and raydg's invariants hold (the
Ray version, one image, shared storage and MLflow for every Ray container, MLflow's store on a
volume that outlives the cluster, GPU groups from zero).

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
- x-kubernetes-validations (CEL) are not evaluated: `test_no_cel_rule_applies` shows that none
  of the fields they guard appears in the manifests;
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
import shutil
import subprocess
from functools import cache
from pathlib import Path

import pytest
import yaml
from jsonschema import Draft7Validator, FormatChecker, ValidationError, validators

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "k8s"
CRDS = Path(__file__).resolve().parent / "data" / "kuberay"
KUBERAY = "v1.7.0"  # the KubeRay release the schemas come from (tests/data/kuberay/README.md)
SCHEMAS = {("ray.io/v1", "RayCluster"): "rayclusters", ("ray.io/v1", "RayJob"): "rayjobs"}
PLAIN = {("v1", "ServiceAccount"), ("v1", "ConfigMap"), ("v1", "PersistentVolumeClaim"),
         ("v1", "Service"), ("apps/v1", "Deployment")}
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


def pinned(package: str) -> str:
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        name, _, version = line.split("#")[0].split(";")[0].strip().partition("==")
        if name.strip().lower() == package:
            return version.strip()
    raise AssertionError(f"constraints.txt pins no {package}")


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
    errors = []
    if kind == "RayJob":
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
            errors += _kuberay_errors("RayCluster", spec["rayClusterSpec"])
        return errors
    auto = spec.get("enableInTreeAutoscaling", False)
    v2 = (spec.get("autoscalerOptions") or {}).get("version") == "v2"
    head = spec["headGroupSpec"]
    groups = [("head", head), *((g["groupName"], g) for g in spec.get("workerGroupSpecs", []))]
    for name, group in groups:
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
            continue
        low, high = group.get("minReplicas"), group.get("maxReplicas")
        if not auto and (low is None or high is None):
            errors.append(f"{name}: minReplicas and maxReplicas without autoscaling")
        if low is not None and high is not None and low > high:
            errors.append(f"{name}: minReplicas {low} > maxReplicas {high}")
        if "idleTimeoutSeconds" in group and not v2:
            errors.append(f"{name}: idleTimeoutSeconds needs autoscaler v2")
        if group.get("suspend") and auto:
            errors.append(f"{name}: suspended with the autoscaler enabled")
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
    allowed = {"ServiceAccount": {"apiVersion", "kind", "metadata"},
               "ConfigMap": {"apiVersion", "kind", "metadata", "data"}}
    extra = set(doc) - allowed.get(kind, {"apiVersion", "kind", "metadata", "spec"})
    errors += [f"{kind}: unknown top-level field {k}" for k in extra]
    if kind == "ConfigMap":
        for key, value in (doc.get("data") or {}).items():
            if not re.fullmatch(r"[-._a-zA-Z0-9]+", key) or not isinstance(value, str):
                errors.append(f"ConfigMap data {key}: keys [-._a-zA-Z0-9]+, values strings")
    elif kind == "PersistentVolumeClaim":
        modes = spec.get("accessModes") or []
        if not modes or set(modes) - {"ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany",
                                      "ReadWriteOncePod"}:
            errors.append(f"PVC accessModes {modes}")
        if not QUANTITY.match(str(spec.get("resources", {}).get("requests", {}).get("storage"))):
            errors.append("PVC resources.requests.storage is not a quantity")
        errors += [f"PVC: unknown {k}" for k in set(spec) - {
            "accessModes", "resources", "storageClassName", "volumeMode"}]
    elif kind == "Deployment":
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
    elif kind == "Service":
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


# ---------------------------------------------------------------------------- helpers


def ray_cluster_specs() -> list[tuple[str, dict]]:
    """The RayCluster specs in the manifests (the RayCluster, and any RayJob's own cluster)."""
    out = [(f"RayCluster {d['metadata']['name']}", d["spec"]) for d in docs("RayCluster")]
    out += [(f"RayJob {d['metadata']['name']}", d["spec"]["rayClusterSpec"])
            for d in docs("RayJob") if "rayClusterSpec" in d["spec"]]
    return out


def groups(spec: dict) -> list[dict]:
    return [spec["headGroupSpec"], *spec.get("workerGroupSpecs", [])]


def containers(doc: dict) -> list[dict]:
    """Every container of a manifest object, wherever it sits (pod templates in CRs too)."""
    found = []

    def walk(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("containers", "initContainers") and isinstance(value, list):
                    found.extend(value)
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(doc)
    return found


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: a known variable is replaced, $$ escapes, else kept."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)),
                  text)


def environment(container: dict) -> dict[str, str]:
    """A container's environment as the kubelet builds it from these manifests: envFrom, then
    env with $(VAR) expanded. Optional sources absent from the manifests are left out."""
    maps = {d["metadata"]["name"]: d.get("data", {}) for d in docs("ConfigMap")}
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            ref = source["configMapRef"]
            assert ref["name"] in maps or ref.get("optional"), f"no ConfigMap {ref['name']}"
            env.update(maps.get(ref["name"], {}))
        else:
            assert source["secretRef"].get("optional"), "a Secret the user must create"
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = expand(var["value"], env)
        else:
            ref = var["valueFrom"].get("secretKeyRef") or var["valueFrom"]["configMapKeyRef"]
            assert ref.get("optional") or ref["name"] in maps, f"{var['name']}: required source"
    return env


def volume_source(pod_spec: dict, path: str) -> tuple[dict, str]:
    """The volume under `path` in the pod's first container, and the path inside it."""
    (container, *_) = pod_spec["containers"]
    for mount in container.get("volumeMounts", []):
        root = mount["mountPath"].rstrip("/")
        if path == root or path.startswith(root + "/"):
            (volume,) = [v for v in pod_spec.get("volumes", []) if v["name"] == mount["name"]]
            return volume, path[len(root):]
    raise AssertionError(f"{path} is on no volume of {container['name']}")


def standalone_rayjob() -> dict:
    """rayjob.yaml's documented variant: a cluster of its own, deleted after the job."""
    job = copy.deepcopy(one("RayJob"))
    del job["spec"]["clusterSelector"]
    job["spec"]["rayClusterSpec"] = copy.deepcopy(one("RayCluster")["spec"])
    job["spec"].update(shutdownAfterJobFinishes=True, ttlSecondsAfterFinished=600)
    return job


# ---------------------------------------------------------------------------- tests


def test_schemas_are_kuberays_v1():
    cluster = crd_schema("rayclusters")["properties"]["spec"]
    job = crd_schema("rayjobs")["properties"]["spec"]
    assert cluster["required"] == ["headGroupSpec"]
    assert {"rayVersion", "workerGroupSpecs", "enableInTreeAutoscaling"} <= set(
        cluster["properties"])
    assert {"entrypoint", "clusterSelector", "rayClusterSpec", "ttlSecondsAfterFinished"} <= set(
        job["properties"])
    assert KUBERAY in (CRDS / "README.md").read_text()


@pytest.mark.parametrize("name", MANIFESTS)
def test_manifests_pass_kuberays_schemas_and_rules(name):
    all_docs = load(name)
    assert all_docs, f"{name} is empty"
    for doc in all_docs:
        if doc["apiVersion"].startswith("ray.io/"):
            assert kuberay_errors(doc) == [], f"{doc['kind']} {doc['metadata']['name']}"
        else:
            assert plain_errors(doc, docs()) == [], f"{doc['kind']} {doc['metadata']['name']}"


def test_standalone_rayjob_variant_passes_too():
    job = standalone_rayjob()
    assert kuberay_errors(job) == []
    job["spec"]["shutdownAfterJobFinishes"] = False  # KubeRay refuses a TTL it would not use
    assert kuberay_errors(job) == ["ttlSecondsAfterFinished needs shutdownAfterJobFinishes"]


def test_validation_refuses_mistakes():
    cluster = one("RayCluster")
    typo = copy.deepcopy(cluster)
    gpu = typo["spec"]["workerGroupSpecs"][0]
    gpu["minReplica"] = gpu.pop("minReplicas")
    # minReplicas has a default (0), so its absence is fine; the unknown key is not
    assert kuberay_errors(typo) == [
        "spec.workerGroupSpecs.0: Additional properties are not allowed ('minReplica' was "
        "unexpected)"]

    bad = copy.deepcopy(cluster)
    bad["spec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] = 4  # must be a string
    ray = bad["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    ray["resources"]["limits"]["memory"] = "lots"  # not a quantity
    ray["volumeMount"] = ray.pop("volumeMounts")  # a core/v1 field misspelt
    errors = "\n".join(kuberay_errors(bad))
    assert "rayStartParams.num-cpus: 4 is not of type 'string'" in errors
    assert "'lots' does not match" in errors
    assert "'volumeMount' was unexpected" in errors

    twice = copy.deepcopy(cluster)
    twice["spec"]["workerGroupSpecs"][1]["template"]["spec"]["containers"][0]["ports"] = [
        {"containerPort": 8000, "name": "a"}, {"containerPort": 8000, "name": "b"}]
    assert "have the same ['containerPort', 'protocol']" in "\n".join(kuberay_errors(twice))

    rules = copy.deepcopy(cluster)
    rules["spec"]["workerGroupSpecs"][0]["minReplicas"] = 9  # above maxReplicas 8
    rules["spec"]["rayVersion"] = "2.51.0"  # token auth needs 2.52
    rules["metadata"]["name"] = "Raydg"
    assert kuberay_errors(rules) == [
        "RayCluster name 'Raydg': DNS-1035 label of <= 53",
        "gpu: minReplicas 9 > maxReplicas 8",
        "authOptions.mode token needs rayVersion 2.52.0 or later",
    ]

    job = copy.deepcopy(one("RayJob"))
    job["spec"]["ttlSecondsAfterFinished"] = 600  # with clusterSelector KubeRay refuses it
    job["spec"]["entrypoints"] = job["spec"].pop("entrypoint")
    assert kuberay_errors(job) == [
        "spec: Additional properties are not allowed ('entrypoints' was unexpected)",
        "ttlSecondsAfterFinished needs shutdownAfterJobFinishes",
    ]

    deployment = copy.deepcopy(one("Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = 3
    deployment["spec"]["template"]["metadata"]["labels"] = {"app": "other"}
    assert plain_errors(deployment, docs()) == [
        "Deployment: selector.matchLabels must match the template's labels",
        "Deployment template: spec.containers.0.imagePullPolicy: 3 is not of type 'string'",
    ]


def test_no_cel_rule_applies():
    """The CEL rules (x-kubernetes-validations) guard fields that no manifest sets."""
    def guarded(node, path=()):
        if "x-kubernetes-validations" in node:
            yield path
        for name, child in node.get("properties", {}).items():
            yield from guarded(child, (*path, name))
        if isinstance(node.get("items"), dict):
            yield from guarded(node["items"], path)

    def present(node, path):
        if not path:
            return True
        items = node if isinstance(node, list) else [node]
        return any(isinstance(i, dict) and path[0] in i and present(i[path[0]], path[1:])
                   for i in items)

    checked = 0
    for doc in [*docs(), standalone_rayjob()]:
        stem = SCHEMAS.get((doc["apiVersion"], doc["kind"]))
        if stem:
            for path in guarded(crd_schema(stem)):
                checked += 1
                assert not present(doc, path), f"{doc['kind']} sets {'.'.join(path)}: CEL"
    assert checked >= 6


def test_ray_version_python_and_cuda_match_constraints():
    ray, torch = pinned("ray"), pinned("torch")
    for where, spec in ray_cluster_specs():
        assert spec["rayVersion"] == ray, where
    (base,) = re.findall(r"^FROM\s+(\S+)", (K8S / "Dockerfile").read_text(), re.M)
    match = re.fullmatch(r"rayproject/ray:(?P<ray>[\d.]+)-py(?P<py>3\d+)-cu(?P<cuda>\d+)", base)
    assert match, base
    assert match["ray"] == ray
    # torch's wheel brings its CUDA runtime (nvidia-cuda-runtime): the base image's CUDA agrees
    cuda = pinned("nvidia-cuda-runtime").split(".")
    assert match["cuda"] == f"{cuda[0]}{cuda[1]}", (base, cuda)
    # the Python of cluster.yaml's environment, which constraints.txt was resolved for
    (python,) = set(re.findall(r"--python (3\.\d+)", (ROOT / "cluster.yaml").read_text()))
    assert match["py"] == python.replace(".", "")
    assert torch.startswith("2.")


def test_image_installs_raydg_with_the_constraints():
    text = (K8S / "Dockerfile").read_text()
    installs = [line for line in text.splitlines() if "pip install" in line]
    assert installs and all("-c constraints.txt" in line for line in installs)
    assert "COPY --chown=1000:100 configs" in text and "md.version(name)" in text
    keep = (K8S / "Dockerfile.dockerignore").read_text().split()
    assert keep[keep.index("*"):] == ["*", "!pyproject.toml", "!constraints.txt", "!README.md",
                                      "!raydg/", "!configs/", "**/__pycache__"]


def test_one_image_named_once():
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert kustomization["resources"] == ["raycluster.yaml"]
    (image,) = kustomization["images"]
    found = {c["image"] for name in MANIFESTS for d in load(name) for c in containers(d)}
    found |= {c["image"] for c in containers(standalone_rayjob())}
    assert found == {image["name"]}  # kustomize replaces it by newName:newTag
    assert image["newName"] and image["newTag"]
    lines = [line for line in (K8S / "kustomization.yaml").read_text().splitlines()
             if "newName:" in line or "newTag:" in line]
    assert all("# CHANGE" in line for line in lines)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (for kustomize) absent")
def test_kustomize_renders_one_real_image():
    out = subprocess.run(["kubectl", "kustomize", str(K8S)], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    rendered = [d for d in yaml.safe_load_all(out) if d]
    (image,) = yaml.safe_load((K8S / "kustomization.yaml").read_text())["images"]
    want = f"{image['newName']}:{image['newTag']}"
    assert {c["image"] for d in rendered for c in containers(d)} == {want}
    assert sorted(d["kind"] for d in rendered) == sorted(d["kind"] for d in load(
        "raycluster.yaml"))
    for doc in rendered:
        errors = kuberay_errors(doc) if doc["apiVersion"].startswith("ray.io/") else []
        assert errors == []


def test_bucket_named_once():
    (config,) = [d for d in docs("ConfigMap") if "RAYDG_BUCKET" in d.get("data", {})]
    bucket = config["data"]["RAYDG_BUCKET"]
    assert "/" not in bucket and not bucket.startswith("s3:")
    hits = [line for name in (*MANIFESTS, "kustomization.yaml")
            for line in (K8S / name).read_text().splitlines() if bucket in line]
    assert len(hits) == 1 and "# CHANGE" in hits[0], hits


def test_every_ray_container_gets_storage_and_tracking():
    (config,) = [d for d in docs("ConfigMap") if "RAYDG_BUCKET" in d.get("data", {})]
    bucket = config["data"]["RAYDG_BUCKET"]
    service = one("Service")
    tracking = f"http://{service['metadata']['name']}:{service['spec']['ports'][0]['port']}"
    for where, spec in ray_cluster_specs():
        for group in groups(spec):
            ray = group["template"]["spec"]["containers"][0]  # KubeRay's Ray container
            env = environment(ray)
            assert env["RAYDG_STORAGE"] == f"s3://{bucket}/raydg-results", where
            assert env["MLFLOW_TRACKING_URI"] == tracking, where
        head = spec["headGroupSpec"]["template"]["spec"]
        env = environment(head["containers"][0])
        for var in ("RAYDG_DATA_ROOT", "RAYDG_CACHE"):  # datasets and their cache: on a PVC
            volume, _ = volume_source(head, env[var])
            assert volume["persistentVolumeClaim"]["claimName"] in {
                d["metadata"]["name"] for d in docs("PersistentVolumeClaim")}, (where, var)


def test_mlflow_store_outlives_the_cluster():
    deployment, service = one("Deployment"), one("Service")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "Recreate"  # one SQLite owner at a time
    pod = deployment["spec"]["template"]["spec"]
    (mlflow,) = pod["containers"]
    script = " ".join(mlflow["args"])
    store = re.search(r'--backend-store-uri "\$\{MLFLOW_BACKEND_STORE_URI:-sqlite:///(/\S+)}"',
                      script)
    assert store, script
    volume, inside = volume_source(pod, store[1])  # a PVC, not an emptyDir
    assert "emptyDir" not in volume and inside == "/mlflow.db"
    (claim,) = [d for d in docs("PersistentVolumeClaim")
                if d["metadata"]["name"] == volume["persistentVolumeClaim"]["claimName"]]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    secret = [v for v in mlflow["env"] if v["name"] == "MLFLOW_BACKEND_STORE_URI"]
    assert secret[0]["valueFrom"]["secretKeyRef"]["optional"] is True  # external DB: optional
    env = environment(mlflow)
    assert '--artifacts-destination "s3://${RAYDG_BUCKET}/mlflow-artifacts"' in script
    assert "RAYDG_BUCKET" in env and "--host 0.0.0.0" in script
    assert f"{service['metadata']['name']}:*" in script  # --allowed-hosts: the Service's name
    assert str(service["spec"]["ports"][0]["port"]) in script
    for where, spec in ray_cluster_specs():  # nothing of MLflow's inside the Ray cluster
        assert not any("mlflow" in c["name"] for c in containers(spec)), where


def test_gpu_groups_scale_from_zero():
    checked = 0
    standalone = ("standalone RayJob", standalone_rayjob()["spec"]["rayClusterSpec"])
    for where, spec in [*ray_cluster_specs(), standalone]:
        assert spec["enableInTreeAutoscaling"] is True, where
        assert spec["autoscalerOptions"]["idleTimeoutSeconds"] > 0, where
        for group in spec["workerGroupSpecs"]:
            ray = group["template"]["spec"]["containers"][0]
            gpus = ray["resources"]["limits"].get("nvidia.com/gpu")
            assert "replicas" not in group, where  # the autoscaler's; a re-apply would reset it
            if gpus:
                checked += 1
                assert group["minReplicas"] == 0 and gpus == 1, (where, group["groupName"])
                assert ray["resources"]["requests"]["nvidia.com/gpu"] == gpus
    assert checked >= 2


def test_rayjob_runs_raydg_on_the_raycluster():
    job, cluster = one("RayJob"), one("RayCluster")
    assert job["spec"]["clusterSelector"] == {"ray.io/cluster": cluster["metadata"]["name"]}
    words = job["spec"]["entrypoint"].split()
    assert words[:3] == ["python", "-m", "raydg"]
    from raydg.cli import cli
    from raydg.datasets import DATASETS
    from raydg.methods import METHODS

    command = cli.commands[words[3]]
    context = command.make_context(words[3], words[4:])  # parses; runs nothing
    assert context.params["dataset"] in DATASETS.names()
    assert context.params["method"] in METHODS.names()
