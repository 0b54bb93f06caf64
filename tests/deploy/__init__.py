"""Tests of deploy/gcp-mig and deploy/aws-asg (a package, so that its conftest is not the suite's
``conftest`` module that other tests import from)."""
