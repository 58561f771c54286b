"""deploy/k8s, offline: raydg's invariants hold in its manifests (the Ray version, one image,
shared storage and MLflow for every Ray container, MLflow's store on a volume that outlives the
cluster, GPU groups from zero). That they are valid Kubernetes objects: test_k8s.py.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess

import pytest
import yaml

from tests.k8s_manifests import (
    K8S,
    MANIFESTS,
    ROOT,
    docs,
    kuberay_errors,
    load,
    one,
    standalone_rayjob,
)

# ---------------------------------------------------------------------------- helpers


def pinned(package: str) -> str:
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        name, _, version = line.split("#")[0].split(";")[0].strip().partition("==")
        if name.strip().lower() == package:
            return version.strip()
    raise AssertionError(f"constraints.txt pins no {package}")


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


# ---------------------------------------------------------------------------- tests


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


def role_problems(all_docs: list[dict]) -> list[str]:
    """Least privilege on Kubernetes: the head, the workers and the MLflow server each run
    under a ServiceAccount of their own (KubeRay binds the autoscaler's rights to create and
    delete pods to the head's: another role sharing it would share them), only the head's
    mounts an API token, and a NetworkPolicy lets only Ray pods reach the MLflow server."""
    accounts = {d["metadata"]["name"]: d for d in all_docs if d["kind"] == "ServiceAccount"}
    roles: dict[str, set[str]] = {"head": set(), "worker": set(), "mlflow": set()}
    for doc in all_docs:
        if doc["kind"] == "RayCluster":
            roles["head"].add(doc["spec"]["headGroupSpec"]["template"]["spec"][
                "serviceAccountName"])
            roles["worker"] |= {g["template"]["spec"].get("serviceAccountName", "default")
                                for g in doc["spec"].get("workerGroupSpecs", [])}
        elif doc["kind"] == "Deployment":
            roles["mlflow"].add(doc["spec"]["template"]["spec"].get("serviceAccountName",
                                                                    "default"))
    problems = [f"{a} and {b} share a ServiceAccount" for a, b in
                (("head", "worker"), ("head", "mlflow"), ("worker", "mlflow"))
                if roles[a] & roles[b]]
    problems += [f"{role}'s ServiceAccount {name} mounts an API token" for role in
                 ("worker", "mlflow") for name in roles[role]
                 if accounts.get(name, {}).get("automountServiceAccountToken", True)]
    policies = [d["spec"] for d in all_docs if d["kind"] == "NetworkPolicy"
                and d["spec"]["podSelector"].get("matchLabels", {}).get(
                    "app.kubernetes.io/name") == "raydg-mlflow"]
    peers = [peer for p in policies for rule in p.get("ingress", [])
             for peer in rule.get("from", [])]
    if not (policies and peers and all(
            peer.get("podSelector", {}).get("matchExpressions") == [
                {"key": "ray.io/cluster", "operator": "Exists"}] for peer in peers)):
        problems.append("no NetworkPolicy lets only Ray pods reach the MLflow server")
    return problems


def test_each_role_has_only_its_rights_and_mlflow_answers_only_ray_pods():
    cluster = load("raycluster.yaml")
    assert role_problems(cluster) == []
    old = [d for d in copy.deepcopy(cluster) if d["kind"] != "NetworkPolicy"]
    for doc in old:  # before 2026-11-29: one ServiceAccount, raydg, for every pod
        for node in (doc.get("spec", {}).get("template", {}).get("spec", {}),
                     *(g["template"]["spec"] for g in [
                         doc.get("spec", {}).get("headGroupSpec", {"template": {"spec": {}}}),
                         *doc.get("spec", {}).get("workerGroupSpecs", [])])):
            if "serviceAccountName" in node:
                node["serviceAccountName"] = "raydg"
    assert role_problems(old) == [
        "head and worker share a ServiceAccount", "head and mlflow share a ServiceAccount",
        "worker and mlflow share a ServiceAccount",
        "worker's ServiceAccount raydg mounts an API token",
        "mlflow's ServiceAccount raydg mounts an API token",
        "no NetworkPolicy lets only Ray pods reach the MLflow server"]
