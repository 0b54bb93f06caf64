"""Fixtures with real servers (see tests/conftest_servers.py) and a shared local baseline."""

from conftest_servers import moto_s3, ray_cluster, seaweedfs  # noqa: F401 - fixtures
