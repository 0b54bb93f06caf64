"""What a VM of a GCP managed instance group / AWS Auto Scaling group sees, on 127.0.0.1.

The startup scripts in ``deploy/gcp-mig/`` and ``deploy/aws-asg/`` run unchanged, as a ``bash``
process each ("a VM"), against:

* :class:`MetadataServer`: the VM's metadata server, an ``http.server`` in a thread, in the GCP
  flavour (``/computeMetadata/v1/...``, ``Metadata-Flavor: Google`` required) or the AWS flavour
  (IMDSv2: ``PUT /latest/api/token`` first, then ``GET /latest/meta-data/...`` with the token;
  instance tags under ``tags/instance/``). It can answer 503 to its first requests.
* a stand-in ``gcloud`` / ``aws`` first on ``PATH`` (:func:`install_cloud_cli`): it appends its
  argv (and exit status) to a JSON-lines record; ``gcloud storage cp`` / ``aws s3 cp`` really copy
  through fsspec to the object-store server of the test (SeaweedFS, fake-gcs-server); the
  group commands succeed (or fail their first N calls); the IAM reads of ``create-group.sh``
  answer what ``STANDIN_IAM`` (GCP: the project's and the bucket's policies, custom roles'
  permissions) or ``STANDIN_PROFILE_ROLE`` / ``STANDIN_DENIED`` (AWS: the instance profile's role,
  the actions its policy simulation denies) say, by default roles that suffice; anything else
  fails loudly. Beside them, ``mlm-pipeline`` runs this checkout's CLI (``create-group.sh`` checks
  the settings with it).
* an "image": a Python whose site-packages holds mlm-pipeline's dependencies but not
  mlm-pipeline (:func:`image_site`, put on ``PYTHONPATH``), so the script's own venv + ``pip
  install`` of the wheel from the bucket runs for real, offline (``PIP_NO_INDEX=1``).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GCP_DIR = REPO / "deploy" / "gcp-mig"
AWS_DIR = REPO / "deploy" / "aws-asg"

CORPUS = [REPO / "sample" / "sample_text.txt", REPO / "sample" / "wikitext2-train-1MB.txt"]
# the VMs' `prepare` options (and the same for the local run they must equal): several small tasks
# per VM, so that a kill lands mid-run; one task process per VM
PREPARE_ARGS = "--split-size 128KiB --block-size 32KiB --max-instances-per-shard 300 --workers 1"
SETTINGS = {"split_bytes": "128KiB", "block_bytes": "32KiB", "max_instances_per_shard": 300, "workers": 1}


# --------------------------------------------------------------------------------------------
# metadata servers


class MetadataServer:
    """A GCP metadata server or an AWS instance metadata service (IMDSv2) for one VM, serving
    from construction until :meth:`close`."""

    TOKEN_TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
    TOKEN_HEADER = "X-aws-ec2-metadata-token"

    def __init__(self, flavour: str, values: dict[str, str], fail_first: int = 0):
        assert flavour in ("gcp", "aws")
        self.flavour = flavour
        self.values = dict(values)
        self.fail_first = fail_first
        self.requests: list[tuple[str, str, int]] = []  # (method, path, status)
        self.token = "token-" + os.urandom(8).hex()
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                server._answer(self, "GET")

            def do_PUT(self):
                server._answer(self, "PUT")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def env(self) -> dict[str, str]:
        """How the startup script finds this server."""
        if self.flavour == "gcp":
            return {"GCE_METADATA_HOST": f"127.0.0.1:{self.port}"}
        return {"AWS_EC2_METADATA_SERVICE_ENDPOINT": f"http://127.0.0.1:{self.port}/"}

    def _status_and_body(self, handler: BaseHTTPRequestHandler, method: str) -> tuple[int, str]:
        with self._lock:
            if self.fail_first > 0:
                self.fail_first -= 1
                return 503, "unavailable"
        path = handler.path.split("?", 1)[0]
        if self.flavour == "gcp":
            if handler.headers.get("Metadata-Flavor") != "Google":
                return 403, "Missing Metadata-Flavor: Google header"
            prefix = "/computeMetadata/v1/"
            if method != "GET" or not path.startswith(prefix):
                return 404, "not found"
            key = path[len(prefix):]
        else:
            if path == "/latest/api/token":
                if method != "PUT" or not handler.headers.get(self.TOKEN_TTL_HEADER):
                    return 400, "bad token request"
                return 200, self.token
            if handler.headers.get(self.TOKEN_HEADER) != self.token:
                return 401, "unauthorized"  # IMDSv2: no token, no answer
            prefix = "/latest/meta-data/"
            if method != "GET" or not path.startswith(prefix):
                return 404, "not found"
            key = path[len(prefix):]
        if key not in self.values:
            return 404, "not found"
        return 200, self.values[key]

    def _answer(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        status, body = self._status_and_body(handler, method)
        with self._lock:
            self.requests.append((method, handler.path, status))
        data = body.encode()
        handler.send_response(status)
        if self.flavour == "gcp":
            handler.send_header("Metadata-Flavor", "Google")
        handler.send_header("Content-Type", "text/plain")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)


def gcp_metadata(name: str, zone: str, project: str, created_by: str, attributes: dict[str, str],
                 fail_first: int = 0) -> MetadataServer:
    values = {"instance/name": name, "instance/zone": f"projects/123456789/zones/{zone}",
              "project/project-id": project, "instance/attributes/created-by": created_by}
    values.update({f"instance/attributes/{k}": v for k, v in attributes.items()})
    return MetadataServer("gcp", values, fail_first)


def aws_metadata(instance_id: str, region: str, tags: dict[str, str], fail_first: int = 0) -> MetadataServer:
    values = {"instance-id": instance_id, "placement/region": region,
              "placement/availability-zone": region + "a"}
    values.update({f"tags/instance/{k}": v for k, v in tags.items()})
    return MetadataServer("aws", values, fail_first)


# --------------------------------------------------------------------------------------------
# stand-in cloud CLIs

STANDIN = r'''#!{python}
"""Stand-in for the {tool} CLI (tests/deploy/vm_harness.py): records its argv, copies for real."""
import fcntl, json, os, shutil, sys

tool = os.path.basename(sys.argv[0])
argv = sys.argv[1:]
record = os.environ["STANDIN_RECORD"]


def entries():
    try:
        with open(record) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def positional(args):
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a.startswith("--"):
            skip = "=" not in a and a in ("--region", "--endpoint-url", "--project", "--zone")
        else:
            out.append(a)
    return out


def copy(src, dst):
    import fsspec

    with fsspec.open(src, "rb") as f, fsspec.open(dst, "wb") as g:
        shutil.copyfileobj(f, g)


def starts(words, *prefixes):
    return any(tuple(words[:len(p)]) == p for p in prefixes)


def values_of(flag):
    """The values after ``flag`` up to the next flag."""
    out = []
    if flag in argv:
        for a in argv[argv.index(flag) + 1:]:
            if a.startswith("--"):
                break
            out.append(a)
    return out


def iam():
    """GCP policies and custom roles (STANDIN_IAM), by default the roles create-group.sh asks for."""
    member = "serviceAccount:" + os.environ.get("SERVICE_ACCOUNT", "")
    default = {{"project": {{"roles/compute.instanceAdmin.v1": [member]}},
               "bucket": {{"roles/storage.objectAdmin": [member]}}, "roles": {{}}}}
    return json.loads(os.environ["STANDIN_IAM"]) if os.environ.get("STANDIN_IAM") else default


def policy(bindings):
    return json.dumps({{"bindings": [{{"role": r, "members": m}} for r, m in bindings.items()], "etag": "BwX="}})


status, extra = 0, {{}}
words = positional(argv)
group_cmds = (("compute", "instance-groups", "managed", "delete-instances"),
              ("autoscaling", "terminate-instance-in-auto-scaling-group"))
if starts(words, ("storage", "cp"), ("s3", "cp")) and len(words) == 4:
    try:
        copy(words[2], words[3])
    except Exception as exc:  # like the real CLIs: a message and status 1
        print(f"{{tool}}: copy failed: {{type(exc).__name__}}: {{exc}}", file=sys.stderr)
        status = 1
elif starts(words, *group_cmds):
    # STANDIN_FAIL_GROUP_CALLS=N: the first N calls fail, like a transient API error
    earlier = sum(1 for e in entries() if starts(e["words"], *group_cmds))
    if earlier < int(os.environ.get("STANDIN_FAIL_GROUP_CALLS", "0")):
        print("ERROR: service unavailable, try again", file=sys.stderr)
        status = 1
elif starts(words, ("config", "get-value", "project")):
    print(os.environ.get("STANDIN_PROJECT", "standin-project"))
elif starts(words, ("projects", "get-iam-policy")):
    print(policy(iam()["project"]))
elif starts(words, ("storage", "buckets", "get-iam-policy")):
    print(policy(iam()["bucket"]))
elif starts(words, ("iam", "roles", "describe")) and words[3] in iam()["roles"]:
    print(json.dumps({{"name": words[3], "includedPermissions": iam()["roles"][words[3]]}}))
elif starts(words, ("iam", "get-instance-profile")):
    role = os.environ.get("STANDIN_PROFILE_ROLE", "arn:aws:iam::123456789012:role/mlm-pipeline-worker")
    if role == "missing":
        print("An error occurred (NoSuchEntity) when calling the GetInstanceProfile operation", file=sys.stderr)
        status = 254
    else:
        print(role)
elif starts(words, ("iam", "simulate-principal-policy")):
    denied = os.environ.get("STANDIN_DENIED", "").split()
    print("\t".join(a for a in values_of("--action-names") if a in denied))
elif starts(words, ("compute", "instance-templates", "create"), ("compute", "instance-groups", "managed", "create"),
            ("ec2", "create-launch-template"), ("autoscaling", "create-auto-scaling-group"),
            ("autoscaling", "suspend-processes"), ("compute", "instance-templates", "delete"),
            ("compute", "instance-groups", "managed", "delete"), ("ec2", "delete-launch-template"),
            ("autoscaling", "delete-auto-scaling-group")):
    for a in argv:  # the launch template's data is a temporary file: keep its content
        if a.startswith("file://"):
            extra["file"] = open(a[len("file://"):]).read()
else:
    print(f"stand-in {{tool}}: unexpected command {{argv}}", file=sys.stderr)
    status = 2
with open(record, "a") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    f.write(json.dumps({{"tool": tool, "argv": argv, "words": words, "status": status, **extra}}) + "\n")
sys.exit(status)
'''


def install_cloud_cli(bin_dir: Path) -> Path:
    """Write the stand-in ``gcloud`` and ``aws`` into ``bin_dir`` (to go first on PATH), and an
    ``mlm-pipeline`` that runs this checkout's CLI (the VMs run their own, from their venv)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for tool in ("gcloud", "aws"):
        path = bin_dir / tool
        path.write_text(STANDIN.format(python=sys.executable, tool=tool))
        path.chmod(0o755)
    cli = bin_dir / "mlm-pipeline"
    cli.write_text(f'#!/bin/sh\nPYTHONPATH={REPO / "src"} exec {sys.executable} -m mlm_pipeline.cli "$@"\n')
    cli.chmod(0o755)
    return bin_dir


def read_record(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def group_calls(record: list[dict]) -> list[dict]:
    """The self-delete commands in a record."""
    return [e for e in record if "delete-instances" in e["words"]
            or "terminate-instance-in-auto-scaling-group" in e["words"]]


# --------------------------------------------------------------------------------------------
# the image: dependencies without mlm-pipeline, and the wheel


def image_site(dest: Path) -> Path:
    """A site directory with this interpreter's packages except mlm-pipeline (links, no copies)."""
    dest.mkdir(parents=True, exist_ok=True)
    site = Path(sysconfig.get_paths()["purelib"])
    for entry in site.iterdir():
        name = entry.name
        if name.startswith(("mlm_pipeline", "__editable__.mlm_pipeline", "__editable___mlm_pipeline")):
            continue
        (dest / name).symlink_to(entry)
    return dest


def build_wheel(dest: Path) -> Path:
    """The wheel of this checkout (PEP 517 hook of setuptools on a copy of the sources)."""
    src = dest / "src-copy"
    shutil.copytree(REPO / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    out = dest / "dist"
    out.mkdir()
    subprocess.run([sys.executable, "-c", "import sys, setuptools.build_meta as b; b.build_wheel(sys.argv[1])",
                    str(out)], cwd=src, check=True, capture_output=True)
    (wheel,) = out.glob("mlm_pipeline-*.whl")
    return wheel


# --------------------------------------------------------------------------------------------
# the bucket (call inside conftest_servers.s3_env(server), which sets the endpoint and credentials)


def put(local: Path, url: str) -> str:
    import fsspec

    with open(local, "rb") as f, fsspec.open(url, "wb") as g:
        shutil.copyfileobj(f, g)
    return url


def listing(prefix: str) -> list[str]:
    """Object names under ``prefix`` (relative to it), listed afresh."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(prefix)
    fs.invalidate_cache()
    try:
        found = fs.find(path)
    except FileNotFoundError:
        return []
    return sorted(p[len(path.rstrip("/")) + 1:] for p in found)


def read_text(url: str) -> str:
    import fsspec

    fs, path = fsspec.core.url_to_fs(url)
    fs.invalidate_cache()
    return fs.cat_file(path).decode(errors="replace")


# --------------------------------------------------------------------------------------------
# running the group-creation scripts and the VMs


def run_create_group(script: Path, env_extra: dict, record: Path, bin_dir: Path) -> list[dict]:
    create_group_output(script, env_extra, record, bin_dir)
    return read_record(record)


def create_group_output(script: Path, env_extra: dict, record: Path, bin_dir: Path) -> str:
    """Run a create-group.sh with the stand-ins first on PATH; its stdout (CalledProcessError if it fails)."""
    env = {**os.environ, **env_extra, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "STANDIN_RECORD": str(record)}
    env.pop("PYTHONPATH", None)
    return subprocess.run(["bash", str(script)], env=env, check=True, capture_output=True, text=True,
                          timeout=120).stdout


def gcp_template_metadata(record: list[dict]) -> tuple[dict[str, str], dict]:
    """The metadata attributes create-group.sh gave the template, and the group's settings."""
    (template,) = [e for e in record if e["words"][:3] == ["compute", "instance-templates", "create"]]
    (group,) = [e for e in record if e["words"][:4] == ["compute", "instance-groups", "managed", "create"]]
    attributes = {}
    for arg in template["argv"]:
        if arg.startswith("--metadata="):
            value = arg[len("--metadata="):]
            sep = "," if not value.startswith("^") else value[1:value.index("^", 1)]
            value = value[value.index("^", 1) + 1:] if value.startswith("^") else value
            for item in value.split(sep):
                key, _, val = item.partition("=")
                attributes[key] = val
        if arg.startswith("--metadata-from-file="):
            key, _, path = arg[len("--metadata-from-file="):].partition("=")
            attributes[key] = Path(path).read_text()
    flags = dict(a[2:].split("=", 1) for a in group["argv"] if a.startswith("--") and "=" in a)
    return attributes, {"name": group["words"][4], **flags}


def aws_launch_template(record: list[dict]) -> tuple[dict, dict[str, str], dict]:
    """The launch template data, its instance tags, and the group's create call from the record."""
    (lt,) = [e for e in record if e["words"][:2] == ["ec2", "create-launch-template"]]
    (asg,) = [e for e in record if e["words"][:2] == ["autoscaling", "create-auto-scaling-group"]]
    data = json.loads(lt["file"])
    (spec,) = [s for s in data["TagSpecifications"] if s["ResourceType"] == "instance"]
    tags = {t["Key"]: t["Value"] for t in spec["Tags"]}
    return data, tags, asg


def user_data(data: dict) -> str:
    return base64.b64decode(data["UserData"]).decode()


@dataclass
class VM:
    """One startup-script process (its own session: killing the group kills the "VM")."""

    name: str
    work: Path
    record: Path
    proc: subprocess.Popen
    console: Path
    server: MetadataServer

    @property
    def venv(self) -> Path:
        return self.work / "venv"

    def prepare_pid(self) -> int | None:
        try:
            return int((self.work / "state" / "prepare.pid").read_text())
        except (FileNotFoundError, ValueError):
            return None

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"VM {self.name} still running after {timeout}s:\n{self.output()}") from None

    def kill(self) -> None:
        """The VM dies: SIGKILL to the script and everything it started (also what outlived the
        script: its lifetime watchdog sleeps on after a script that exits leaving the VM up)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if self.proc.poll() is None:
            self.proc.wait(10)

    def stop(self) -> None:
        """End of the test: the VM killed if still running, its metadata server closed."""
        self.kill()
        self.server.close()

    def output(self) -> str:
        text = self.console.read_text(errors="replace") if self.console.exists() else ""
        log = self.work / "state" / "worker.log"
        if log.exists():
            text += "\n--- worker.log ---\n" + log.read_text(errors="replace")[-6000:]
        return text

    def calls(self) -> list[dict]:
        return read_record(self.record)


def make_venv(dest: Path) -> Path:
    """A venv (with pip) like the one the startup script makes, for images that bring one."""
    subprocess.run([sys.executable, "-m", "venv", str(dest)], check=True, capture_output=True)
    return dest


def start_vm(script: str, name: str, root: Path, *, metadata: MetadataServer, bin_dir: Path, site: Path,
             tokenizer_dir: Path, store_env: dict, extra_env: dict | None = None,
             venv: Path | None = None) -> VM:
    """Run ``script`` (the startup script's text) as a VM named ``name``; with ``venv``, the VM's
    image has a copy of it (the script then skips making one)."""
    work = root / name
    work.mkdir(parents=True)
    if venv is not None:
        shutil.copytree(venv, work / "venv", symlinks=True)
    path = work / "startup.sh"
    path.write_text(script)
    record = work / "calls.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PYTHON", "MLM_", "PIP_"))}
    env.update(store_env)
    env.update(metadata.env())
    env.update({
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "STANDIN_RECORD": str(record),
        "PYTHONPATH": str(site),  # the image's packages: mlm-pipeline's dependencies, not mlm-pipeline
        "PIP_NO_INDEX": "1",  # offline: the dependencies are there, the wheel is the bucket's
        "PIP_NO_CACHE_DIR": "1",
        "MLM_PYTHON": sys.executable,
        "MLM_WORK_DIR": str(work / "state"),
        "MLM_VENV": str(work / "venv"),
        "MLM_TOKENIZER_DIR": str(tokenizer_dir),
        "MLM_RETRY_DELAY": "1",
        "OMP_NUM_THREADS": "1",
        **(extra_env or {}),
    })
    console = work / "console.txt"
    with open(console, "wb") as out:
        proc = subprocess.Popen(["bash", str(path)], env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=work)
    return VM(name, work, record, proc, console, metadata)


def leases_of(out: str, pid: int) -> list[tuple[str, str]]:
    """(task, owner) of the leases under OUTPUT/_leases/ held by the prepare process ``pid``."""
    held = []
    for key in listing(f"{out}/_leases"):
        try:
            body = json.loads(read_text(f"{out}/_leases/{key}"))
        except (FileNotFoundError, ValueError):
            continue  # released meanwhile
        if f"-{pid}-" in body.get("owner", ""):  # owner ids are HOST-PID-RANDOM
            held.append((body["task_id"], body["owner"]))
    return held


def freeze_holding_a_lease(vm: "VM", out: str) -> tuple[int, list] | None:
    """Stop the VM's prepare process (SIGSTOP) at a moment it holds a lease on an unfinished task:
    (pid, those leases); None (and the process running on) if it holds none now. A lease whose
    task already has its marker does not count: the process was stopped between writing the
    marker and releasing the lease, and no other worker will ever need to take that task over."""
    from mlm_pipeline.run.layout import marker_url

    pid = vm.prepare_pid()
    if pid is None:
        return None
    # frozen first, then looked at: no task finishes and no lease changes hands while we look (a
    # look first missed every task of a quick run, each held for less time than one look takes)
    try:
        os.kill(pid, signal.SIGSTOP)
    except ProcessLookupError:
        return None
    if not leases_of(out, pid):
        os.kill(pid, signal.SIGCONT)
        return None
    done = set(listing(marker_url(out, "x").rsplit("/", 1)[0]))
    held = [(task, owner) for task, owner in leases_of(out, pid)
            if marker_url(out, task).rsplit("/", 1)[1] not in done]
    if held:
        return pid, held
    os.kill(pid, signal.SIGCONT)
    return None


def wait_until(predicate, timeout: float, what: str, interval: float = 0.05, vms: list[VM] = ()):
    deadline = time.time() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}\n"
                                 + "\n".join(f"=== {vm.name}\n{vm.output()}" for vm in vms))
        for vm in vms:
            if vm.proc.poll() is not None and vm.proc.returncode != 0:
                raise AssertionError(f"VM {vm.name} exited {vm.proc.returncode} while waiting for {what}:\n"
                                     f"{vm.output()}")
        time.sleep(interval)
