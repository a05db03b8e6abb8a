"""deploy/: the Kubernetes manifests against the Kubernetes JSON schemas (kubernetes-validate
vendors them), the Dockerfiles' shape, and their build and run steps (deploy/scripts/*.sh)
run for real: no container engine runs here, so CI runs the same scripts the images run."""

import glob
import os
import re
import subprocess
import sys
import tempfile

import kubernetes_validate
import pytest
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEPLOY = os.path.join(REPO, "deploy")
MANIFESTS = sorted(glob.glob(os.path.join(DEPLOY, "k8s", "*.yaml")))
DOCKERFILES = [os.path.join(DEPLOY, "Dockerfile"), os.path.join(DEPLOY, "Dockerfile.cpu")]
# the newest schemas the package ships, and an older release still common in clusters
VERSIONS = [kubernetes_validate.latest_version(), "1.29.0"]


def _docs():
    out = []
    for path in MANIFESTS:
        with open(path) as f:
            out += [(os.path.basename(path), d) for d in yaml.safe_load_all(f) if d]
    return out


def _kind(kind):
    return [d for _, d in _docs() if d["kind"] == kind]


def test_manifests_exist():
    assert {d["kind"] for _, d in _docs()} >= {"Job", "Deployment", "Service"}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name,doc", _docs(), ids=lambda v: v if isinstance(v, str) else v.get("kind"))
def test_manifest_validates(name, doc, version):
    # strict: a misspelled or misplaced field is an error, not silently ignored
    kubernetes_validate.validate(doc, version, strict=True)


def test_validator_rejects_a_broken_manifest():
    job = _kind("Job")[0]
    bad = yaml.safe_load(yaml.safe_dump(job))
    bad["spec"]["template"]["spec"]["containers"][0]["resource"] = {}  # misspelled
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, VERSIONS[0], strict=True)
    bad = yaml.safe_load(yaml.safe_dump(job))
    bad["spec"]["backoffLimit"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, VERSIONS[0], strict=True)


def test_deployment_pod():
    (dep,) = _kind("Deployment")
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    cs = {c["name"]: c for c in pod["containers"]}
    http, engine = cs["http"], cs["engine"]
    # front + engine in one pod, over a socket in a shared volume
    sock = engine["args"][engine["args"].index("uds") + 1]
    assert http["args"][http["args"].index("--connect") + 1] == sock
    mounts = lambda c: {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}  # noqa: E731
    shared = set(mounts(http)) & set(mounts(engine))
    assert any(sock.startswith(mounts(engine)[v] + "/") for v in shared)
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == 1
    port = http["ports"][0]
    probe = http["readinessProbe"]["httpGet"]
    assert probe["path"] == "/health" and probe["port"] in (port["name"], port["containerPort"])
    assert http["args"][http["args"].index("--port") + 1] == str(port["containerPort"])
    (svc,) = _kind("Service")
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()


def test_job():
    (job,) = _kind("Job")
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["securityContext"]["runAsNonRoot"] is True
    (c,) = pod["containers"]
    assert c["args"][0] == "system1" and c["resources"]["limits"]["nvidia.com/gpu"] == 1


def _stages(path):
    """[(base image, stage name, [instructions])] of a Dockerfile (continuation lines joined)."""
    with open(path) as f:
        text = re.sub(r"\\\n", " ", f.read())
    args = dict(re.findall(r"^ARG (\w+)=(\S*)", text, re.M))
    stages = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"FROM (\S+)(?: AS (\w+))?", line)
        if m:
            image = re.sub(r"\$\{(\w+)\}", lambda v: args.get(v.group(1), ""), m.group(1))
            stages.append((image, m.group(2), []))
        elif stages:
            stages[-1][2].append(line)
    return stages


@pytest.mark.parametrize("path", DOCKERFILES, ids=os.path.basename)
def test_dockerfile(path):
    stages = _stages(path)
    assert [s[1] for s in stages] == ["build", "runtime"]
    (_, _, build), (_, _, runtime) = stages
    assert any("deploy/scripts/build-wheel.sh" in i for i in build)
    assert any("install-runtime.sh" in i for i in runtime)
    assert any(i.startswith("COPY --from=build") for i in runtime)
    users = [i.split()[1] for i in runtime if i.startswith("USER ")]
    assert users and users[-1] not in ("root", "0")
    assert any(i.startswith("ENTRYPOINT") and "reflex" in i for i in runtime)
    for i in stages[0][2] + runtime:  # every script a step names exists and is executable
        for script in re.findall(r"deploy/scripts/[\w.-]+|/opt/reflex-scripts/[\w.-]+", i):
            p = os.path.join(DEPLOY, "scripts", os.path.basename(script))
            assert os.access(p, os.X_OK), p
    if path.endswith("Dockerfile"):  # the CUDA image: nvcc in the build stage only
        assert "-devel-" in stages[0][0] and "-runtime-" in stages[1][0]
        assert any("REQUIRE_FATBIN=1" in i for i in build)
        assert any("WITH_CUDA=1" in i for i in runtime)
    else:
        assert "cuda" not in open(path).read().lower().replace("no cuda", "")


def test_build_install_and_run_scripts(smollm2):
    """The images' steps, run here: the wheel (with reflex_client), a byte-compiled venv from
    it (SYSTEM_SITE=1: the dependencies come from this machine instead of a download), and the
    smoke run of `reflex http` from that venv on SmolLM2 (CPU)."""
    env = dict(os.environ, PY=sys.executable, SYSTEM_SITE="1")
    env.pop("PYTHONPATH", None)  # the installed wheel must work on its own
    with tempfile.TemporaryDirectory() as tmp:
        wheels, venv = os.path.join(tmp, "wheels"), os.path.join(tmp, "venv")
        for argv in ([os.path.join(DEPLOY, "scripts", "build-wheel.sh"), wheels],
                     [os.path.join(DEPLOY, "scripts", "install-runtime.sh"), wheels, venv]):
            p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, cwd=tmp)
            assert p.returncode == 0, p.stdout + p.stderr
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        p = subprocess.run([os.path.join(DEPLOY, "scripts", "smoke.sh"), venv, str(port), "--device", "cpu"],
                           env=env, capture_output=True, text=True, timeout=600, cwd=tmp)
        assert p.returncode == 0 and "smoke: ok" in p.stdout, p.stdout + p.stderr
        # it ran the venv's reflex_ipc, not the source tree's
        out = subprocess.run([os.path.join(venv, "bin", "python"), "-c",
                              "import reflex_ipc, reflex_client; print(reflex_ipc.__file__, reflex_client.__file__)"],
                             env=env, capture_output=True, text=True, cwd=tmp).stdout
        assert out.count(venv) == 2, out
