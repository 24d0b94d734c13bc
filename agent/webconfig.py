"""The web configuration file: TLS and basic auth for the HTTP endpoint.

Same format as the Prometheus exporters' web config (exporter-toolkit), so a site reuses
the file it already has::

    tls_server_config:
      cert_file: server.crt          # relative paths are relative to this file
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # optional
      client_ca_file: ca.crt                        # optional
      min_version: TLS12                             # optional
    basic_auth_users:
      alice: $2y$10$...              # bcrypt hash (htpasswd -nBC 10 "" | tr -d ':\\n')
    http_server_config:
      headers:
        X-Frame-Options: deny
"""

from __future__ import annotations

import collections
import enum
import hashlib
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lockstep.agent.yamlfile import LineDict, YamlFileError, load_yaml_file

if TYPE_CHECKING:
    import ssl

# (By the ssl module's names: the module is loaded only where a web config sets up TLS, issue 47.)
_TLS_VERSIONS = {"TLS10": "TLSv1", "TLS11": "TLSv1_1", "TLS12": "TLSv1_2", "TLS13": "TLSv1_3"}
# exporter-toolkit's client_auth_type values that Python's ssl module can honour.
_CLIENT_AUTH = {
    "NoClientCert": "CERT_NONE",
    "VerifyClientCertIfGiven": "CERT_OPTIONAL",
    "RequireAndVerifyClientCert": "CERT_REQUIRED",
}
# Go-specific knobs that sites' files may carry; accepted and ignored (Python's defaults apply).
_IGNORED_TLS_KEYS = ("cipher_suites", "curve_preferences", "prefer_server_cipher_suites")
_TLS_KEYS = ("cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version", "max_version")


class WebConfigError(Exception):
    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class AuthResult(enum.Enum):
    OK = "ok"
    DENIED = "denied"
    BUSY = "busy"  # too many password checks already waiting: answer 429, spend nothing


# bcrypt's modular crypt format: $2a$, $2b$ or $2y$, a two-digit cost, 22 characters of salt
# and 31 of hash in bcrypt's base64.  Costs outside 4..31 are refused by every bcrypt.
_BCRYPT_HASH = re.compile(r"\$2[aby]\$([0-9]{2})\$[./A-Za-z0-9]{53}")
# Password checks in progress or waiting for the running one, in all and per client address;
# more get AuthResult.BUSY at once.  A flood of guesses thus holds at most 4 of the 8 HTTP
# worker threads, and one client flooding leaves the other 3 places to other clients (the
# Prometheus server whose new password must be checked once).
MAX_PENDING_CHECKS = 4
MAX_PENDING_CHECKS_PER_CLIENT = 1
# Failed credentials remembered (a bounded cache: guesses that vary are each paid for once).
MAX_REMEMBERED_FAILURES = 1024


def bcrypt_cost(hashed: str) -> int | None:
    """The cost of a well-formed bcrypt hash, None for anything else."""
    match = _BCRYPT_HASH.fullmatch(hashed)
    if match is None or not 4 <= int(match.group(1)) <= 31:
        return None
    return int(match.group(1))


@dataclass
class WebConfig:
    ssl_context: ssl.SSLContext | None = None
    users: Mapping[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    headers: Mapping[str, str] = field(default_factory=dict)
    ignored: list[str] = field(default_factory=list)  # settings accepted but not applied

    def __post_init__(self) -> None:
        self._lock = threading.Lock()  # guards the caches and the pending counts
        self._bcrypt = threading.Lock()  # one bcrypt computation at a time
        self._verified: set[bytes] = set()
        self._failed: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        self._pending: collections.Counter[str] = collections.Counter()  # client -> checks pending
        # An unknown user is checked against a hash of the highest configured cost, so that
        # it takes as long as a known user's check (with one cost for all users, exactly).
        self._unknown_user_hash = b""
        if self.users:  # bcrypt is imported only where basic auth is configured (issue 47)
            import bcrypt

            cost = max(bcrypt_cost(h.decode()) or 10 for h in self.users.values())
            # A valid salt and an all-zero hash: no password matches it, and no time is spent
            # making it (bcrypt.hashpw at this cost would take as long as a check).
            self._unknown_user_hash = bcrypt.gensalt(rounds=cost) + b"." * 31

    def check_basic_auth(self, user: str, password: str, client: str = "") -> AuthResult:
        """Whether the user exists and the password matches its bcrypt hash.

        bcrypt is slow by design (~100 ms at cost 10).  Like exporter-toolkit, checks run one at
        a time and their results are remembered, as a keyed hash, never the password: scrapes
        stay fast, and a flood of guesses costs at most one core.  Beyond MAX_PENDING_CHECKS
        checks pending, or MAX_PENDING_CHECKS_PER_CLIENT for ``client`` (its address), the
        answer is BUSY, without a check.
        """
        import bcrypt

        key = hashlib.sha256(f"{user}\0{password}".encode()).digest()
        with self._lock:
            cached = self._cached(key)
            if cached is not None:
                return cached
            if self._pending.total() >= MAX_PENDING_CHECKS or self._pending[client] >= MAX_PENDING_CHECKS_PER_CLIENT:
                return AuthResult.BUSY
            self._pending[client] += 1
        try:
            with self._bcrypt:
                with self._lock:  # checked by another thread while this one waited
                    cached = self._cached(key)
                if cached is not None:
                    return cached
                hashed = self.users.get(user)
                try:
                    ok = bcrypt.checkpw(password.encode(), hashed or self._unknown_user_hash) and hashed is not None
                except ValueError:  # bcrypt's own refusal; load_web_config checks the format first
                    ok = False
            with self._lock:
                if ok:
                    self._verified.add(key)
                else:
                    self._failed[key] = None
                    if len(self._failed) > MAX_REMEMBERED_FAILURES:
                        self._failed.popitem(last=False)
            return AuthResult.OK if ok else AuthResult.DENIED
        finally:
            with self._lock:
                self._pending[client] -= 1
                if not self._pending[client]:
                    del self._pending[client]

    def _cached(self, key: bytes) -> AuthResult | None:
        if key in self._verified:
            return AuthResult.OK
        if key in self._failed:
            return AuthResult.DENIED
        return None


def load_web_config(path: Path) -> WebConfig:
    """Parse and check the web config file; WebConfigError lists every problem."""
    try:
        data = load_yaml_file(path)
    except YamlFileError as exc:
        raise WebConfigError(exc.problems) from None
    if data is None:
        return WebConfig()
    if not isinstance(data, LineDict):
        raise WebConfigError([f"{path}:1: the web config must be a mapping"])
    problems: list[str] = []
    ignored: list[str] = []

    def where(mapping: LineDict, key: str, name: str) -> str:
        return f"{path}:{mapping.line_of(key)}: {name}"

    def section(key: str) -> LineDict | None:
        value = data.get(key)
        if value is None:
            return None
        if not isinstance(value, LineDict):
            problems.append(f"{where(data, key, key)}: expected a mapping")
            return None
        return value

    for key in data:
        if key not in ("tls_server_config", "basic_auth_users", "http_server_config"):
            problems.append(f"{where(data, key, key)}: unknown key")

    context = None
    tls = section("tls_server_config")
    if tls is not None:
        context = _tls_context(path, tls, problems, ignored, where)

    users: dict[str, bytes] = {}
    auth = section("basic_auth_users")
    for user, hashed in (auth or {}).items():
        if not isinstance(hashed, str) or bcrypt_cost(hashed) is None:
            problems.append(
                f"{where(auth, user, f'basic_auth_users.{user}')}: "  # type: ignore[arg-type]
                "expected a bcrypt hash: $2y$, a cost from 04 to 31, $, then 53 characters of [./A-Za-z0-9]"
            )
            continue
        users[str(user)] = hashed.encode()

    headers: dict[str, str] = {}
    http = section("http_server_config")
    for key, value in (http or {}).items():
        if key == "headers" and isinstance(value, dict):
            headers = {str(k): str(v) for k, v in value.items()}
        elif key == "http2":
            ignored.append("http_server_config.http2")
        else:
            problems.append(f"{where(http, key, f'http_server_config.{key}')}: unknown or malformed key")  # type: ignore[arg-type]

    if problems:
        raise WebConfigError(problems)
    return WebConfig(ssl_context=context, users=users, headers=headers, ignored=ignored)


def _tls_context(
    path: Path, tls: LineDict, problems: list[str], ignored: list[str], where: Any
) -> ssl.SSLContext | None:
    for key in tls:
        if key in _IGNORED_TLS_KEYS:
            ignored.append(f"tls_server_config.{key}")
        elif key not in _TLS_KEYS:
            problems.append(f"{where(tls, key, f'tls_server_config.{key}')}: unknown key")

    def file_setting(key: str) -> Path | None:
        value = tls.get(key)
        if value is None:
            return None
        file = Path(str(value))
        return file if file.is_absolute() else path.parent / file

    import ssl  # only here: a web config without TLS never loads it (issue 47)

    cert, key = file_setting("cert_file"), file_setting("key_file")
    if cert is None or key is None:
        problems.append(f"{where(tls, 'cert_file', 'tls_server_config')}: both cert_file and key_file are required")
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        problems.append(f"{where(tls, 'cert_file', 'tls_server_config.cert_file')}: cannot load {cert} / {key}: {exc}")
    for key_name, attr in (("min_version", "minimum_version"), ("max_version", "maximum_version")):
        value = tls.get(key_name)
        if value is None:
            continue
        if value not in _TLS_VERSIONS:
            problems.append(
                f"{where(tls, key_name, f'tls_server_config.{key_name}')}: expected one of {', '.join(_TLS_VERSIONS)}"
            )
        else:
            setattr(context, attr, getattr(ssl.TLSVersion, _TLS_VERSIONS[value]))
    if "min_version" not in tls:
        context.minimum_version = ssl.TLSVersion.TLSv1_2
    auth_type = tls.get("client_auth_type", "NoClientCert")
    if auth_type not in _CLIENT_AUTH:
        problems.append(
            f"{where(tls, 'client_auth_type', 'tls_server_config.client_auth_type')}: "
            f"expected one of {', '.join(_CLIENT_AUTH)} (RequestClientCert and RequireAnyClientCert "
            "accept unverified certificates, which Lockstep does not support)"
        )
        return context
    context.verify_mode = getattr(ssl, _CLIENT_AUTH[auth_type])
    ca = file_setting("client_ca_file")
    if context.verify_mode != ssl.CERT_NONE:
        if ca is None:
            problems.append(
                f"{where(tls, 'client_auth_type', 'tls_server_config.client_ca_file')}: "
                f"client_auth_type {auth_type} needs client_ca_file"
            )
        else:
            try:
                context.load_verify_locations(cafile=ca)
            except (OSError, ssl.SSLError) as exc:
                problems.append(
                    f"{where(tls, 'client_ca_file', 'tls_server_config.client_ca_file')}: cannot load {ca}: {exc}"
                )
    return context
