"""deploy/k8s, offline: the KubeRay manifests pass KubeRay's CRD schemas and the checks its
operator makes, and the plain Kubernetes objects are well formed (how they are checked:
tests/k8s_manifests.py). raydg's own invariants: test_k8s_invariants.py.
"""

from __future__ import annotations

import copy

import pytest

from tests.k8s_manifests import (
    CRDS,
    KUBERAY,
    MANIFESTS,
    SCHEMAS,
    crd_schema,
    docs,
    kuberay_errors,
    load,
    one,
    plain_errors,
    standalone_rayjob,
)


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
