"""A local S3 server for tests: moto's S3 (PyPI ``moto[server]``) served on 127.0.0.1.

Started and stopped by the tests themselves (tests/conftest.py's ``s3`` fixtures); nothing
outside this machine is reached. The fake credentials and the endpoint are set in the
environment only while a fixture holds them, so s3fs (and any process the test starts, which
inherits the environment) talks to this server and to nothing else.

moto answers a conditional write (``If-None-Match: *``) by looking the key up and then storing
it, with no lock between the two, while real S3 decides it atomically; so the server here is
moto's own application (what ``python -m moto.server`` serves) behind a lock that lets one
write request in at a time (reads stay concurrent): a create-if-absent race then has exactly
one winner, as on S3.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid

ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",  # never ask a cloud metadata service for credentials
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    """One moto S3 server process; ``env`` is what a client needs to reach it."""

    def __init__(self, log_path: str):
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.endpoint = ""

    @property
    def env(self) -> dict[str, str]:
        return {**ENV, "AWS_ENDPOINT_URL": self.endpoint, "AWS_ENDPOINT_URL_S3": self.endpoint}

    def start(self, timeout: float = 30.0) -> "S3Server":
        for _ in range(5):  # another process may take the free port between the probe and the bind
            port = _free_port()
            self.endpoint = f"http://127.0.0.1:{port}"
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), str(port)],
                                             stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **ENV})
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1).close()
                    return self
                except OSError:
                    time.sleep(0.1)
            self.stop()
        with open(self.log_path, "rb") as f:
            raise RuntimeError(f"moto server did not start: {f.read()[-2000:].decode(errors='replace')}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def new_bucket(self) -> str:
        """A fresh empty bucket (one per test keeps tests apart on one server); returns its s3:// URL."""
        import boto3

        name = f"t-{uuid.uuid4().hex[:20]}"
        boto3.client("s3", endpoint_url=self.endpoint, region_name=ENV["AWS_DEFAULT_REGION"],
                     aws_access_key_id=ENV["AWS_ACCESS_KEY_ID"], aws_secret_access_key=ENV["AWS_SECRET_ACCESS_KEY"],
                     aws_session_token=ENV["AWS_SESSION_TOKEN"]).create_bucket(Bucket=name)
        return f"s3://{name}"


def serve(port: int) -> None:
    """moto's server application (as ``python -m moto.server`` builds it), writes serialised."""
    import threading

    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import run_simple

    app, writes = DomainDispatcherApplication(create_backend_app), threading.Lock()

    def serialised(environ, start_response):
        if environ["REQUEST_METHOD"] in ("GET", "HEAD"):
            return app(environ, start_response)
        with writes:  # the check and the store of a conditional write happen under one lock
            return list(app(environ, start_response))

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    run_simple("127.0.0.1", port, serialised, threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    serve(int(sys.argv[1]))
