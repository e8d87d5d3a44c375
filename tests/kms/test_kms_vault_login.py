"""How real deployments reach Vault/OpenBao: JWT/OIDC and certificate logins, TLS settings, your own client.

Against real OpenBao dev servers (tests/fixtures_openbao.py): plain HTTP for the JWT
login, ``-dev-tls`` for everything TLS. JWTs are minted here with PyJWT and verified by
OpenBao against the public key configured in ``jwt_validation_pubkeys``; certificates are
made here with ``cryptography`` (tests/pki.py).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import hvac
import jwt
import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from fixtures_openbao import OpenBao, clean_vault_env, service_key, unique
from pki import issue_client_cert, make_ca

from statecodec.cli import main
from statecodec.cli._exit import ExitCode
from statecodec.kms import KeySourceError, source_from_url

ISSUER = "https://ci.example"
AUDIENCE = "statecodec"


def one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text and "error occurred" not in text, text
    return text


def load_refused(name: str, match: str) -> KeySourceError:
    """What loading transit key ``name`` with the environment's settings raises (``match``: its text)."""
    with pytest.raises(KeySourceError, match=match) as info:
        source_from_url(f"vault-transit:transit/{name}").load()
    return info.value


# --------------------------------------------------------------------------- JWT / OIDC
class CI:
    """An OIDC issuer as a CI system runs one: a signing key, and short-lived JWTs for jobs."""

    def __init__(self) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())

    @property
    def public_pem(self) -> str:
        return (
            self.key.public_key()
            .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
            .decode()
        )

    def token(self, *, subject: str = "repo:example/mcp:ref:refs/heads/main", ttl: int = 300) -> str:
        now = int(time.time())
        claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": subject, "iat": now, "exp": now + ttl}
        return jwt.encode(claims, self.key, algorithm="ES256")


def configure_jwt(server: OpenBao, ci: CI, policy: str, mount: str) -> None:
    root = server.client()
    root.sys.enable_auth_method("jwt", path=mount)
    root.auth.jwt.configure(jwt_validation_pubkeys=[ci.public_pem], bound_issuer=ISSUER, path=mount)
    root.auth.jwt.create_role(
        "rotate-job",
        user_claim="sub",
        allowed_redirect_uris=[],
        role_type="jwt",
        bound_audiences=[AUDIENCE],
        bound_subject="repo:example/mcp:ref:refs/heads/main",
        token_policies=[policy],
        token_ttl="10m",
        path=mount,
    )


def test_jwt_login_rereads_the_token_file_at_every_login(
    openbao: OpenBao, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """VAULT_JWT_PATH is read at each login: CI tokens expire in minutes, the file is refreshed."""
    ci = CI()
    name, policy = service_key(openbao)
    configure_jwt(openbao, ci, policy, "jwt")  # the default mount: no VAULT_JWT_MOUNT below
    token_file = tmp_path / "ci-token"
    token_file.write_text(ci.token() + "\n")
    clean_vault_env(monkeypatch, tmp_path)
    monkeypatch.setenv("VAULT_ADDR", openbao.addr)
    monkeypatch.setenv("VAULT_JWT_ROLE", "rotate-job")
    monkeypatch.setenv("VAULT_JWT_PATH", str(token_file))

    src: Any = source_from_url(f"vault-transit:transit/{name}")
    assert src.settings.auth_method == "jwt"
    assert len(src.load()) == 1 and src.session.logins == 1

    # The job's token was revoked (or expired) and the CI system wrote a JWT for another
    # subject: the re-login must read the file again, and Vault must refuse that subject.
    token_file.write_text(ci.token(subject="repo:attacker/fork:ref:refs/heads/main"))
    openbao.client().auth.token.revoke(src.session._client.token)
    with pytest.raises(KeySourceError, match=r"jwt login failed: .*within role rotate-job's bounds") as info:
        src.load()
    assert info.value.kind == "denied"
    one_line(info.value)

    token_file.write_text(ci.token())
    assert len(src.load()) == 1 and src.session.logins == 2

    token_file.unlink()
    assert load_refused(name, "cannot read the JWT in VAULT_JWT_PATH").kind == "config"


def test_jwt_login_from_a_variable_on_another_mount_and_its_errors(
    openbao: OpenBao, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ci = CI()
    name, policy = service_key(openbao)
    mount = unique("gitlab")
    configure_jwt(openbao, ci, policy, mount)
    clean_vault_env(monkeypatch, tmp_path)
    monkeypatch.setenv("BAO_ADDR", openbao.addr)  # OpenBao's spellings work as well
    monkeypatch.setenv("BAO_JWT_ROLE", "rotate-job")
    monkeypatch.setenv("BAO_JWT_MOUNT", mount)
    monkeypatch.setenv("BAO_JWT", ci.token())
    src: Any = source_from_url(f"vault-transit:transit/{name}")
    assert "BAO_JWT" not in repr(src.settings) and ci.token()[:20] not in repr(src.settings)
    assert len(src.load()) == 1

    # A 403 (the Vault token was revoked) is cured by logging in again with the same JWT.
    openbao.client().auth.token.revoke(src.session._client.token)
    assert len(src.load()) == 1 and src.session.logins == 2

    monkeypatch.setenv("BAO_JWT", ci.token(ttl=-60))  # expired
    error = load_refused(name, r"jwt login failed: .*expired.*from VAULT_JWT current")
    assert error.kind == "denied"
    one_line(error)

    monkeypatch.setenv("BAO_JWT_MOUNT", "nowhere")
    load_refused(name, r"jwt auth method enabled at auth/nowhere/ \(VAULT_JWT_MOUNT\)")

    monkeypatch.delenv("BAO_JWT")
    load_refused(name, "VAULT_JWT_ROLE is set but neither VAULT_JWT_PATH nor")


# ----------------------------------------------------------------------------- TLS
def tls_env(server: OpenBao, monkeypatch: pytest.MonkeyPatch, home: Path, **variables: str) -> None:
    clean_vault_env(monkeypatch, home)
    monkeypatch.setenv("VAULT_ADDR", server.addr)
    monkeypatch.setenv("VAULT_TOKEN", server.token)
    for var, value in variables.items():
        monkeypatch.setenv(var, value)


def test_cacert_capath_and_their_bao_spellings(
    openbao_tls: OpenBao, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    name, _ = service_key(openbao_tls)
    url = f"vault-transit:transit/{name}"
    assert openbao_tls.cacert is not None
    tls_env(openbao_tls, monkeypatch, tmp_path, VAULT_CACERT=str(openbao_tls.cacert))
    assert len(source_from_url(url).load()) == 1

    # A directory of PEM files, as Vault's CLI reads it: no OpenSSL hash links needed.
    capath = tmp_path / "cas"
    capath.mkdir()
    (capath / "00-unrelated.pem").write_text(make_ca("unrelated").cert_pem)
    (capath / "vault-ca.pem").write_text(openbao_tls.cacert.read_text())
    tls_env(openbao_tls, monkeypatch, tmp_path, BAO_CAPATH=str(capath))
    assert len(source_from_url(url).load()) == 1


def test_tls_verification_failures_are_configuration_errors(
    openbao_tls: OpenBao, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Exit 3 (fix the settings), not 7 (retry later): retrying cannot make a certificate verify."""
    name, _ = service_key(openbao_tls)
    url = f"vault-transit:transit/{name}"
    runner = CliRunner()

    def cli_error(**variables: str) -> str:
        tls_env(openbao_tls, monkeypatch, tmp_path, **variables)
        result = runner.invoke(main, ["keys", "list", "--keys", url], env={"STATECODEC_KEYS": None})
        assert result.exit_code == ExitCode.KEYS, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, lines
        return lines[0]

    # No CA configured: the default bundle does not know the dev server's CA.
    assert "set VAULT_CACERT (or VAULT_CAPATH)" in cli_error()
    other_ca = tmp_path / "other-ca.pem"
    other_ca.write_text(make_ca("someone else").cert_pem)
    assert "unable to get local issuer certificate" in cli_error(VAULT_CACERT=str(other_ca))
    assert f"VAULT_CACERT={tmp_path / 'missing.pem'} is not a readable PEM CA bundle" in cli_error(
        VAULT_CACERT=str(tmp_path / "missing.pem")
    )
    (tmp_path / "garbage.pem").write_text("not a certificate")
    assert "is not a readable PEM CA bundle" in cli_error(VAULT_CACERT=str(tmp_path / "garbage.pem"))
    assert "is not a readable directory" in cli_error(VAULT_CAPATH=str(tmp_path / "garbage.pem"))
    (tmp_path / "empty").mkdir()
    assert "holds no CA certificate files" in cli_error(VAULT_CAPATH=str(tmp_path / "empty"))
    assert "cannot use the client certificate" in cli_error(
        VAULT_CACERT=str(openbao_tls.cacert), VAULT_CLIENT_CERT=str(tmp_path / "missing.pem")
    )

    # The same through the library: kind "config", and no retry (one attempt only).
    tls_env(openbao_tls, monkeypatch, tmp_path)
    src: Any = source_from_url(url, retries=5, backoff=30)  # a retry would take 30 s or more
    started = time.monotonic()
    with pytest.raises(KeySourceError) as info:
        src.load()
    assert info.value.kind == "config" and time.monotonic() - started < 25  # no 30 s backoff: no retry
    one_line(info.value)


def test_tls_server_name_is_the_name_checked(
    openbao_tls: OpenBao, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The certificate names localhost and 127.0.0.1; VAULT_TLS_SERVER_NAME replaces the URL's host."""
    name, _ = service_key(openbao_tls)
    url = f"vault-transit:transit/{name}"
    cacert = str(openbao_tls.cacert)
    tls_env(openbao_tls, monkeypatch, tmp_path, VAULT_CACERT=cacert, VAULT_TLS_SERVER_NAME="localhost")
    assert len(source_from_url(url).load()) == 1
    # A name the certificate lacks fails although the address (127.0.0.1) is in it:
    # so the setting, not the URL, is what gets checked.
    tls_env(openbao_tls, monkeypatch, tmp_path, VAULT_CACERT=cacert, BAO_TLS_SERVER_NAME="vault.example")
    with pytest.raises(KeySourceError, match="set VAULT_TLS_SERVER_NAME to a name it holds") as info:
        source_from_url(url).load()
    assert info.value.kind == "config" and "vault.example" in str(info.value)


# ----------------------------------------------------------------------- cert login
def test_certificate_login_and_relogin(
    openbao_tls: OpenBao, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    name, policy = service_key(openbao_tls)
    ca = make_ca("statecodec VM fleet")
    cert, key = issue_client_cert(ca, "vm-17.example").write(tmp_path, "vm-17")
    stranger = issue_client_cert(make_ca("elsewhere"), "intruder")
    stranger_cert, stranger_key = stranger.write(tmp_path, "intruder")
    mount = unique("cert")
    root = openbao_tls.client()
    root.sys.enable_auth_method("cert", path=mount)
    root.auth.cert.create_ca_certificate_role(
        "vm", certificate=ca.cert_pem, token_policies=[policy], token_ttl=600, mount_point=mount
    )
    clean_vault_env(monkeypatch, tmp_path)
    for var, value in {
        "VAULT_ADDR": openbao_tls.addr,
        "VAULT_CACERT": str(openbao_tls.cacert),
        "VAULT_CLIENT_CERT": str(cert),
        "VAULT_CLIENT_KEY": str(key),
        "VAULT_CERT_ROLE": "vm",
        "VAULT_CERT_MOUNT": mount,
    }.items():
        monkeypatch.setenv(var, value)

    src: Any = source_from_url(f"vault-transit:transit/{name}")
    assert src.settings.auth_method == "cert"
    assert len(src.load()) == 1 and src.session.logins == 1
    root.auth.token.revoke(src.session._client.token)
    assert len(src.load()) == 1 and src.session.logins == 2  # 403, a new login, success

    monkeypatch.setenv("VAULT_CLIENT_CERT", str(stranger_cert))
    monkeypatch.setenv("VAULT_CLIENT_KEY", str(stranger_key))
    error = load_refused(name, r"cert login failed: .*does role vm trust the CA")
    assert error.kind == "denied"
    one_line(error)

    monkeypatch.delenv("VAULT_CLIENT_CERT")
    monkeypatch.delenv("VAULT_CLIENT_KEY")
    assert load_refused(name, "VAULT_CERT_ROLE is set but VAULT_CLIENT_CERT is not").kind == "config"


# ------------------------------------------------------------------ your own client
def test_bring_your_own_authenticated_client(
    openbao_tls: OpenBao, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The service's own hvac.Client: used as it is, never logged in, renewed or closed by statecodec."""
    name, policy = service_key(openbao_tls)
    clean_vault_env(monkeypatch, tmp_path)  # nothing from the environment: the client is everything
    token = openbao_tls.client().auth.token.create(policies=[policy], ttl="1h")["auth"]["client_token"]
    mine = hvac.Client(url=openbao_tls.addr, token=token, verify=str(openbao_tls.cacert), timeout=5)

    src: Any = source_from_url(f"vault-transit:transit/{name}", client=mine)
    assert src.settings.auth_method == "client" and openbao_tls.addr in src.describe()
    assert len(src.load()) == 1
    src.close()
    assert mine.is_authenticated()  # still open, same token
    assert mine.token == token and len(src.load()) == 1

    logins = src.session.logins
    openbao_tls.client().auth.token.revoke(token)
    with pytest.raises(KeySourceError, match="permission denied reading") as info:
        src.load()
    assert info.value.kind == "denied" and src.session.logins == logins  # no login attempt of its own
    one_line(info.value)


def test_vault_denials_are_one_line(
    openbao: OpenBao, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Vault answers "1 error occurred:\\n\\t* permission denied\\n\\n"; the operator gets one line."""
    name, _ = service_key(openbao)
    clean_vault_env(monkeypatch, tmp_path)
    monkeypatch.setenv("VAULT_ADDR", openbao.addr)
    token = openbao.client().auth.token.create(policies=["default"])["auth"]["client_token"]
    monkeypatch.setenv("VAULT_TOKEN", token)
    with pytest.raises(KeySourceError) as info:
        source_from_url(f"vault-transit:transit/{name}").load()
    text = one_line(info.value)
    assert f"permission denied reading transit/keys/{name} (permission denied)" in text
    result = CliRunner().invoke(main, ["keys", "list", "--keys", f"vault-transit:transit/{name}"])
    assert result.exit_code == ExitCode.KEYS and len(result.stderr.strip().splitlines()) == 1
