"""The job's Ray session: what its workers are told about storage."""

import json

from wxray.data import location
from wxray.platform.cluster import session


def test_workers_learn_where_and_how_to_read_never_who(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.setenv(location.ANONYMOUS_ENV, "")
    monkeypatch.delenv(session.JOB_CONFIG_ENV, raising=False)
    location.read_anonymously()
    env = session.worker_env()
    assert env["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9000" and env[location.ANONYMOUS_ENV] == "1"
    assert not any("SECRET" in k or "KEY_ID" in k for k in env), env


def test_under_job_submission_the_submitted_runtime_env_keeps_its_own_keys(monkeypatch):
    """Ray refuses a ray.init runtime env that sets an env var the submitted job's runtime env sets too."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
    monkeypatch.setenv(location.ANONYMOUS_ENV, "1")
    monkeypatch.setenv(session.JOB_CONFIG_ENV, json.dumps(
        {"runtime_env": {"env_vars": {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000"}}}))
    env = session.worker_env()
    assert "AWS_ENDPOINT_URL" not in env and env[location.ANONYMOUS_ENV] == "1"
    monkeypatch.setenv(session.JOB_CONFIG_ENV, "not json")
    assert "AWS_ENDPOINT_URL" in session.worker_env()
