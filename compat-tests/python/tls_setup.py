"""TLS test setup shared by the compat tests: certificates made with the
openssl CLI (a CA, a server certificate for 127.0.0.1/localhost, a client
certificate) and a tessera with PLAINTEXT, SSL and SASL_SSL listeners."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from conftest import free_port, tessera_bin

OPENSSL = shutil.which("openssl")
needs_openssl = pytest.mark.skipif(OPENSSL is None, reason="openssl CLI not installed")


def openssl(*args, cwd):
    p = subprocess.run([OPENSSL, *args], cwd=cwd, capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr.decode(errors="replace")


def make_certs(d):
    """A CA, a server certificate for 127.0.0.1/localhost and a client
    certificate (CN=client,O=Tessera), EC keys, unencrypted PKCS#8."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=Tessera Test CA", cwd=d)
    for name, subj, ext in [
        ("server", "/CN=localhost", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
        ("client", "/O=Tessera/CN=client", "extendedKeyUsage=clientAuth"),
    ]:
        openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subj, cwd=d)
        with open(os.path.join(d, f"{name}.ext"), "w") as f:
            f.write(ext + "\n")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext",
                cwd=d)
    # The keystore: key and chain in one PEM file (ssl.keystore.location).
    with open(os.path.join(d, "keystore.pem"), "w") as out:
        for part in ("server.key", "server.pem"):
            out.write(open(os.path.join(d, part)).read())


def start_tls_broker(broker_factory, tmp_path):
    """A tessera with PLAINTEXT, SSL and SASL_SSL (SCRAM) listeners,
    ssl.client.auth=requested, and the SCRAM user bob/bob-secret."""
    if os.environ.get("COMPAT_BROKER", "tessera") != "tessera":
        pytest.skip("tessera's TLS setup")
    make_certs(tmp_path)
    b = broker_factory(start=False, env={"RUST_LOG": "info,tessera_gateway::server=debug"})
    b.ssl_port, b.sasl_ssl_port = free_port(), free_port()
    b.certs = tmp_path
    b.overrides.update(
        {
            "listeners": f"PLAINTEXT://{b.host}:{b.port},SSL://{b.host}:{b.ssl_port},"
            f"SASL_SSL://{b.host}:{b.sasl_ssl_port}",
            "sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512",
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(tmp_path / "keystore.pem"),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(tmp_path / "ca.pem"),
            "ssl.client.auth": "requested",
        }
    )
    out = subprocess.run(
        [str(tessera_bin()), "--data-dir", str(b.data_dir), "users", "add", "bob",
         "--password", "bob-secret"],
        capture_output=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr.decode(errors="replace")[-2000:]
    b.start()
    return b


def sasl_ssl_conf(b, mechanism="SCRAM-SHA-512") -> dict:
    return {
        "bootstrap.servers": f"{b.host}:{b.sasl_ssl_port}",
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": str(b.certs / "ca.pem"),
        "sasl.mechanisms": mechanism,
        "sasl.username": "bob",
        "sasl.password": "bob-secret",
    }


def ssl_conf(b, client_cert: bool) -> dict:
    conf = {
        "bootstrap.servers": f"{b.host}:{b.ssl_port}",
        "security.protocol": "SSL",
        "ssl.ca.location": str(b.certs / "ca.pem"),
    }
    if client_cert:
        conf["ssl.certificate.location"] = str(b.certs / "client.pem")
        conf["ssl.key.location"] = str(b.certs / "client.key")
    return conf
