"""Offline checks of deploy/: the Kubernetes manifests against the official
schemas (kubernetes-validate, strict), their cross-references (names, ports,
the workers' registration with the learner, token and config paths), the learner's config against
examples/reference.toml, every `grpo` flag against the binary's `--help`
(GRPO_BIN), and the Dockerfile's COPY sources and setup.

    PY=$(tools/test-venv.sh)
    GRPO_BIN=target/debug/grpo "$PY" -m unittest discover -s deploy -p 'test_*.py'
"""

import fnmatch
import json
import os
import re
import shlex
import subprocess
import unittest
from pathlib import Path, PurePosixPath

try:
    import tomllib
except ModuleNotFoundError as e:
    raise ImportError("deploy/test_deploy.py needs Python >= 3.11 (tomllib): set PYTHON for tools/test-venv.sh") from e

import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
DOCKERFILE = DEPLOY / "Dockerfile"
REFERENCE = ROOT / "examples" / "reference.toml"
# The oldest and newest Kubernetes whose schemas kubernetes-validate 1.37.0 ships
# that the manifests target (1.30: StatefulSet serviceName still required).
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")
# Applied by hand (kubectl create secret), never by `kubectl apply -k`.
NOT_IN_KUSTOMIZATION = {"secret.yaml"}
WORKER, LEARNER = "grpo-worker", "grpo-learner"
CONFIG_KEY = "config.toml"


# ---------------------------------------------------------------- manifests


def load_manifests():
    """[(file name, document)] of every manifest but kustomization.yaml."""
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        with open(path) as f:
            for doc in yaml.safe_load_all(f):
                if doc:
                    docs.append((path.name, doc))
    return docs


MANIFESTS = load_manifests()


def resource(kind, name):
    found = [d for _, d in MANIFESTS if d["kind"] == kind and d["metadata"]["name"] == name]
    if len(found) != 1:
        raise AssertionError(f"deploy/k8s: expected one {kind} `{name}`, found {len(found)}")
    return found[0]


def names(kind):
    return {d["metadata"]["name"] for _, d in MANIFESTS if d["kind"] == kind}


WORKLOAD_KINDS = ("StatefulSet", "Deployment")


def workloads():
    """Every StatefulSet and Deployment."""
    return [d for _, d in MANIFESTS if d["kind"] in WORKLOAD_KINDS]


def workload(name):
    """The one StatefulSet or Deployment called `name`."""
    found = [d for d in workloads() if d["metadata"]["name"] == name]
    if len(found) != 1:
        raise AssertionError(f"deploy/k8s: expected one StatefulSet or Deployment `{name}`, found {len(found)}")
    return found[0]


def what(workload):
    return f"{workload['kind']} {workload['metadata']['name']}"


def pod_spec(sts):
    return sts["spec"]["template"]["spec"]


def container(sts):
    containers = pod_spec(sts)["containers"]
    if len(containers) != 1:
        raise AssertionError(f"{what(sts)}: expected one container")
    return containers[0]


def mount_of(sts, volume_name):
    """The mount path of `volume_name` in the workload's container."""
    mounts = [m for m in container(sts).get("volumeMounts", []) if m["name"] == volume_name]
    if len(mounts) != 1:
        raise AssertionError(f"{what(sts)}: expected one mount of volume `{volume_name}`")
    return mounts[0]["mountPath"]


def volume_from(sts, kind):
    """(volume name, volume) of the one volume of `kind` (secret, configMap)."""
    volumes = [v for v in pod_spec(sts).get("volumes", []) if kind in v]
    if len(volumes) != 1:
        raise AssertionError(f"{what(sts)}: expected one {kind} volume")
    return volumes[0]["name"], volumes[0][kind]


def flag_value(argv, flag, where):
    """The value after `flag` in argv (the last one if repeated)."""
    values = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]
    if not values:
        raise AssertionError(f"{where}: no {flag} in {argv}")
    return values[-1]


# ------------------------------------------------------------ shell and grpo

COMMAND_STARTERS = {"exec", "then", "do", "else", "if", "until", "while", "!", "RUN"}


def shell_assignments(script):
    """Simple `name=value` lines of a script as {name: value}, and array
    ones, `name=(a b)`, as {name: [every element ever assigned]}."""
    scalars, arrays = {}, {}
    for line in script.splitlines():
        m = re.fullmatch(r"\s*([A-Za-z_]\w*)=([^\s$`'\"()]+)\s*", line)
        if m:
            scalars[m.group(1)] = m.group(2)
        m = re.fullmatch(r"\s*([A-Za-z_]\w*)=\((.*)\)\s*", line)
        if m:
            arrays.setdefault(m.group(1), []).extend(shlex.split(m.group(2)))
    return scalars, arrays


def logical_lines(text):
    """Lines with backslash continuations joined, comments and blanks dropped."""
    lines, pending = [], ""
    for line in text.splitlines():
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        line = pending + line
        pending = ""
        if line.strip() and not line.lstrip().startswith("#"):
            lines.append(line)
    if pending.strip():
        lines.append(pending)
    return lines


def shell_grpo_commands(script):
    """The argv (after `grpo`) of every `grpo` command in a shell script,
    `$var` replaced by the script's simple assignments and `${array[@]}` by
    every element it is ever given."""
    scalars, arrays = shell_assignments(script)
    commands = []
    for line in logical_lines(script):
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        tokens = list(lexer)
        start = True
        for i, token in enumerate(tokens):
            punctuation = all(c in "();<>|&" for c in token)
            if start and token == "grpo":
                argv = []
                for arg in tokens[i + 1 :]:
                    if all(c in "();<>|&" for c in arg):
                        break
                    array = re.fullmatch(r"\$\{([A-Za-z_]\w*)\[@\]\}", arg)
                    scalar = re.fullmatch(r"\$\{?([A-Za-z_]\w*)\}?", arg)
                    if array:
                        argv += arrays.get(array.group(1), [arg])
                    else:
                        argv.append(scalars.get(scalar.group(1), arg) if scalar else arg)
                commands.append(argv)
            assignment = start and re.fullmatch(r"[A-Za-z_]\w*=.*", token)
            start = punctuation or token in COMMAND_STARTERS or bool(assignment)
    return commands


def container_grpo_commands(sts, entrypoint):
    """The argv (after `grpo`) of every `grpo` command a container runs."""
    c = container(sts)
    command, args = c.get("command"), c.get("args", [])
    if command is None:
        command = entrypoint
        if command != ["grpo"]:
            raise AssertionError(f"{what(sts)}: the image's ENTRYPOINT is {command}, not grpo")
    argv = command + args
    if argv[0] in ("bash", "sh") and "-c" in argv:
        return shell_grpo_commands(argv[argv.index("-c") + 1])
    if argv[0] == "grpo":
        return [argv[1:]]
    raise AssertionError(f"{what(sts)}: runs {argv[0]}, neither grpo nor a shell")


def help_flags(grpo, subcommand):
    """The long options `grpo SUBCOMMAND --help` lists."""
    done = subprocess.run([grpo, subcommand, "--help"], check=False, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise AssertionError(f"`{grpo} {subcommand} --help` failed ({done.returncode}): {done.stderr.strip()}")
    return set(re.findall(r"(?m)^\s+(?:-\w, )?(--[a-z0-9][a-z0-9-]*)", done.stdout))


# --------------------------------------------------------------- Dockerfile


def dockerfile_stages():
    """[{"from": image, "name": alias, "instructions": [(WORD, rest)]}]."""
    stages = []
    for line in logical_lines(DOCKERFILE.read_text()):
        word, _, rest = line.strip().partition(" ")
        word, rest = word.upper(), rest.strip()
        if word == "FROM":
            parts = rest.split()
            alias = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
            stages.append({"from": parts[0], "name": alias, "instructions": []})
        elif stages:
            stages[-1]["instructions"].append((word, rest))
        else:
            raise AssertionError(f"deploy/Dockerfile: {word} before the first FROM")
    return stages


def copy_args(rest):
    """(flags, sources, destination) of a COPY instruction."""
    if rest.startswith("["):
        parts = json.loads(rest)
    else:
        parts = shlex.split(rest)
    flags = [p for p in parts if p.startswith("--")]
    paths = [p for p in parts if not p.startswith("--")]
    return flags, paths[:-1], paths[-1]


def dockerignore_patterns():
    path = ROOT / ".dockerignore"
    if not path.is_file():
        return []
    return [l.strip() for l in path.read_text().splitlines() if l.strip() and not l.startswith("#")]


def ignored(source, patterns):
    """Whether .dockerignore drops `source` (or a folder above it)."""
    parts = PurePosixPath(source).parts
    for n in range(1, len(parts) + 1):
        prefix = "/".join(parts[:n])
        for pattern in patterns:
            pattern = pattern.rstrip("/")
            if fnmatch.fnmatch(prefix, pattern):
                return True
            if pattern.startswith("**/") and fnmatch.fnmatch(parts[n - 1], pattern[3:]):
                return True
    return False


def image_entrypoint():
    final = dockerfile_stages()[-1]
    entry = [rest for word, rest in final["instructions"] if word == "ENTRYPOINT"]
    return json.loads(entry[-1]) if entry else None


def dockerfile_uid():
    """The uid of the runtime stage's USER."""
    users = [rest for word, rest in dockerfile_stages()[-1]["instructions"] if word == "USER"]
    if not users:
        raise AssertionError("deploy/Dockerfile: the runtime stage sets no USER")
    return int(users[-1].split(":")[0])


# -------------------------------------------------------------- the config


def learner_config():
    cm = resource("ConfigMap", f"{LEARNER}-config")
    if CONFIG_KEY not in cm.get("data", {}):
        raise AssertionError(f"ConfigMap {LEARNER}-config has no key {CONFIG_KEY}")
    try:
        return tomllib.loads(cm["data"][CONFIG_KEY])
    except tomllib.TOMLDecodeError as e:
        raise AssertionError(f"ConfigMap {LEARNER}-config: {CONFIG_KEY} is not valid TOML: {e}")


def reference_keys():
    """{section: {key: default or None}} of examples/reference.toml, with the
    keys it shows commented out (no default) too."""
    text = REFERENCE.read_text()
    keys = {}
    for section, table in tomllib.loads(text).items():
        for entry in table if isinstance(table, list) else [table]:
            keys.setdefault(section, {}).update(entry)
    section = None
    for line in text.splitlines():
        m = re.match(r"\[\[?(\w+)\]\]?", line)
        if m:
            section = m.group(1)
            continue
        m = re.match(r"#\s*([a-z_]+)\s*=", line)
        if m and section:
            keys.setdefault(section, {}).setdefault(m.group(1), None)
    return keys


# -------------------------------------------------------------------- tests


class Manifests(unittest.TestCase):
    def test_every_document_is_valid_against_the_kubernetes_schemas(self):
        self.assertTrue(MANIFESTS, "deploy/k8s holds no manifests")
        for file, doc in MANIFESTS:
            for version in KUBERNETES_VERSIONS:
                what = f"deploy/k8s/{file}: {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
                with self.subTest(file=file, kind=doc.get("kind"), kubernetes=version):
                    try:
                        kubernetes_validate.validate(doc, version, strict=True)
                    except kubernetes_validate.ValidationError as e:
                        path = ".".join(str(p) for p in e.path)
                        self.fail(f"{what} is invalid for Kubernetes {version} at `{path}`: {e.message}")
                    except kubernetes_validate.SchemaNotFoundError as e:
                        self.fail(f"{what}: {e.message}")

    def test_kustomization_lists_every_manifest(self):
        kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
        listed = kustomization.get("resources", [])
        for name in listed:
            self.assertTrue((K8S / name).is_file(), f"deploy/k8s/kustomization.yaml lists {name}, which does not exist")
        files = {file for file, _ in MANIFESTS}
        self.assertEqual(
            set(listed),
            files - NOT_IN_KUSTOMIZATION,
            "deploy/k8s/kustomization.yaml: resources must be every manifest but secret.yaml",
        )
        images = {c["image"].split(":")[0] for d in workloads() for c in pod_spec(d)["containers"]}
        self.assertEqual(images, {"grpo"}, "deploy/k8s: every container runs the grpo image")
        self.assertIn(
            "grpo",
            {i["name"] for i in kustomization.get("images", [])},
            "kustomization.yaml: no `images` entry for grpo",
        )

    def test_references_between_resources_exist(self):
        services, secrets, config_maps = names("Service"), names("Secret"), names("ConfigMap")
        for sts in workloads():
            name = what(sts)
            labels = sts["spec"]["template"]["metadata"]["labels"]
            self.assertEqual(sts["spec"]["selector"]["matchLabels"], labels, f"{name}: selector != pod labels")
            if sts["kind"] == "StatefulSet":
                service = sts["spec"].get("serviceName")
                self.assertIn(service, services, f"{name}: serviceName `{service}` is no Service in deploy/k8s")
                svc = resource("Service", service)
                self.assertEqual(
                    svc["spec"].get("clusterIP"), "None", f"Service {service} must be headless (clusterIP: None)"
                )
                self.assertEqual(svc["spec"]["selector"], labels, f"Service {service}: selector != {name}'s pod labels")
            spec = pod_spec(sts)
            volumes = {v["name"] for v in spec.get("volumes", [])}
            claims = {t["metadata"]["name"] for t in sts["spec"].get("volumeClaimTemplates", [])}
            for mount in container(sts).get("volumeMounts", []):
                self.assertIn(mount["name"], volumes | claims, f"{name}: mount `{mount['name']}` has no volume")
            for volume in spec.get("volumes", []):
                if "secret" in volume:
                    secret = volume["secret"]["secretName"]
                    self.assertIn(secret, secrets, f"{name}: Secret `{secret}` is not in deploy/k8s")
                if "configMap" in volume:
                    cm = volume["configMap"]["name"]
                    self.assertIn(cm, config_maps, f"{name}: ConfigMap `{cm}` is not in deploy/k8s")
            user = spec.get("securityContext", {}).get("runAsUser")
            self.assertEqual(user, dockerfile_uid(), f"{name}: runAsUser is not the Dockerfile's USER")

    def test_worker_ports_match(self):
        worker = workload(WORKER)
        c = container(worker)
        argv = c["args"]
        where = what(worker)
        self.assertEqual(argv[0], "worker", f"{where}: args must start with the subcommand `worker`")
        port = int(flag_value(argv, "--port", where))
        self.assertEqual(flag_value(argv, "--host", where), "0.0.0.0", f"{where}: --host must be 0.0.0.0")
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        self.assertIn(port, ports.values(), f"{where}: --port {port} is no containerPort {ports}")
        probe = c["readinessProbe"]["grpc"]
        self.assertEqual(probe["port"], port, f"{where}: the readiness probe checks {probe['port']}, not --port")
        self.assertEqual(probe.get("service"), "grpo.rollout.v1.RolloutWorker",
                         f"{where}: the readiness probe must ask the worker's gRPC health service")
        # The learner dials the address a worker advertises: its pod IP, on --port.
        env = {e["name"]: e for e in c.get("env", [])}
        advertised = flag_value(argv, "--advertise", where)
        m = re.fullmatch(r"\$\((\w+)\):(\d+)", advertised)
        self.assertTrue(m, f"{where}: --advertise {advertised} is not $(VAR):PORT")
        self.assertEqual(int(m.group(2)), port, f"{where}: --advertise {advertised} is not on --port {port}")
        field = env.get(m.group(1), {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        self.assertEqual(field, "status.podIP", f"{where}: ${m.group(1)} must be the pod IP (downward API)")

    def test_prometheus_scrapes_the_ports_that_serve_metrics(self):
        worker = workload(WORKER)
        c = container(worker)
        where = what(worker)
        port = int(flag_value(c["args"], "--metrics-port", where))
        self.assertEqual(
            {p["name"]: p["containerPort"] for p in c["ports"]}.get("metrics"), port,
            f"{where}: --metrics-port {port} is not the containerPort named metrics",
        )
        listen = learner_config().get("logging", {}).get("prometheus_listen", "")
        m = re.fullmatch(r"0\.0\.0\.0:(\d+)", listen)
        self.assertTrue(m, f"learner-configmap.yaml: [logging] prometheus_listen {listen!r} must be 0.0.0.0:PORT")
        learner = workload(LEARNER)
        ports = {p["name"]: p["containerPort"] for p in container(learner).get("ports", [])}
        self.assertEqual(ports.get("metrics"), int(m.group(1)),
                         f"{what(learner)}: prometheus_listen's port is not the containerPort named metrics")
        for workload_, served in [(worker, port), (learner, int(m.group(1)))]:
            notes = workload_["spec"]["template"]["metadata"].get("annotations", {})
            self.assertEqual(notes.get("prometheus.io/scrape"), "true", f"{what(workload_)}: not marked for scraping")
            self.assertEqual(notes.get("prometheus.io/port"), str(served),
                             f"{what(workload_)}: prometheus.io/port is not the port serving /metrics")

    def test_workers_register_with_the_learner(self):
        rollout = learner_config().get("rollout", {})
        self.assertNotIn("workers", rollout, "learner-configmap.yaml: the workers register; list no addresses")
        self.assertIs(rollout.get("in_process"), False, "learner-configmap.yaml: generate on the workers only")
        listen = rollout.get("listen", "")
        m = re.fullmatch(r"0\.0\.0\.0:(\d+)", listen)
        self.assertTrue(m, f"learner-configmap.yaml: [rollout] listen {listen!r} must be 0.0.0.0:PORT")
        port = int(m.group(1))
        learner = workload(LEARNER)
        ports = {p["name"]: p["containerPort"] for p in container(learner).get("ports", [])}
        self.assertIn(port, ports.values(), f"{what(learner)}: [rollout] listen port {port} is no containerPort")
        service = learner["spec"]["serviceName"]
        svc_ports = resource("Service", service)["spec"].get("ports", [])
        self.assertTrue(
            any(p["port"] == port and ports.get(p.get("targetPort"), p.get("targetPort")) == port for p in svc_ports),
            f"Service {service}: no port {port} to the learner's registry",
        )
        worker = workload(WORKER)
        expected = f"{LEARNER}-0.{service}:{port}"
        self.assertEqual(
            flag_value(container(worker)["args"], "--learner", what(worker)),
            expected,
            f"{what(worker)}: --learner must name the learner pod through Service {service} on [rollout] listen's port",
        )

    def test_token_files_are_the_mounted_secret(self):
        secret = resource("Secret", f"{WORKER}-token")
        keys = set(secret.get("stringData", {})) | set(secret.get("data", {}))
        for sts_name in (WORKER, LEARNER):
            sts = workload(sts_name)
            volume, source = volume_from(sts, "secret")
            self.assertEqual(source["secretName"], secret["metadata"]["name"], f"{what(sts)}: wrong token Secret")
            files = {f"{mount_of(sts, volume)}/{key}" for key in keys}
            if sts_name == WORKER:
                token_file = flag_value(container(sts)["args"], "--token-file", what(sts))
                where = f"{what(sts)}: --token-file"
            else:
                token_file = learner_config()["rollout"].get("worker_token_file")
                where = "learner-configmap.yaml: [rollout] worker_token_file"
            self.assertIn(token_file, files, f"{where} {token_file} is not the mounted Secret's file {files}")

    def test_worker_sequences_fit_the_learner(self):
        worker = workload(WORKER)
        argv = container(worker)["args"]
        worker_len = int(flag_value(argv, "--max-model-len", what(worker)))
        learner_len = learner_config()["rollout"]["max_model_len"]
        self.assertLessEqual(
            worker_len,
            learner_len,
            f"{what(worker)}: --max-model-len {worker_len} exceeds [rollout] max_model_len {learner_len}; "
            "the learner refuses longer sequences",
        )

    def test_learner_command_runs_the_config_into_its_volume(self):
        sts = workload(LEARNER)
        self.assertEqual(sts["spec"]["replicas"], 1, f"StatefulSet {LEARNER}: one learner")
        runs = [argv for argv in container_grpo_commands(sts, image_entrypoint()) if argv and argv[0] == "run"]
        self.assertEqual(len(runs), 1, f"StatefulSet {LEARNER}: expected one `grpo run`, found {runs}")
        argv = runs[0]
        volume, _ = volume_from(sts, "configMap")
        self.assertEqual(
            argv[1],
            f"{mount_of(sts, volume)}/{CONFIG_KEY}",
            f"StatefulSet {LEARNER}: `grpo run` is not given the ConfigMap's config",
        )
        out = flag_value(argv, "--out", f"StatefulSet {LEARNER}")
        self.assertEqual(
            out, learner_config()["logging"]["out"], f"StatefulSet {LEARNER}: --out differs from [logging] out"
        )
        claims = [t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]]
        self.assertTrue(
            any(PurePosixPath(out).is_relative_to(mount_of(sts, claim)) for claim in claims),
            f"StatefulSet {LEARNER}: the run folder {out} is on no volumeClaimTemplate",
        )
        self.assertIn("--resume", argv, f"StatefulSet {LEARNER}: a restarted pod must run `grpo run --resume`")


class Config(unittest.TestCase):
    def test_keys_exist_in_the_reference(self):
        reference = reference_keys()
        config = learner_config()
        for key in ("model", "data"):
            self.assertIn(key, config, f"learner-configmap.yaml: [{key}] is required")
        self.assertIn("name", config["model"], "learner-configmap.yaml: [model] name is required")
        self.assertIn("path", config["data"], "learner-configmap.yaml: [data] path is required")
        for section, table in config.items():
            self.assertIn(
                section, reference, f"learner-configmap.yaml: [{section}] is not a section of examples/reference.toml"
            )
            for entry in table if isinstance(table, list) else [table]:
                for key, value in entry.items():
                    self.assertIn(
                        key,
                        reference[section],
                        f"learner-configmap.yaml: [{section}] {key} is not in examples/reference.toml",
                    )
                    default = reference[section][key]
                    if default is not None:
                        self.assertIs(
                            type(value),
                            type(default),
                            f"learner-configmap.yaml: [{section}] {key} = {value!r} has another type "
                            f"than the reference's {default!r}",
                        )

    def test_data_is_shipped_in_the_image(self):
        path = PurePosixPath(learner_config()["data"]["path"])
        self.assertTrue(
            path.is_absolute(), f"learner-configmap.yaml: [data] path {path} must be absolute (the image's copy)"
        )
        for word, rest in dockerfile_stages()[-1]["instructions"]:
            if word != "COPY":
                continue
            flags, sources, dest = copy_args(rest)
            if any(f.startswith("--from") for f in flags) or len(sources) != 1:
                continue
            if path.is_relative_to(dest):
                shipped = ROOT / sources[0] / path.relative_to(dest)
                self.assertTrue(
                    shipped.is_file(),
                    f"[data] path {path} is {shipped.relative_to(ROOT)} in the repo, which does not exist",
                )
                return
        self.fail(f"learner-configmap.yaml: [data] path {path} is not under any COPY destination of deploy/Dockerfile")


class Dockerfile(unittest.TestCase):
    def test_copy_sources_exist_and_are_sent(self):
        patterns = dockerignore_patterns()
        for stage in dockerfile_stages():
            for word, rest in stage["instructions"]:
                if word != "COPY":
                    continue
                flags, sources, _ = copy_args(rest)
                if any(f.startswith("--from") for f in flags):
                    continue
                for source in sources:
                    self.assertTrue(
                        (ROOT / source).exists(), f"deploy/Dockerfile: COPY {source}: no such path in the repo"
                    )
                    self.assertFalse(
                        ignored(source, patterns), f"deploy/Dockerfile: COPY {source}, but .dockerignore drops it"
                    )

    def test_build_stage_has_the_whole_workspace(self):
        build = dockerfile_stages()[0]
        copied = [s for word, rest in build["instructions"] if word == "COPY" for s in copy_args(rest)[1]]
        cargo = tomllib.loads((ROOT / "Cargo.toml").read_text())
        members = cargo["workspace"]["members"]
        needed = ["Cargo.toml", "Cargo.lock", "src"] + members
        needed += [p for p in ("build.rs",) if (ROOT / p).exists()]
        # Files that the sources embed with include_str!/include_bytes!.
        for folder in ["src"] + [f"{m}/src" for m in members]:
            for rs in (ROOT / folder).glob("**/*.rs"):
                for included in re.findall(r'include_(?:str|bytes)!\("([^"]+)"\)', rs.read_text()):
                    needed.append(os.path.relpath((rs.parent / included).resolve(), ROOT))
        for path in needed:
            self.assertTrue(
                any(path == c or path.startswith(c.rstrip("/") + "/") for c in copied),
                f"deploy/Dockerfile: the build stage does not COPY {path}",
            )
        self.assertRegex(build["from"], r"^rust:", "deploy/Dockerfile: the build stage is not the official Rust image")
        m = re.match(r"rust:(\d+)\.(\d+)", build["from"])
        need = cargo["workspace"]["package"]["rust-version"]
        self.assertTrue(
            m and (int(m.group(1)), int(m.group(2))) >= tuple(int(x) for x in need.split(".")[:2]),
            f"deploy/Dockerfile: {build['from']} is older than the workspace's rust-version {need}",
        )
        runs = " ".join(rest for word, rest in build["instructions"] if word == "RUN")
        self.assertIn(
            "cargo build --release --locked",
            runs,
            "deploy/Dockerfile: the build stage must run cargo build --release --locked",
        )

    def test_runtime_stage_runs_setup_as_a_user_and_enters_grpo(self):
        final = dockerfile_stages()[-1]
        words = [word for word, _ in final["instructions"]]
        setup = [
            i
            for i, (word, rest) in enumerate(final["instructions"])
            if word == "RUN" and ["setup"] in [a[:1] for a in shell_grpo_commands("RUN " + rest)]
        ]
        self.assertTrue(setup, "deploy/Dockerfile: the runtime stage never runs `grpo setup`")
        self.assertIn(
            "USER",
            words[: setup[0]],
            "deploy/Dockerfile: `grpo setup` must run as the non-root USER (it owns the cache)",
        )
        self.assertNotEqual(dockerfile_uid(), 0, "deploy/Dockerfile: USER must not be root")
        env = " ".join(rest for word, rest in final["instructions"][: setup[0]] if word == "ENV")
        m = re.search(r"GRPO_CACHE_DIR=(\S+)", env)
        self.assertTrue(m, "deploy/Dockerfile: GRPO_CACHE_DIR must be set before `grpo setup`")
        self.assertEqual(image_entrypoint(), ["grpo"], 'deploy/Dockerfile: ENTRYPOINT must be ["grpo"]')
        # The pods' compile-cache volumes sit at <cache>/compiled, where grpo writes it.
        for sts in workloads():
            path = mount_of(sts, "compiled")
            self.assertEqual(
                path, f"{m.group(1)}/compiled", f"{what(sts)}: compile cache not at GRPO_CACHE_DIR/compiled"
            )


@unittest.skipUnless(
    os.environ.get("GRPO_BIN"),
    "GRPO_BIN is not set: set it to a built grpo binary (e.g. GRPO_BIN=target/debug/grpo) to check the flags",
)
class Flags(unittest.TestCase):
    def test_every_grpo_flag_exists(self):
        grpo = str((ROOT / os.environ["GRPO_BIN"]).resolve())
        self.assertTrue(os.access(grpo, os.X_OK), f"GRPO_BIN={os.environ['GRPO_BIN']} is not an executable")
        commands = []
        entrypoint = image_entrypoint()
        for file, doc in MANIFESTS:
            if doc["kind"] in WORKLOAD_KINDS:
                commands += [(f"deploy/k8s/{file}", argv) for argv in container_grpo_commands(doc, entrypoint)]
        for stage in dockerfile_stages():
            for word, rest in stage["instructions"]:
                if word == "RUN":
                    commands += [("deploy/Dockerfile", argv) for argv in shell_grpo_commands("RUN " + rest)]
        subcommands = {argv[0] for _, argv in commands}
        self.assertTrue(
            {"worker", "run", "setup"} <= subcommands, f"expected grpo worker, run and setup; found {subcommands}"
        )
        known = {sub: help_flags(grpo, sub) for sub in subcommands}
        for where, argv in commands:
            for arg in argv[1:]:
                if arg.startswith("--"):
                    flag = arg.split("=")[0]
                    self.assertIn(
                        flag, known[argv[0]], f"{where}: `grpo {argv[0]} {flag}` is not in `grpo {argv[0]} --help`"
                    )


if __name__ == "__main__":
    unittest.main()
