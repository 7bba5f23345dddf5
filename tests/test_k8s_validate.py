"""The Kubernetes manifest against the API schemas of every version it claims (with
kubernetes-validate, strict: an unknown field is an error), against the Pod Security
"restricted" level (the published rules, checked here), and a real push of an image whose
recorded digest is the digest of the bytes written."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from packaging.version import Version
from test_k8s import _record_push, _with_image
from test_report import fake_repro

from reprobox.cli import scaleout as scaleout_cli
from reprobox.core import spec
from reprobox.core.errors import BadInput
from reprobox.run import pushes
from reprobox.run.backends import container
from reprobox.run.pipeline import lock_path
from reprobox.scaleout import jobs, k8s


@pytest.fixture
def ppo_root(scratch_root: Path) -> Path:
    fake_repro(scratch_root)
    return scratch_root


def _claimed_versions() -> list[str]:
    """Every Kubernetes minor version kubernetes-validate knows, from the claimed one on."""
    known = {".".join(v.split(".")[:2]) for v in kubernetes_validate.utils.all_versions()}
    claimed = [v for v in known if Version(v) >= Version(k8s.MIN_KUBERNETES)]
    return sorted(claimed, key=Version)


def _every_object(root: Path) -> list[dict[str, Any]]:
    """The Jobs of all cells (gpu: GPU limits too), one explicit-image Job, a collector."""
    cells = jobs.job_cells(root, "ppo", "all", "gpu")
    images = {c.index: f"reg.example/rb/ppo@sha256:{c.index:064x}" for c in cells}
    objects = k8s.manifest(cells, images)
    cpu = jobs.job_cells(root, "ppo", "default", "cpu")
    objects += k8s.manifest(cpu, options=k8s.K8sOptions(image="r/p@sha256:" + "1" * 64))
    objects.append(k8s.collector("ppo", images[0]))
    # round-trip through the YAML people apply
    return [o for o in yaml.safe_load_all(k8s.dump(objects)) if o]


def test_the_claimed_versions_are_known() -> None:
    versions = _claimed_versions()
    assert versions[0] == k8s.MIN_KUBERNETES and len(versions) >= 5, versions


@pytest.mark.parametrize("version", _claimed_versions())
def test_manifest_validates_strictly(ppo_root: Path, version: str) -> None:
    for obj in _every_object(ppo_root):
        kubernetes_validate.validate(obj, version, strict=True)


def test_versions_before_the_claim_lack_the_per_index_fields(ppo_root: Path) -> None:
    """1.27 has no backoffLimitPerIndex at all (1.28 has it only behind an alpha gate, off
    by default): why the manifest says 1.29."""
    job = next(o for o in _every_object(ppo_root) if o["kind"] == "Job")
    with pytest.raises(kubernetes_validate.ValidationError, match="backoffLimitPerIndex"):
        kubernetes_validate.validate(job, "1.27", strict=True)


# ---- Pod Security Standards, "restricted" (baseline included), as published for v1.29+

BASELINE_CAPABILITIES = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
    "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}  # fmt: skip
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}  # fmt: skip
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
RESTRICTED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
    "projected", "secret",
}  # fmt: skip


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """What in a pod spec breaks the Pod Security "restricted" level (baseline included),
    one line per broken rule; empty when the pod is admitted."""
    bad: list[str] = []
    pod_sc = pod.get("securityContext") or {}
    containers = [
        *pod.get("initContainers", []), *pod.get("containers", []),
        *pod.get("ephemeralContainers", []),
    ]  # fmt: skip
    contexts = [(c["name"], c.get("securityContext") or {}) for c in containers]
    # baseline
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(field):
            bad.append(f"host namespaces: {field}")
    for where, sc in [("pod", pod_sc), *contexts]:
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            bad.append(f"HostProcess: {where}")
        if sc.get("privileged"):
            bad.append(f"privileged: {where}")
        selinux = sc.get("seLinuxOptions") or {}
        if (
            selinux.get("type", "") not in SELINUX_TYPES
            or selinux.get("user")
            or selinux.get("role")
        ):
            bad.append(f"SELinux: {where}")
        if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
            bad.append(f"seccomp Unconfined: {where}")
        if (sc.get("appArmorProfile") or {}).get("type") not in (None, "RuntimeDefault",
                                                                 "Localhost"):  # fmt: skip
            bad.append(f"AppArmor: {where}")
        if sc.get("procMount", "Default") != "Default":
            bad.append(f"/proc mount: {where}")
        if sc.get("runAsUser") == 0:
            bad.append(f"runAsUser 0: {where}")
        if sc.get("runAsNonRoot") is False:
            bad.append(f"runAsNonRoot false: {where}")
    for sysctl in pod_sc.get("sysctls", []):
        if sysctl["name"] not in SAFE_SYSCTLS:
            bad.append(f"sysctl {sysctl['name']}")
    for each in containers:
        for port in each.get("ports", []):
            if port.get("hostPort"):
                bad.append(f"hostPort: {each['name']}")
    for volume in pod.get("volumes", []):
        kinds = set(volume) - {"name"}
        if "hostPath" in kinds:
            bad.append(f"hostPath volume {volume['name']}")
        if not kinds <= RESTRICTED_VOLUMES:
            bad.append(f"volume type {sorted(kinds)} of {volume['name']}")
    # restricted
    for name, sc in contexts:
        if sc.get("allowPrivilegeEscalation") is not False:
            bad.append(f"allowPrivilegeEscalation not false: {name}")
        caps = sc.get("capabilities") or {}
        if "ALL" not in caps.get("drop", []):
            bad.append(f"capabilities not dropping ALL: {name}")
        if not set(caps.get("add", [])) <= {"NET_BIND_SERVICE"}:
            bad.append(f"capabilities added: {name}")
        if not set(caps.get("add", [])) <= BASELINE_CAPABILITIES:
            bad.append(f"capabilities beyond baseline: {name}")
        if pod_sc.get("runAsNonRoot") is not True and sc.get("runAsNonRoot") is not True:
            bad.append(f"runAsNonRoot not true: {name}")
        seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            bad.append(f"seccomp not RuntimeDefault or Localhost: {name}")
    return bad


def _pods(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    found = [o["spec"]["template"]["spec"] for o in objects if o["kind"] == "Job"]
    return found + [o["spec"] for o in objects if o["kind"] == "Pod"]


def test_every_pod_meets_the_restricted_level(ppo_root: Path) -> None:
    pods = _pods(_every_object(ppo_root))
    assert len(pods) >= 3
    for pod in pods:
        assert restricted_violations(pod) == []
        assert pod["automountServiceAccountToken"] is False
        for container_spec in pod["containers"]:
            sc = container_spec["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True
            assert (sc["runAsUser"], sc["runAsGroup"]) == (10001, 10001)  # the image's user
            resources = container_spec["resources"]
            assert set(resources["requests"]) == {"cpu", "memory"}
            assert {"cpu", "memory"} <= set(resources["limits"])
            writable = {m["mountPath"] for m in container_spec["volumeMounts"]
                        if not m.get("readOnly")}  # fmt: skip
            assert writable <= {"/out", "/cache", "/tmp", "/dev/shm"}
        for volume in pod["volumes"]:
            if "emptyDir" in volume:
                assert volume["emptyDir"]["sizeLimit"].endswith(("Gi", "Mi"))


def test_the_check_can_fail(ppo_root: Path) -> None:
    """The rules bite: each weakening is named."""
    pod = _pods(_every_object(ppo_root))[0]
    container_sc = pod["containers"][0]["securityContext"]
    container_sc["capabilities"] = {"drop": [], "add": ["SYS_ADMIN"]}
    container_sc["allowPrivilegeEscalation"] = True
    container_sc["seccompProfile"] = {"type": "Unconfined"}
    pod["hostPID"] = True
    pod["volumes"].append({"name": "root", "hostPath": {"path": "/"}})
    found = restricted_violations(pod)
    for rule in ("capabilities not dropping ALL", "capabilities added", "beyond baseline",
                 "allowPrivilegeEscalation", "seccomp Unconfined", "host namespaces",
                 "hostPath volume"):  # fmt: skip
        assert any(rule in line for line in found), (rule, found)


# ---- a real push: the digest recorded is the digest of the bytes written


@pytest.fixture
def engine() -> container.Engine:  # a look-up: no need to share it
    try:
        return container.find_engine("podman")
    except Exception as exc:
        if os.environ.get("REPROBOX_SKIP_CONTAINERS") == "1":
            pytest.skip(f"REPROBOX_SKIP_CONTAINERS=1: {exc}")
        pytest.fail(f"{exc} (or set REPROBOX_SKIP_CONTAINERS=1 to leave container tests out)")


@pytest.mark.container
def test_push_records_the_digest_of_what_was_written(
    engine: container.Engine, ppo_root: Path, tmp_path: Path
) -> None:
    _with_image(ppo_root)
    repro = spec.load(ppo_root, "ppo")
    image = container.image_spec(ppo_root, repro, "broken", "cpu",
                                 lock_path(repro, "broken", "cpu"))  # fmt: skip
    context = tmp_path / "context"
    context.mkdir()
    (context / "payload").write_text(image.tag)
    (context / "Containerfile").write_text("FROM scratch\nCOPY payload /payload\n")
    built = subprocess.run([engine.name, "build", "-q", "-t", image.tag, str(context)],
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    assert built.returncode == 0, built.stderr
    results = ppo_root / "results"
    try:
        layout = tmp_path / "layout"
        pushed = container.push(engine, image, f"oci:{layout}", results)
    finally:
        subprocess.run([engine.name, "rmi", "-f", image.tag], capture_output=True, timeout=120)
    # the layout's index names the manifest by the recorded digest; the blob hashes to it
    [entry] = json.loads((layout / "index.json").read_text())["manifests"]
    assert entry["digest"] == pushed.digest
    algorithm, hexdigest = pushed.digest.split(":")
    blob = (layout / "blobs" / algorithm / hexdigest).read_bytes()
    assert hashlib.sha256(blob).hexdigest() == hexdigest
    assert (
        entry["annotations"]["org.opencontainers.image.ref.name"]
        == "ppo-" + (image.tag.rsplit(":", 1)[1])
    )
    assert pushes.load(results, "ppo") == [pushed]
    assert pushed.reference == f"oci:{layout}@{pushed.digest}"
    # a layout is not a registry a cluster pulls from: k8s still asks for a push
    cells = jobs.job_cells(ppo_root, "ppo", "default", "cpu")
    settings = scaleout_cli.Settings.from_env()
    with pytest.raises(BadInput, match=r"broken: image .* was never pushed"):
        scaleout_cli.pushed_images(settings, "ppo", cells, None)
    # once pushed to a registry, each cell's image is named by its digest
    for variant in ("broken", "fixed"):
        _record_push(ppo_root, variant)
    named = scaleout_cli.pushed_images(settings, "ppo", cells, None)
    assert all(k8s.is_digest_reference(ref) for ref in named.values())


def test_push_to_a_bad_registry_name_is_bad_input() -> None:
    for registry in ("https://reg.example/rb", "reg example", ""):
        with pytest.raises(BadInput, match="--push"):
            pushes.remote_name(registry, "ppo")
    assert pushes.remote_name("reg.example/rb/", "ppo") == "reg.example/rb/ppo"


def test_a_damaged_push_record_is_named(ppo_root: Path) -> None:
    path = pushes.push_file(ppo_root / "results", "ppo")
    path.parent.mkdir(parents=True)
    path.write_text('[{"digest": "sha256:nope"}]')
    with pytest.raises(BadInput, match=r"pushed\.json: not a push record"):
        pushes.load(ppo_root / "results", "ppo")


def test_container_runs_are_confined() -> None:
    """The podman / docker side of the same hardening (real runs: tests/test_images_e2e.py)."""
    flags = container.Engine("podman").confine_flags(container.default_memory(4))
    assert flags == ["--cap-drop=ALL", "--security-opt=no-new-privileges", "--read-only",
                     "--pids-limit=4096", "--memory=17g", "--shm-size=1g"]  # fmt: skip
    assert "--tmpfs" in container.Engine("docker").confine_flags("8g")  # docker mounts no /tmp
    assert container.check_memory("16G") == "16g"
    for bad in ("16 GB", "-1g", "0", "lots"):
        with pytest.raises(BadInput, match="--memory"):
            container.check_memory(bad)
