"""deploy/kuberay checked offline: no cluster, no kustomize binary, no network.

Each kustomization is rendered here as `kubectl apply -k` would render it (a small renderer for the part of
kustomize the manifests use; where `kubectl` is installed, its own rendering must agree). Then:

- Kubernetes' own kinds (ConfigMap, Secret, Deployment, Job, PVC, Service) and every pod template inside
  KubeRay's resources are checked against Kubernetes' OpenAPI schemas (kubernetes-validate, strict: an
  unknown field fails);
- RayCluster and RayJob are checked against deploy/kuberay/schema/, this repository's own JSON schema of
  the fields used, written from KubeRay v1.7.0's CRDs, after the CRD's defaults are filled in;
- what the notebooks need: every variable helpers.settings reads for the object store, MLflow and lakeFS
  reaches every Ray pod and job submitter; the RayJobs run notebooks and parameters that exist, with values
  the notebooks accept; Secrets hold placeholders only.

Every check is a function that returns the problems it finds, so that the tests at the end can show that
each one refuses a broken manifest.
"""

from __future__ import annotations

import ast
import copy
import json
import re
import secrets
import shlex
import shutil
import subprocess
from functools import cache
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from dotenv import dotenv_values

from helpers.settings import _SECRET_FIELDS, ENV_NAMES
from helpers.worker_env import KEYS_FROM_CLUSTER_ENV

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kuberay"
OVERLAYS = ("overlays/cpu", "overlays/gpu")
KUSTOMIZATIONS = (*OVERLAYS, "services")
SCHEMA = DEPLOY / "schema" / "kuberay-v1.7.0.schema.yaml"
# The oldest Kubernetes these manifests are meant for, and the newest kubernetes-validate knows
K8S_VERSIONS = ("1.30", kubernetes_validate.latest_version())

SETTINGS_CONFIGMAP, CREDENTIALS, TOKENS = "mnist-settings", "mnist-credentials", "mnist-tokens"
# What the notebooks read for the object store, MLflow and lakeFS: the first (canonical) name of each
# setting of helpers.settings. The bucket has a default; RAY_ADDRESS is set by Ray for a job's driver.
SERVICE_SETTINGS = {setting: names[0] for setting, names in ENV_NAMES.items()
                    if setting.startswith(("s3_", "mlflow_", "lakefs_"))}
KNOWN_ENV = {name for names in ENV_NAMES.values() for name in names} | {KEYS_FROM_CLUSTER_ENV}
SECRET_ENV = {ENV_NAMES[setting][0] for setting in _SECRET_FIELDS} | {"MLFLOW_TRACKING_USERNAME"}
PLACEHOLDER = re.compile(r"change-?me", re.IGNORECASE)


# ---------------------------------------------------------------------------------------------------------
# The renderer: resources (files and folders), patches (JSON patches with a target), namespace, images.

KUSTOMIZATION_KEYS = {"apiVersion", "kind", "resources", "patches", "namespace", "images"}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "StorageClass",
                  "PersistentVolume"}


class StrictLoader(yaml.SafeLoader):
    """YAML as kubectl reads it: a key given twice in one mapping is an error (PyYAML would keep the last)."""

    def construct_mapping(self, node, deep=False):
        keys = [self.construct_object(key, deep=deep) for key, _ in node.value]
        twice = {key for key in keys if keys.count(key) > 1}
        if twice:
            raise yaml.constructor.ConstructorError(None, None, f"keys given twice: {sorted(twice)}", node.start_mark)
        return super().construct_mapping(node, deep=deep)


def load_documents(path: Path) -> list[dict]:
    return load_documents_text(path.read_text())


def load_documents_text(text: str) -> list[dict]:
    return [doc for doc in yaml.load_all(text, Loader=StrictLoader) if doc is not None]


def render(folder: Path) -> list[dict]:
    """What `kubectl apply -k folder` applies, for the kustomize features deploy/kuberay uses.

    Anything else in a kustomization fails here, so that a new feature is added to this renderer (and
    checked against kubectl's rendering) before a test can pass on a rendering that kustomize would not make.
    """
    [kustomization] = load_documents(folder / "kustomization.yaml")
    unknown = set(kustomization) - KUSTOMIZATION_KEYS
    assert not unknown, f"{folder}: tests/deploy/test_deploy.py's renderer does not know {sorted(unknown)}"
    objects: list[dict] = []
    for entry in kustomization.get("resources", []):
        path = (folder / entry).resolve()
        objects += render(path) if path.is_dir() else load_documents(path)
    # kustomize's order of built-in transformers: patches, then the namespace, then images
    for patch in kustomization.get("patches", []):
        [operations] = load_documents_text(patch["patch"] if "patch" in patch else (folder / patch["path"]).read_text())
        assert isinstance(operations, list), "only JSON patches (RFC 6902): KubeRay's kinds have no merge keys"
        targets = [obj for obj in objects if matches(obj, patch["target"])]
        assert targets, f"{folder}: a patch matches nothing: {patch['target']}"
        for obj in targets:
            json_patch(obj, operations)
    if "namespace" in kustomization:
        for obj in objects:
            assert obj["kind"] not in CLUSTER_SCOPED, obj["kind"]
            obj.setdefault("metadata", {})["namespace"] = kustomization["namespace"]
    for image in kustomization.get("images", []):
        set_image(objects, image)
    return objects


def matches(obj: dict, target: dict) -> bool:
    """Whether a patch's target (a kind, and a name if given) selects ``obj``."""
    assert set(target) <= {"kind", "name"}, f"the renderer selects by kind and name only: {target}"
    return obj["kind"] == target["kind"] and obj["metadata"]["name"] == target.get("name", obj["metadata"]["name"])


def _pointer(path: str) -> list[str]:
    assert path.startswith("/"), path
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def json_patch(doc: dict, operations: list[dict]) -> None:
    """Apply RFC 6902 operations (add, replace, remove) in place."""
    for operation in operations:
        *parents, last = _pointer(operation["path"])
        node = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        op = operation["op"]
        if isinstance(node, list):
            index = len(node) if last == "-" else int(last)
            if op == "add":
                node.insert(index, copy.deepcopy(operation["value"]))
            elif op == "replace":
                node[index] = copy.deepcopy(operation["value"])
            elif op == "remove":
                del node[index]
            else:
                raise AssertionError(f"JSON patch op {op} is not supported here")
        else:
            assert op in ("add", "replace", "remove"), f"JSON patch op {op} is not supported here"
            if op in ("replace", "remove"):
                assert last in node, f"{op} {operation['path']}: no such field"
            if op == "remove":
                del node[last]
            else:
                node[last] = copy.deepcopy(operation["value"])


def _image_name(image: str) -> str:
    """The image's name without tag or digest (a registry's port stays)."""
    name = image.split("@", 1)[0]
    slash, colon = name.rfind("/"), name.rfind(":")
    return name[:colon] if colon > slash else name


def set_image(objects: list[dict], image: dict) -> None:
    """kustomize's `images:`: every `image` in a list called containers or initContainers, at any depth."""

    def visit(node) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("containers", "initContainers") and isinstance(value, list):
                    for container in value:
                        if _image_name(container.get("image", "")) == image["name"]:
                            name = image.get("newName", image["name"])
                            if "digest" in image:
                                container["image"] = f"{name}@{image['digest']}"
                            else:
                                old = container["image"].split("@", 1)[0]
                                tag = image.get("newTag", old[len(_image_name(old)) + 1:])  # "" when untagged
                                container["image"] = f"{name}:{tag}" if tag else name
                visit(value)
        elif isinstance(node, list):
            for item in node:
                visit(item)

    visit(objects)


@cache
def _rendered(name: str) -> str:
    return json.dumps(render(DEPLOY / name))


def rendered(name: str) -> list[dict]:
    """A fresh copy of a kustomization's rendering (tests may break it)."""
    return json.loads(_rendered(name))


def by_kind(objects: list[dict], kind: str) -> list[dict]:
    return [obj for obj in objects if obj["kind"] == kind]


def one(objects: list[dict], kind: str, name: str) -> dict:
    [obj] = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return obj


def example_secrets() -> list[dict]:
    return load_documents(DEPLOY / "secret.example.yaml")


# ---------------------------------------------------------------------------------------------------------
# The checks: each returns the problems it finds.

def ray_cluster_specs(obj: dict) -> list[dict]:
    if obj["kind"] == "RayCluster":
        return [obj["spec"]]
    if obj["kind"] == "RayJob" and "rayClusterSpec" in obj["spec"]:
        return [obj["spec"]["rayClusterSpec"]]
    return []


def pod_templates(obj: dict) -> list[tuple[str, dict]]:
    """``(role, template)`` of every pod an object makes: Ray's head and workers, a job's submitter, a Deployment's."""
    found = []
    for spec in ray_cluster_specs(obj):
        found.append(("head", spec["headGroupSpec"]["template"]))
        found += [("worker", group["template"]) for group in spec.get("workerGroupSpecs", [])]
    if obj["kind"] == "RayJob" and "submitterPodTemplate" in obj["spec"]:
        found.append(("submitter", obj["spec"]["submitterPodTemplate"]))
    if obj["kind"] in ("Deployment", "StatefulSet", "Job"):
        found.append(("pod", obj["spec"]["template"]))
    return found


def core_problems(obj: dict) -> list[str]:
    """Kubernetes' schema (strict) for a core kind, and for every pod template inside KubeRay's kinds."""
    documents = [obj] if not obj["apiVersion"].startswith("ray.io/") else [
        {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"{obj['metadata']['name']}-{role}"},
         "template": template} for role, template in pod_templates(obj)]
    problems = []
    for document in documents:
        for version in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(document, version, strict=True)
            except kubernetes_validate.ValidationError as err:
                where = ".".join(map(str, err.path))
                problems.append(f"{document['kind']}/{document['metadata']['name']} (Kubernetes {version}): "
                                f"{where}: {err.message}")
    return problems


@cache
def kuberay_schema() -> dict:
    [schema] = load_documents(SCHEMA)
    return schema


def _resolve(schema: dict) -> dict:
    """A schema with its ``$ref`` (to this file's $defs) merged in, for reading properties and defaults."""
    while "$ref" in schema:
        target = kuberay_schema()["$defs"][schema["$ref"].removeprefix("#/$defs/")]
        schema = {**target, **{k: v for k, v in schema.items() if k != "$ref"},
                  "properties": {**target.get("properties", {}), **schema.get("properties", {})}}
    return schema


def fill_defaults(instance, schema: dict) -> None:
    """Fill in the schema's defaults, as the API server does before it validates a custom resource."""
    schema = _resolve(schema)
    if isinstance(instance, dict):
        for name, prop in schema.get("properties", {}).items():
            if name not in instance and "default" in prop:
                instance[name] = copy.deepcopy(prop["default"])
            if name in instance:
                fill_defaults(instance[name], prop)
    elif isinstance(instance, list) and "items" in schema:
        for item in instance:
            fill_defaults(item, schema["items"])


def kuberay_problems(obj: dict) -> list[str]:
    """A RayCluster or RayJob against our schema of KubeRay v1.7.0's CRD (defaults filled in); the operator's rules."""
    problems = []
    # KubeRay's operator wants both replica bounds set when the autoscaler is off; the CRD's defaults would hide it
    for spec in ray_cluster_specs(obj):
        for group in spec.get("workerGroupSpecs", []):
            if not spec.get("enableInTreeAutoscaling") and not {"minReplicas", "maxReplicas"} <= set(group):
                problems.append(f"worker group {group.get('groupName')}: set minReplicas and maxReplicas")
            low, high = group.get("minReplicas", 0), group.get("maxReplicas", 2**31 - 1)
            if isinstance(low, int) and isinstance(high, int) and low > high:
                problems.append(f"worker group {group.get('groupName')}: minReplicas {low} > maxReplicas {high}")
    schema = {key: value for key, value in kuberay_schema().items() if key != "oneOf"}
    kind = obj.get("kind")
    if kind not in ("RayCluster", "RayJob"):
        return [*problems, f"not a KubeRay kind: {kind}"]
    schema["$ref"] = f"#/$defs/{kind}"
    instance = copy.deepcopy(obj)
    fill_defaults(instance, schema)
    validator = jsonschema.Draft202012Validator(schema)
    for error in sorted(validator.iter_errors(instance), key=lambda e: list(map(str, e.absolute_path))):
        where = ".".join(map(str, error.absolute_path)) or "(top)"
        problems.append(f"{kind}/{obj['metadata'].get('name')}: {where}: {error.message}")
    return problems


def env_sources(template: dict, configmaps: dict[str, set[str]], secret_keys: dict[str, set[str]]) -> set[str]:
    """The variable names a pod template's first container gets (env and envFrom)."""
    container = template["spec"]["containers"][0]
    names = {entry["name"] for entry in container.get("env", [])}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            names |= configmaps.get(source["configMapRef"]["name"], set())
        if "secretRef" in source:
            names |= secret_keys.get(source["secretRef"]["name"], set())
    return names


def env_problems(objects: list[dict], secret_docs: list[dict]) -> list[str]:
    """Every Ray pod and job submitter gets every variable the notebooks read for S3, MLflow and lakeFS."""
    configmaps = {cm["metadata"]["name"]: set(cm.get("data", {})) for cm in by_kind(objects, "ConfigMap")}
    secret_keys = {s["metadata"]["name"]: set(s.get("stringData", s.get("data", {}))) for s in secret_docs}
    problems = []
    for obj in objects:
        if obj["kind"] not in ("RayCluster", "RayJob"):
            continue
        for role, template in pod_templates(obj):
            missing = set(SERVICE_SETTINGS.values()) - env_sources(template, configmaps, secret_keys)
            if missing:
                problems.append(f"{obj['kind']}/{obj['metadata']['name']} {role}: no {sorted(missing)}")
    for name, keys in configmaps.items():
        if keys - KNOWN_ENV:
            problems.append(f"ConfigMap {name}: {sorted(keys - KNOWN_ENV)} are not variables helpers reads")
        if keys & SECRET_ENV:
            problems.append(f"ConfigMap {name}: {sorted(keys & SECRET_ENV)} belong in the Secret")
    return problems


def secret_problems(docs: list[dict]) -> list[str]:
    """A committed Secret holds placeholders only: a value that is not one is taken for a real secret."""
    problems = []
    for doc in docs:
        if doc["kind"] != "Secret":
            continue
        assert "data" not in doc, "stringData only: base64 would hide what is committed"
        for key, value in doc.get("stringData", {}).items():
            if not PLACEHOLDER.search(str(value)):
                problems.append(f"Secret {doc['metadata']['name']}: {key} holds a value that is not a placeholder")
    return problems


def parameters_cell(notebook: Path) -> dict[str, object]:
    """The names and default values of a notebook's cell tagged `parameters`."""
    cells = json.loads(notebook.read_text())["cells"]
    [source] = ["".join(c["source"]) for c in cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    return {node.targets[0].id: ast.literal_eval(node.value) for node in ast.parse(source).body
            if isinstance(node, ast.Assign)}


def entrypoint_script(entrypoint: str) -> tuple[str | None, list[str]]:
    """The `bash -c` script as the job's shell gets it, after the submitter's bash and Ray's shlex.join."""
    try:
        words = shlex.split(entrypoint)  # the submitter: `bash -ce "... ray job submit -- <entrypoint> ;"`
    except ValueError as err:  # an unclosed quote: the submitter's bash would stop there too
        return None, [f"the entrypoint must be one quoted `bash -c '...'` script that survives two shells: {err}"]
    again = shlex.split(shlex.join(words))  # `ray job submit` joins the words; the job's shell splits them
    if again != words or words[:2] != ["bash", "-c"] or len(words) != 3:
        return None, [f"the entrypoint must be one quoted `bash -c '...'` script that survives two shells: {words}"]
    return words[2], []


def commands(script: str) -> list[list[str]]:
    """The simple commands of a shell script (split at ; && || |)."""
    lexer = shlex.shlex(script, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    found, current = [], []
    for token in lexer:
        if set(token) <= set(";&|"):
            found, current = found + [current], []
        else:
            current.append(token)
    return [command for command in found + [current] if command]


def papermill_run(script: str) -> tuple[dict | None, list[str]]:
    """Papermill's own parsing of the script's papermill command."""
    from papermill.cli import papermill as papermill_cli

    runs = [command for command in commands(script) if command[0] == "papermill"]
    if len(runs) != 1:
        return None, [f"one papermill command expected, found {len(runs)}"]
    try:
        return papermill_cli.make_context("papermill", runs[0][1:]).params, []
    except Exception as err:  # click's UsageError and kin: an option papermill does not know
        return None, [f"papermill refuses its arguments: {err}"]


def entrypoint_problems(job: dict) -> list[str]:
    """The RayJob runs, from the image's /workspace, a notebook that exists with parameters it has and accepts."""
    from papermill.cli import _resolve_type

    from helpers.parameters import check_parameters
    from helpers.settings import ParameterError

    script, problems = entrypoint_script(job["spec"]["entrypoint"])
    if script is None:
        return problems
    if shutil.which("bash"):
        syntax = subprocess.run(["bash", "-n", "-c", script], capture_output=True, text=True)
        if syntax.returncode:
            problems.append(f"bash refuses the script: {syntax.stderr.strip()}")
    steps = commands(script)
    if steps[0] != ["cd", "/workspace"]:
        problems.append("the script must start in the image's /workspace (the repository's root)")
    params, found = papermill_run(script)
    if params is None:
        return problems + found
    notebook = ROOT / params["notebook_path"]
    if not notebook.is_file() or notebook.parent != ROOT / "notebooks":
        return problems + [f"no notebook {params['notebook_path']} in notebooks/"]
    if params["cwd"] != "notebooks":
        problems.append("papermill must run the notebook in notebooks/ (--cwd notebooks), as make run does")
    declared = parameters_cell(notebook)
    values = {name: _resolve_type(value) for name, value in params["parameters"]}
    unknown = set(values) - set(declared)
    if unknown:
        problems.append(f"{notebook.name} has no parameters {sorted(unknown)}")
    try:
        check_parameters(notebook.name[:2], values)
    except ParameterError as err:
        problems.append(f"{notebook.name} refuses a value: {err}")
    # the executed notebook is copied into the object store with helpers.storage (the cluster goes away)
    uploads = [command for command in steps if command[:2] == ["python", "-c"]]
    if len(uploads) != 1 or uploads[0][-1] != params["output_path"]:
        problems.append("the executed notebook must be copied to the object store: python -c ... BUCKET KEY OUTPUT")
    else:
        code = uploads[0][2]
        compile(code, "<entrypoint>", "exec")
        import helpers.storage

        used = set(re.findall(r"from helpers\.storage import ([\w, ]+)", code)[0].replace(" ", "").split(","))
        problems += [f"helpers.storage has no {name}" for name in used if not hasattr(helpers.storage, name)]
    return problems


# ---------------------------------------------------------------------------------------------------------
# The manifests as they are.

@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_renderer_agrees_with_kubectl(name):
    kubectl = shutil.which("kubectl")
    if not kubectl:
        pytest.skip("kubectl is not installed: the renderer is checked where it is")
    result = subprocess.run([kubectl, "kustomize", str(DEPLOY / name)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    key = lambda obj: (obj["kind"], obj["metadata"]["name"])  # noqa: E731
    assert sorted(load_documents_text(result.stdout), key=key) == sorted(rendered(name), key=key)


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_core_kinds_and_pod_templates_pass_kubernetes_schemas(name):
    problems = [problem for obj in rendered(name) for problem in core_problems(obj)]
    assert not problems, "\n".join(problems)


def test_example_secrets_pass_kubernetes_schemas_and_hold_placeholders_only():
    docs = example_secrets()
    assert {doc["metadata"]["name"] for doc in docs} == {CREDENTIALS, TOKENS}
    assert not [problem for doc in docs for problem in core_problems(doc)]
    assert not secret_problems(docs)
    env_file = dotenv_values(DEPLOY / "secrets.env.example")
    assert not [key for key, value in env_file.items() if not PLACEHOLDER.search(value or "")]
    assert set(env_file) == set(one(docs, "Secret", CREDENTIALS)["stringData"]), "the two examples agree"
    assert "secrets.env" in (DEPLOY / ".gitignore").read_text().split(), "your filled-in copy is never committed"


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_no_kustomization_applies_a_secret(name):
    """`kubectl apply -k` would overwrite the Secrets the user created with placeholders."""
    assert not by_kind(rendered(name), "Secret")


@pytest.mark.parametrize("name", OVERLAYS)
def test_ray_cluster_and_jobs_pass_the_kuberay_schema(name):
    objects = rendered(name)
    assert {obj["kind"] for obj in objects} == {"ConfigMap", "RayCluster", "RayJob"}
    problems = [problem for obj in objects if obj["kind"].startswith("Ray") for problem in kuberay_problems(obj)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", OVERLAYS)
def test_every_ray_pod_and_submitter_gets_what_the_notebooks_read(name):
    assert not env_problems(rendered(name), example_secrets())
    for obj in rendered(name):
        for role, template in pod_templates(obj):
            sources = template["spec"]["containers"][0]["envFrom"]
            assert {"configMapRef": {"name": SETTINGS_CONFIGMAP}} in sources, role
            assert {"secretRef": {"name": CREDENTIALS}} in sources, role
    settings = one(rendered(name), "ConfigMap", SETTINGS_CONFIGMAP)["data"]
    assert settings[KEYS_FROM_CLUSTER_ENV] == "true", "the keys are in every pod: no job's runtime_env carries them"


@pytest.mark.parametrize("name", OVERLAYS)
def test_ray_token_authentication_is_on_with_the_users_secret(name):
    tokens = one(example_secrets(), "Secret", TOKENS)["stringData"]
    for obj in by_kind(rendered(name), "RayCluster") + by_kind(rendered(name), "RayJob"):
        [spec] = ray_cluster_specs(obj)
        assert spec["authOptions"] == {"mode": "token", "secretName": TOKENS}
        assert "auth_token" in tokens, "KubeRay reads the token from the key auth_token"
        version = tuple(map(int, spec["rayVersion"].split(".")))
        pinned = re.search(r"^ray\[[^]]*\]==(\S+)", (ROOT / "requirements.txt").read_text(), re.M).group(1)
        assert spec["rayVersion"] == pinned and version >= (2, 52), "the image's Ray, with token authentication"


@pytest.mark.parametrize("name", OVERLAYS)
def test_every_ray_pod_runs_the_one_image_with_shm_and_resources(name):
    objects = rendered(name)
    overlay = yaml.safe_load((DEPLOY / name / "kustomization.yaml").read_text())["images"]
    [image] = [f"{i['newName']}:{i['newTag']}" for i in overlay if i["name"] == "mnist-object-storage/jupyter"]
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    assert _image_name(compose["jupyter"]["image"]) == "mnist-object-storage/jupyter", "the name the overlays map"
    for obj in objects:
        for role, template in pod_templates(obj):
            container = template["spec"]["containers"][0]
            assert container["image"] == image, f"{obj['metadata']['name']} {role}"
            assert container["resources"]["requests"] and container["resources"]["limits"], role
            if role in ("head", "worker"):
                [shm] = [v for v in template["spec"]["volumes"] if v["name"] == "shared-mem"]
                assert shm["emptyDir"]["medium"] == "Memory" and shm["emptyDir"]["sizeLimit"]
                assert {"name": "shared-mem", "mountPath": "/dev/shm"} in container["volumeMounts"]


@pytest.mark.parametrize("name", OVERLAYS)
def test_jobs_run_on_their_own_cluster_of_the_ray_clusters_spec_and_clean_up(name):
    objects = rendered(name)
    [cluster] = by_kind(objects, "RayCluster")
    jobs = {job["metadata"]["name"]: job for job in by_kind(objects, "RayJob")}
    assert set(jobs) == {"mnist-04", "mnist-07"}
    for job in jobs.values():
        assert job["spec"]["rayClusterSpec"] == cluster["spec"], "one cluster spec (base/raycluster.yaml's)"
        assert job["spec"]["shutdownAfterJobFinishes"] is True and job["spec"]["ttlSecondsAfterFinished"] > 0
    assert not jobs["mnist-04"]["spec"].get("suspend")
    assert jobs["mnist-07"]["spec"]["suspend"] is True, "07 needs 04's model: it waits to be started"


@pytest.mark.parametrize("name", OVERLAYS)
def test_jobs_run_notebooks_and_parameters_that_exist(name):
    for job in by_kind(rendered(name), "RayJob"):
        assert not entrypoint_problems(job), entrypoint_problems(job)


def test_the_image_holds_the_notebooks_the_jobs_run():
    dockerfile = (ROOT / "docker" / "jupyter.Dockerfile").read_text()
    assert re.search(r"^WORKDIR /workspace$", dockerfile, re.M)
    assert re.search(r"^COPY (--chown=1000:1000 )?notebooks \./notebooks$", dockerfile, re.M)
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert "notebooks" not in ignored and "notebooks/" not in ignored
    uid = int(re.search(r"useradd .*--uid (\d+)", dockerfile).group(1))
    for name in OVERLAYS:
        for obj in rendered(name):
            for role, template in pod_templates(obj):
                assert template["spec"]["securityContext"]["runAsUser"] == uid, f"{role}: the image's own user"


def test_gpu_variant_differs_from_cpu_only_in_gpus():
    cpu, gpu = rendered("overlays/cpu"), rendered("overlays/gpu")
    for variant, want in ((cpu, None), (gpu, "1")):
        for obj in variant:
            for spec in ray_cluster_specs(obj):
                head = spec["headGroupSpec"]["template"]["spec"]["containers"][0]
                assert "nvidia.com/gpu" not in head["resources"]["limits"], "the head needs no GPU"
                for group in spec["workerGroupSpecs"]:
                    limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
                    assert limits.get("nvidia.com/gpu") == want
    for job in by_kind(gpu, "RayJob"):
        [twin] = [j for j in by_kind(cpu, "RayJob") if j["metadata"]["name"] == job["metadata"]["name"]]
        gpu_script, cpu_script = (entrypoint_script(j["spec"]["entrypoint"])[0] for j in (job, twin))
        assert papermill_run(gpu_script)[0]["parameters"] == (*papermill_run(cpu_script)[0]["parameters"],
                                                              ("use_gpu", "True"))
        assert gpu_script.replace(" -p use_gpu True", "") == cpu_script, "nothing else differs"


def test_services_match_docker_compose():
    objects = rendered("services")
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    minio = one(objects, "Deployment", "minio")["spec"]["template"]["spec"]["containers"][0]
    assert minio["image"] == compose["minio"]["image"]
    [job] = by_kind(objects, "Job")
    mc = job["spec"]["template"]["spec"]["containers"][0]
    assert mc["image"] == compose["minio-init"]["image"]
    script = mc["command"][-1]
    compose_buckets = set(re.findall(r"local/(\w+)", compose["minio-init"]["entrypoint"][-1]))
    assert set(re.findall(r"local/(\w+)", script)) == compose_buckets >= {"mnist", "mlflow", "ray", "lakefs"}
    assert "anonymous" not in script and "policy" not in script
    for obj in objects:
        for _, template in pod_templates(obj):
            for container in template["spec"]["containers"]:
                assert container["resources"]["requests"] and container["resources"]["limits"], container["name"]
    for claim in by_kind(objects, "PersistentVolumeClaim"):
        assert claim["spec"]["resources"]["requests"]["storage"]


def test_mlflow_service_runs_basic_auth_with_the_clients_user():
    objects = rendered("services")
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["mlflow"]
    container = one(objects, "Deployment", "mlflow")["spec"]["template"]["spec"]["containers"][0]
    assert _image_name(container["image"]) == "registry.example.com/mnist-object-storage/mlflow"
    assert container["image"].endswith(":" + compose["image"].rsplit(":", 1)[1]), "compose's MLflow version"
    command = container["command"]
    assert "--app-name=basic-auth" in command and "--artifacts-destination=s3://mlflow/artifacts" in command
    env = {e["name"]: e.get("valueFrom", {}).get("secretKeyRef", e.get("value")) for e in container["env"]}
    assert env["MLFLOW_AUTH_ADMIN_USERNAME"] == {"name": CREDENTIALS, "key": "MLFLOW_TRACKING_USERNAME"}
    assert env["MLFLOW_AUTH_ADMIN_PASSWORD"] == {"name": CREDENTIALS, "key": "MLFLOW_TRACKING_PASSWORD"}
    assert env["MLFLOW_FLASK_SERVER_SECRET_KEY"]["name"] == TOKENS
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] == "/health", "the one path that answers without signing in"
    settings = one(rendered("overlays/cpu"), "ConfigMap", SETTINGS_CONFIGMAP)["data"]
    services = {s["metadata"]["name"]: s["spec"]["ports"][0]["port"] for s in by_kind(objects, "Service")}
    assert settings["MLFLOW_TRACKING_URI"] == f"http://mlflow:{services['mlflow']}"
    assert settings["S3_ENDPOINT"] == f"http://minio:{services['minio']}"
    assert {doc["metadata"]["namespace"] for doc in objects} == {"mnist"} == {
        doc["metadata"]["namespace"] for doc in rendered("overlays/cpu")}


def test_every_secret_key_a_manifest_names_is_in_the_example_secrets():
    keys = {(s["metadata"]["name"], key) for s in example_secrets() for key in s["stringData"]}
    for name in KUSTOMIZATIONS:
        for obj in rendered(name):
            for _, template in pod_templates(obj):
                for container in template["spec"]["containers"]:
                    for entry in container.get("env", []):
                        ref = entry.get("valueFrom", {}).get("secretKeyRef")
                        if ref:
                            assert (ref["name"], ref["key"]) in keys, ref


def test_no_secret_reaches_a_command_line():
    """Kubernetes writes $(VAR) into command and args: a secret there shows in the process list."""
    for name in KUSTOMIZATIONS:
        for obj in rendered(name):
            for _, template in pod_templates(obj):
                for container in template["spec"]["containers"]:
                    line = " ".join(container.get("command", []) + container.get("args", []))
                    assert not set(re.findall(r"\$\((\w+)\)", line)), f"{container['name']}: {line}"


def test_schema_is_our_own_subset_naming_its_kuberay_version():
    text = SCHEMA.read_text()
    assert "v1.7.0" in text and "ray-operator/config/crd/bases/ray.io_rayclusters.yaml" in text
    jsonschema.Draft202012Validator.check_schema(kuberay_schema())
    # every object it describes refuses unknown fields
    def closed(node, where="$"):
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node:
                assert node.get("additionalProperties") is False, where
            for key, value in node.items():
                closed(value, f"{where}.{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                closed(value, f"{where}[{i}]")
    closed({k: v for k, v in kuberay_schema()["$defs"].items()})


# ---------------------------------------------------------------------------------------------------------
# Each check refuses a broken manifest.

def cpu_object(kind: str, name: str) -> dict:
    return one(rendered("overlays/cpu"), kind, name)


def test_a_string_for_a_boolean_is_refused():
    job = cpu_object("RayJob", "mnist-04")
    job["spec"]["shutdownAfterJobFinishes"] = "yes"
    assert any("shutdownAfterJobFinishes: 'yes' is not of type 'boolean'" in p for p in kuberay_problems(job))


@pytest.mark.parametrize("path, field", [
    (("spec",), "shutdownAfterJobFinish"),
    (("spec", "rayClusterSpec", "headGroupSpec"), "rayStartParam"),
    (("spec", "rayClusterSpec", "authOptions"), "secretname"),
    (("spec", "rayClusterSpec", "workerGroupSpecs", 0), "replica"),
])
def test_a_misspelt_kuberay_field_is_refused(path, field):
    job = cpu_object("RayJob", "mnist-04")
    node = job
    for part in path:
        node = node[part]
    node[field] = True
    assert any(f"'{field}' was unexpected" in p for p in kuberay_problems(job)), kuberay_problems(job)


def test_kuberay_rules_across_fields_are_refused():
    job = cpu_object("RayJob", "mnist-07")
    job["spec"]["shutdownAfterJobFinishes"] = False  # suspended, and a TTL: the operator wants it true for each
    assert kuberay_problems(job) == ["RayJob/mnist-07: spec.shutdownAfterJobFinishes: True was expected"] * 2
    cluster = cpu_object("RayCluster", "mnist")
    del cluster["spec"]["workerGroupSpecs"][0]["maxReplicas"]
    assert any("set minReplicas and maxReplicas" in p for p in kuberay_problems(cluster))
    cluster["spec"]["workerGroupSpecs"][0].update(minReplicas=5, maxReplicas=2)
    assert any("minReplicas 5 > maxReplicas 2" in p for p in kuberay_problems(cluster))
    cluster["metadata"]["name"] = "MNIST_cluster"
    assert any("metadata.name" in p for p in kuberay_problems(cluster))


def test_a_misspelt_field_in_a_pod_template_or_core_kind_is_refused():
    cluster = cpu_object("RayCluster", "mnist")
    cluster["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["envfrom"] = []
    assert any("'envfrom' was unexpected" in p for p in core_problems(cluster))
    minio = one(rendered("services"), "Deployment", "minio")
    minio["spec"]["replica"] = 1
    assert any("'replica' was unexpected" in p for p in core_problems(minio))
    minio = one(rendered("services"), "Deployment", "minio")
    minio["spec"]["template"]["spec"]["volumes"][0]["emptyDir"] = {"sizeLimit": [1]}
    assert core_problems(minio)


@pytest.mark.parametrize("setting", sorted(SERVICE_SETTINGS.values()))
def test_a_variable_the_notebooks_read_but_no_manifest_sets_is_refused(setting):
    objects, secret_docs = rendered("overlays/cpu"), example_secrets()
    settings = one(objects, "ConfigMap", SETTINGS_CONFIGMAP)["data"]
    credentials = one(secret_docs, "Secret", CREDENTIALS)["stringData"]
    assert (setting in settings) != (setting in credentials), "set once, in the ConfigMap or the Secret"
    settings.pop(setting, None)
    credentials.pop(setting, None)
    assert any(setting in problem for problem in env_problems(objects, secret_docs))


def test_a_stray_or_secret_variable_in_the_configmap_is_refused():
    objects = rendered("overlays/cpu")
    one(objects, "ConfigMap", SETTINGS_CONFIGMAP)["data"].update(S3_ENDPIONT="http://minio:9000")
    assert any("S3_ENDPIONT" in p for p in env_problems(objects, example_secrets()))
    objects = rendered("overlays/cpu")
    one(objects, "ConfigMap", SETTINGS_CONFIGMAP)["data"].update(S3_SECRET_KEY="change-me")
    assert any("belong in the Secret" in p for p in env_problems(objects, example_secrets()))
    objects = rendered("overlays/cpu")
    one(objects, "RayJob", "mnist-04")["spec"]["submitterPodTemplate"]["spec"]["containers"][0]["envFrom"].pop()
    assert any("mnist-04 submitter" in p for p in env_problems(objects, example_secrets()))


def test_a_secret_with_a_real_looking_value_is_refused():
    docs = example_secrets()
    one(docs, "Secret", CREDENTIALS)["stringData"]["S3_SECRET_KEY"] = secrets.token_urlsafe(30)
    assert secret_problems(docs) == [f"Secret {CREDENTIALS}: S3_SECRET_KEY holds a value that is not a placeholder"]


def _with_entrypoint(old: str, new: str) -> dict:
    job = cpu_object("RayJob", "mnist-04")
    assert old in job["spec"]["entrypoint"]
    job["spec"]["entrypoint"] = job["spec"]["entrypoint"].replace(old, new)
    return job


@pytest.mark.parametrize("old, new, expected", [
    ("notebooks/04_distributed_training.ipynb /tmp", "notebooks/04_distributed_training_v2.ipynb /tmp",
     "no notebook notebooks/04_distributed_training_v2.ipynb"),
    ("-p smoke_test_size 0", "-p smoke_test_size 0 -p epoch 3", "has no parameters ['epoch']"),
    ("-p smoke_test_size 0", "-p smoke_test_size 0 -p use_gpu maybe", "refuses a value: use_gpu must be True"),
    ("--log-output", "--log-outputs", "papermill refuses its arguments"),
    ("--cwd notebooks", "--cwd .", "--cwd notebooks"),
    ("cd /workspace &&", "cd /tmp &&", "start in the image's /workspace"),
    ("ray \"$key\" /tmp/04_distributed_training.ipynb", "ray \"$key\" /tmp/out.ipynb", "copied to the object store"),
    ("ensure_bucket, get_client;", "ensure_bucket, get_clients;", "helpers.storage has no get_clients"),
    ("exit $status'", "exit $status", "survives two shells"),
    ("status=$?;", "status=$?; if then;", "bash refuses the script"),
])
def test_a_broken_entrypoint_is_refused(old, new, expected):
    problems = entrypoint_problems(_with_entrypoint(old, new))
    assert any(expected in problem for problem in problems), problems


def test_a_key_given_twice_is_refused_as_kubectl_does():
    with pytest.raises(yaml.constructor.ConstructorError, match="keys given twice"):
        load_documents_text("kind: ConfigMap\ndata:\n  S3_ENDPOINT: a\n  S3_ENDPOINT: b\n")


def test_docs_name_every_variable_the_manifests_set():
    docs = (ROOT / "docs" / "cluster.md").read_text()
    secret_keys = {key for s in example_secrets() for key in s["stringData"]}
    settings = set(one(rendered("overlays/cpu"), "ConfigMap", SETTINGS_CONFIGMAP)["data"])
    missing = {name for name in settings | secret_keys | set(SERVICE_SETTINGS.values()) if f"`{name}`" not in docs}
    assert not missing - {"auth_token"}, f"docs/cluster.md's table lacks {sorted(missing)}"
    assert "deploy/kuberay/README.md" in docs
