"""deploy/ names only things that exist: every YAML parses, every image is built by a Dockerfile
in deploy/ at the package's version, every `gristmill` command line parses with the real CLI
(subcommand and flags), and every job or config file it names is in the repo and loads.
"""
from __future__ import annotations

import glob
import json
import os
import re
import shlex
import subprocess
import sys

import pytest
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEPLOY = os.path.join(REPO, "deploy")
# deploy/gpu-benchmark.sh belongs to the trainer; it is checked by its own tests.
SCRIPTS = sorted(p for p in glob.glob(os.path.join(DEPLOY, "**", "*"), recursive=True)
                 if p.endswith((".sbatch", ".sh")) and os.path.basename(p) != "gpu-benchmark.sh")
YAMLS = sorted(glob.glob(os.path.join(DEPLOY, "**", "*.yaml"), recursive=True)
               + glob.glob(os.path.join(DEPLOY, "**", "*.yml"), recursive=True))
IMAGE = re.compile(r"^(?:[\w.-]+(?::\d+)?/)*gristmill-(?P<kind>[a-z]+):(?P<tag>[\w.-]+)$")
# `gristmill SUB ...` (the console script) or `-m gristmill.cli SUB ...` (under torchrun).
COMMAND = re.compile(r"(?:^|[\s;&|(`'\"])(?:gristmill|-m\s+gristmill\.cli)\s+(?=[a-z])")
SHELL_STOP = re.compile(r"\s(?:;|&&|\|\||\||>|2>|&)(?:\s|$)|;$")
REPO_FILE = re.compile(r"(?<![\w/.])((?:configs|examples)/[\w./-]+\.ya?ml)\b")
VAR = re.compile(r"\$\{?(\w+)\}?")


def rel(path: str) -> str:
    return os.path.relpath(path, REPO)


def version() -> str:
    import gristmill  # the one place the version is defined (pyproject reads it from there)

    return gristmill.__version__


def walk(node, key=None):
    """(key, value) for every scalar in a parsed YAML document."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from walk(v, k)
    elif isinstance(node, list):
        for v in node:
            yield from walk(v, key)
    else:
        yield key, node


def yaml_docs(path: str) -> list:
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def env_defaults(doc) -> dict[str, str]:
    """Container env entries of a Kubernetes document: the values its command's $VARs take."""
    out = {}

    def visit(node):
        if isinstance(node, dict):
            if isinstance(node.get("env"), list):
                out.update({e["name"]: str(e.get("value", "")) for e in node["env"] if isinstance(e, dict) and "name" in e})
            for v in node.values():
                visit(v)
        elif isinstance(node, list):
            for v in node:
                visit(v)
    visit(doc)
    return out


def script_defaults(text: str) -> dict[str, str]:
    """``NAME=${1:-${NAME:-default}}`` settings of a shell script: NAME -> default."""
    out = {}
    for m in re.finditer(r"^(\w+)=(\S+)", text, re.M):
        defaults = re.findall(r":-([^}$]+)\}", m.group(2))
        out[m.group(1)] = defaults[-1] if defaults else m.group(2)
    return out


def logical_lines(text: str) -> list[str]:
    """A script's commands: comments (whole-line and trailing) dropped, backslash continuations joined."""
    lines = text.replace("\\\n", " ").splitlines()
    return [re.sub(r"\s+#\s.*$", "", line) for line in lines if not line.lstrip().startswith("#")]


def gristmill_commands(text: str, variables: dict[str, str]) -> list[list[str]]:
    """argv (after `gristmill`) of each gristmill command in ``text``, $VARs substituted."""
    out = []
    for m in COMMAND.finditer(text):
        rest = text[m.end():].split("\n", 1)[0]
        rest = SHELL_STOP.split(rest, 1)[0]
        rest = VAR.sub(lambda v: variables.get(v.group(1), v.group(0)), rest)
        out.append([a for a in shlex.split(rest) if a not in ("$@", "${@}")])
    return out


def sources() -> list[tuple[str, str, dict]]:
    """(where, command text, variables) for every YAML string and every script."""
    out = []
    for path in YAMLS:
        for i, doc in enumerate(yaml_docs(path)):
            variables = env_defaults(doc)
            for key, value in walk(doc):
                if isinstance(value, str):
                    out.append((f"{rel(path)} document {i} key {key}", value, variables))
    for path in SCRIPTS:
        text = open(path).read()
        out.append((rel(path), "\n".join(logical_lines(text)), script_defaults(text)))
    return out


def test_deploy_has_every_artifact():
    names = {rel(p) for p in glob.glob(os.path.join(DEPLOY, "**", "*"), recursive=True) if os.path.isfile(p)}
    for want in ("deploy/Dockerfile.pipeline", "deploy/Dockerfile.trainer", "deploy/Dockerfile.serve", "deploy/kuberay/rayjob-prepare.yaml",
                 "deploy/kuberay/raycluster.yaml", "deploy/ray/cluster.yaml", "deploy/slurm/prepare.sbatch",
                 "deploy/slurm/train.sbatch", "deploy/k8s/train-job.yaml", "deploy/k8s/gristmill-serve.yaml"):
        assert want in names, f"{want} is missing"


@pytest.mark.parametrize("path", YAMLS, ids=rel)
def test_yaml_parses_to_mappings(path):
    docs = yaml_docs(path)
    assert docs, f"{rel(path)} has no YAML document"
    for i, doc in enumerate(docs):
        assert isinstance(doc, dict), f"{rel(path)} document {i} is a {type(doc).__name__}, not a mapping"
        if "apiVersion" in doc:  # a Kubernetes object
            assert doc.get("kind") and doc.get("metadata", {}).get("name"), f"{rel(path)} document {i}: kind and metadata.name"


@pytest.mark.parametrize("path", SCRIPTS, ids=rel)
def test_scripts_are_valid_bash(path):
    result = subprocess.run(["bash", "-n", path], capture_output=True, text=True)
    assert result.returncode == 0, f"{rel(path)}: {result.stderr}"
    assert os.access(path, os.X_OK), f"{rel(path)} is not executable (chmod +x)"


def test_images_are_built_by_deploy_dockerfiles_at_the_package_version():
    used = set()
    for path in YAMLS:
        for doc in yaml_docs(path):
            for key, value in walk(doc):
                if key != "image":
                    continue
                m = IMAGE.match(str(value))
                assert m, f"{rel(path)}: image {value!r} is not REGISTRY/gristmill-<kind>:<tag>"
                dockerfile = os.path.join(DEPLOY, f"Dockerfile.{m['kind']}")
                assert os.path.exists(dockerfile), f"{rel(path)}: image {value!r} needs {rel(dockerfile)}, which does not exist"
                assert m["tag"] == version(), f"{rel(path)}: image {value!r} is tagged {m['tag']}, the package is {version()}"
                used.add(m["kind"])
    assert used == {"pipeline", "trainer", "serve"}, f"images used by deploy/ manifests: {sorted(used)}"


def test_every_gristmill_command_parses_with_the_cli():
    from gristmill.cli import build_parser

    parser = build_parser()
    seen = set()
    for where, text, variables in sources():
        for argv in gristmill_commands(text, variables):
            try:
                args = parser.parse_args(argv)
            except SystemExit:
                pytest.fail(f"{where}: `gristmill {shlex.join(argv)}` does not parse with the gristmill CLI")
            seen.add(args.command)
            check_job_file(where, args)
    assert {"prepare", "train"} <= seen, f"deploy/ runs only {sorted(seen)}"


def check_job_file(where: str, args) -> None:
    """The job file a command names loads with its part's own parser (train: with the --set overrides)."""
    if not hasattr(args, "job"):  # a command without a job file (serve): checked by its own test
        return
    path = os.path.join(REPO, args.job) if not os.path.isabs(args.job) else args.job
    if "$" in args.job or args.job.startswith("/jobs/") or args.job.startswith("/shared/"):
        return  # supplied at run time (a ConfigMap, the shared filesystem): checked below or by the operator
    assert os.path.exists(path), f"{where}: job file {args.job} is not in the repo"
    if args.command == "train":
        from gristmill.trainer.config import load

        load(path, args.overrides)
    elif args.command == "prepare":
        from gristmill.pipeline.config import load_job

        load_job(path)


def test_files_named_in_deploy_exist():
    for path in YAMLS + SCRIPTS:
        for name in REPO_FILE.findall(open(path).read()):
            assert os.path.exists(os.path.join(REPO, name)), f"{rel(path)} names {name}, which is not in the repo"


def test_kuberay_job_file_is_a_valid_prepare_job():
    from gristmill.pipeline.config import PrepareConfig

    docs = yaml_docs(os.path.join(DEPLOY, "kuberay", "rayjob-prepare.yaml"))
    config_map = next(d for d in docs if d["kind"] == "ConfigMap")
    rayjob = next(d for d in docs if d["kind"] == "RayJob")
    job = PrepareConfig.from_dict(yaml.safe_load(config_map["data"]["prepare.yaml"]), where="ConfigMap prepare.yaml")
    assert job.work_dir.startswith("/shared/"), "work_dir must be on the volume every worker mounts"
    mounted = {m["mountPath"] for c in rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"]
               for m in c.get("volumeMounts", [])}
    assert os.path.dirname(rayjob["spec"]["entrypoint"].split()[-1]) in mounted, "the job file's mount is missing on the head"


def test_ray_versions_match_the_pipeline_image():
    dockerfile = open(os.path.join(DEPLOY, "Dockerfile.pipeline")).read()
    ray_version = re.search(r"^ARG RAY_VERSION=(\S+)", dockerfile, re.M).group(1)
    for name in ("raycluster.yaml", "rayjob-prepare.yaml"):
        for doc in yaml_docs(os.path.join(DEPLOY, "kuberay", name)):
            for key, value in walk(doc):
                if key == "rayVersion":
                    assert value == ray_version, f"deploy/kuberay/{name}: rayVersion {value} != the image's Ray {ray_version}"


def test_command_checker_finds_commands_and_catches_a_misspelled_flag():
    from gristmill.cli import build_parser

    text = 'srun torchrun --nnodes=2 -m gristmill.cli train "$JOB" --set run.steps=1 "$@" && echo done\n' \
           "gristmill prepare job.yaml --adress 10.0.0.1:6379 > log.txt\n"
    train, prepare = gristmill_commands(text, {"JOB": "configs/train-tiny.yaml"})
    assert train == ["train", "configs/train-tiny.yaml", "--set", "run.steps=1"]
    assert prepare == ["prepare", "job.yaml", "--adress", "10.0.0.1:6379"]
    assert build_parser().parse_args(train).overrides == ["run.steps=1"]
    with pytest.raises(SystemExit):
        build_parser().parse_args(prepare)


def pod_specs(node):
    """Every pod spec (a mapping with `containers`) inside a parsed Kubernetes document."""
    if isinstance(node, dict):
        if isinstance(node.get("containers"), list):
            yield node
        for v in node.values():
            yield from pod_specs(v)
    elif isinstance(node, list):
        for v in node:
            yield from pod_specs(v)


@pytest.mark.parametrize("path", [p for p in YAMLS if "/ray/" not in p], ids=rel)
def test_every_volume_mount_names_a_volume_of_its_pod(path):
    specs = [s for doc in yaml_docs(path) for s in pod_specs(doc)]
    assert specs, f"{rel(path)} has no pod template"
    for spec in specs:
        volumes = {v["name"] for v in spec.get("volumes", [])}
        for c in spec["containers"]:
            for m in c.get("volumeMounts", []):
                assert m["name"] in volumes, f"{rel(path)}: container {c['name']} mounts {m['name']!r}, not a volume of its pod"


def test_ray_cluster_launcher_config_passes_rays_own_validation():
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml_docs(os.path.join(DEPLOY, "ray", "cluster.yaml"))[0]
    full = prepare_config(config)  # fills the provider's defaults, as `ray up` does
    validate_config(full)  # Ray's JSON schema: unknown or misspelled keys fail here
    assert full["head_node_type"] in full["available_node_types"]
    assert "--num-cpus=0" in " ".join(full["head_start_ray_commands"]), "the head should run no data tasks"


def test_serve_deployment_wires_token_cache_port_and_probe():
    """deploy/k8s/gristmill-serve.yaml: a Secret, a Service and a Deployment whose `gristmill serve`
    listens beyond loopback with the Secret's token file, keeps its cache on a node-local volume (its
    only state: no claim), is probed on the port it listens on, and starts as the server would."""
    from gristmill.cli import build_parser
    from gristmill.loader.service.server import ServeConfig

    docs = {d["kind"]: d for d in yaml_docs(os.path.join(DEPLOY, "k8s", "gristmill-serve.yaml"))}
    assert set(docs) == {"Secret", "Service", "Deployment"}
    secret, service, deployment = docs["Secret"], docs["Service"], docs["Deployment"]
    pod = deployment["spec"]["template"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items(), "the Service selects no server pod"
    (container,) = pod["spec"]["containers"]
    variables = env_defaults(deployment)
    (argv,) = [a for text in container["args"] for a in gristmill_commands(text, variables)]
    args = build_parser().parse_args(argv)
    assert args.command == "serve"
    host, _, port = args.listen.rpartition(":")

    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    (svc_port,) = service["spec"]["ports"]
    assert ports[svc_port["targetPort"]] == int(port), "the Service's targetPort is not the port the server listens on"
    probe = container["readinessProbe"]
    probed = probe.get("tcpSocket", probe.get("grpc", {})).get("port")
    assert probed in (int(port), svc_port["targetPort"]), "the readiness probe does not check the serving port"

    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
    assert not any("persistentVolumeClaim" in v for v in volumes.values()), "the server's only state is its cache"
    token_dir, token_key = os.path.split(args.token_file)
    assert mounts[token_dir].get("secret", {}).get("secretName") == secret["metadata"]["name"], \
        f"--token-file {args.token_file} is not in the mounted Secret"
    assert token_key in secret.get("stringData", {}) or token_key in secret.get("data", {})
    cache = mounts.get(args.cache_dir)
    assert cache is not None and ("emptyDir" in cache or "hostPath" in cache), "--cache-dir is not a node-local volume"

    # Beyond loopback a token is mandatory (ServeConfig refuses to start without one): with it, the
    # flags build the server's config.
    cfg = ServeConfig(tuple(args.urls), host=host, port=int(port), token="a-token", cache_dir=args.cache_dir,
                      max_streams=args.max_streams, max_streams_per_client=args.max_streams_per_client)
    assert cfg.location == f"grpc://{host}:{port}"
    # The admission bounds are the command's defaults (issue 41: the manifest's 8 streams a host broke 32 ranks).
    defaults = build_parser().parse_args(["serve", "x"])
    for flag in ("max_streams", "max_streams_per_client", "max_inflight_bytes", "max_inflight_bytes_per_client",
                 "admission_wait_s", "stream_idle_s"):
        assert getattr(args, flag) == getattr(defaults, flag), f"--{flag.replace('_', '-')} is not the default"
    with pytest.raises(Exception, match="without a token"):
        ServeConfig(tuple(args.urls), host=host, port=int(port))


SERVE_PROBE = """
import json, sys
before = set(sys.modules)  # the interpreter's start (site's .pth hooks)
import gristmill.cli, gristmill.cli.serve, gristmill.loader.service.server
print(json.dumps(sorted({m.split('.')[0] for m in set(sys.modules) - before} - set(sys.stdlib_module_names))))
"""
# imported by the serve path only when installed (numba tries scipy, fsspec.compression zstandard): not needed
SERVE_OPTIONAL = {"scipy", "zstandard"}


def _requirement_names(reqs) -> list[str]:
    """The distribution names of requirement strings, less those under an extra (``; extra == ...``)."""
    return [re.split(r"[\s<>=!~\[;(]", r, maxsplit=1)[0] for r in reqs or () if "extra ==" not in r]


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_the_serve_extra_and_image_hold_what_the_server_imports_and_no_torch():
    """`gristmill serve` on its torch-free image (deploy/Dockerfile.serve: the serve extra's packages, then
    gristmill --no-deps): every package the server imports is the serve extra's or a dependency of one, and
    torch is neither (issue 41)."""
    import importlib.metadata as md
    import tomllib

    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        serve = _requirement_names(tomllib.load(f)["project"]["optional-dependencies"]["serve"])
    installed, todo = set(), list(serve)  # the serve extra and what it pulls
    while todo:
        name = _canonical(todo.pop())
        if name not in installed:
            installed.add(name)
            try:
                todo += _requirement_names(md.requires(name))
            except md.PackageNotFoundError:  # a marker-gated dependency not installed here
                pass
    assert "torch" not in installed
    out = subprocess.run([sys.executable, "-c", SERVE_PROBE], capture_output=True, text=True, timeout=120, check=True)
    dists = md.packages_distributions()
    imported = {m for m in json.loads(out.stdout) if m in dists} - SERVE_OPTIONAL  # distributions' modules
    missing = {m: dists[m] for m in imported if not {_canonical(d) for d in dists[m]} & (installed | {"gristmill"})}
    assert "torch" not in imported and missing == {}
    dockerfile = open(os.path.join(DEPLOY, "Dockerfile.serve")).read()
    assert "['serve'" in dockerfile and "pip install --no-deps ." in dockerfile  # the extra, and gristmill without torch
