"""CURVE key management for the agent <-> collector link.

Head node (``keys_dir``, default /etc/slurmgpu/keys)::

    collector.key          collector public key
    collector.key_secret   collector secret key (0600)
    nodes/<node>.key       the allow-list: one public key per node; the file name binds
                           the key to the node name
    revoked/               revoked node keys, moved here as <node>.<UTC stamp>.key
    bundles/<node>/        default place for the bundle made by add_node

Node bundle (what config management copies into a node's keys_dir)::

    node.key               the node's public key
    node.key_secret        the node's secret key (0600)
    collector.key          the collector's public key

Keys are made and read with ``zmq.auth.create_certificates`` / ``load_certificate``.
Every secret file is 0600 (set before it is moved into place; the umask does not
matter) and every secret is loaded through ``check_private``, which refuses loose modes.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import zmq.auth
from zmq.utils import z85

from slurmgpu.errors import SlurmGpuError

DEFAULT_KEYS_DIR = "/etc/slurmgpu/keys"
COLLECTOR = "collector"
NODE = "node"
NODES_DIR = "nodes"
REVOKED_DIR = "revoked"
BUNDLES_DIR = "bundles"
PUBLIC_SUFFIX = ".key"
SECRET_SUFFIX = ".key_secret"
MAX_NODE_NAME = 128
FINGERPRINT_CHARS = 8

# Slurm node name characters; the first must be alphanumeric so that a name can never
# be ".", "..", a hidden file or look like an option.
_NODE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class KeyFileError(SlurmGpuError):
    """A key file or key directory is missing, malformed or has loose permissions."""


# --------------------------------------------------------------------------- helpers


def validate_node_name(node: str) -> str:
    """Return ``node`` if it is a valid Slurm node name, else raise KeyFileError."""
    if not isinstance(node, str) or not 0 < len(node) <= MAX_NODE_NAME \
            or not _NODE_RE.fullmatch(node):
        raise KeyFileError(
            f"bad node name {node!r}: use 1-{MAX_NODE_NAME} of [A-Za-z0-9._-], "
            "starting with a letter or digit")
    return node


def fingerprint(public_key: bytes) -> str:
    """The short form of a z85 public key shown to people (its first 8 characters)."""
    return public_key[:FINGERPRINT_CHARS].decode("ascii", "replace")


class InsecureKeyError(KeyFileError):
    """A key file or the allow-list is open to others: the daemon refuses to start."""


def check_private(path: str | Path) -> None:
    """Raise KeyFileError unless ``path`` is a regular file that only its owner can access,
    and that owner is this process's user (InsecureKeyError for the mode and owner).

    Symlinks are followed (the target is what gets read)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise KeyFileError(f"{path}: no such file") from None
    except OSError as exc:
        raise KeyFileError(f"{path}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise KeyFileError(f"{path} is not a regular file")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        how = "readable" if mode & 0o044 else "writable"
        raise InsecureKeyError(f"{path} is {how} by group/others (mode {mode:04o}); chmod 600 it")
    if st.st_uid != os.geteuid():
        raise InsecureKeyError(f"{path} is owned by uid {st.st_uid}, not by this daemon's uid "
                               f"{os.geteuid()}; chown it")


@contextmanager
def _os_errors(what: str | Path | None = None) -> Iterator[None]:
    """Turn OSError into a one-line KeyFileError naming the file."""
    try:
        yield
    except OSError as exc:
        name = exc.filename if exc.filename is not None else what
        raise KeyFileError(f"{name}: {exc.strerror or exc}") from None


def _make_dir(path: Path, mode: int) -> None:
    """Create ``path`` (and parents) with ``mode``; an existing directory is left alone."""
    if path.is_dir():
        return
    with _os_errors(path):
        path.mkdir(mode=mode, parents=True, exist_ok=True)
        os.chmod(path, mode)  # mkdir's mode is filtered by the umask


def _load(path: Path, *, secret: bool) -> tuple[bytes, bytes | None]:
    """Load a certificate file; a secret one is permission-checked first."""
    if secret:
        check_private(path)
    elif not path.is_file():
        raise KeyFileError(f"{path}: no such file")
    try:
        public, secret_key = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise KeyFileError(f"{path}: not a CURVE certificate ({exc})") from None
    _check_z85(path, public, "public")
    if secret:
        if secret_key is None:
            raise KeyFileError(f"{path}: no secret-key in the file")
        _check_z85(path, secret_key, "secret")
    return public, secret_key


def _check_z85(path: Path, key: bytes, what: str) -> None:
    try:
        ok = len(key) == 40 and len(z85.decode(key)) == 32
    except (ValueError, KeyError, IndexError, TypeError):
        ok = False
    if not ok:
        raise KeyFileError(f"{path}: {what}-key is not a 40-character z85 CURVE key")


def _new_keypair(directory: Path, name: str) -> tuple[Path, Path]:
    """Make ``<name>.key`` / ``<name>.key_secret`` in ``directory``.

    The pair is created in a private (0700) temporary directory beside the target,
    the secret is chmod 600 there, then both are renamed into place, so a secret is
    never visible with the umask's mode."""
    with _os_errors(directory):
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-keys-", dir=directory))
        try:
            public, secret = zmq.auth.create_certificates(tmp, name)
            os.chmod(secret, 0o600)
            os.chmod(public, 0o644)
            public_dst = directory / f"{name}{PUBLIC_SUFFIX}"
            secret_dst = directory / f"{name}{SECRET_SUFFIX}"
            os.replace(secret, secret_dst)
            os.replace(public, public_dst)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return public_dst, secret_dst


def _install_public(src: Path, dst: Path) -> None:
    """Copy a public key file to ``dst`` atomically (no partial ``*.key`` ever visible:
    the authenticator loads every ``*.key`` in nodes/)."""
    with _os_errors(dst):
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".part", dir=dst.parent)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(src.read_bytes())
            os.chmod(tmp, 0o644)
            os.replace(tmp, dst)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def _stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def _move_to_revoked(root: Path, node: str) -> Path:
    src = root / NODES_DIR / f"{node}{PUBLIC_SUFFIX}"
    revoked = root / REVOKED_DIR
    _make_dir(revoked, 0o700)
    stamp = _stamp()
    dst = revoked / f"{node}.{stamp}{PUBLIC_SUFFIX}"
    n = 1
    while dst.exists():
        dst = revoked / f"{node}.{stamp}-{n}{PUBLIC_SUFFIX}"
        n += 1
    with _os_errors(src):
        os.replace(src, dst)
    return dst


# --------------------------------------------------------------------------- API


def public_key(path: str | Path) -> bytes:
    """The z85 public key in a key file (validated)."""
    public, _ = _load(Path(path), secret=False)
    return public


def init(keys_dir: str | Path, *, force: bool = False) -> Path:
    """Create the collector keypair in ``keys_dir`` (and nodes/, revoked/).

    Refuses to replace an existing keypair unless ``force``. Returns the public key path.
    Replacing the collector key invalidates the collector.key in every node bundle."""
    root = Path(keys_dir)
    public = root / f"{COLLECTOR}{PUBLIC_SUFFIX}"
    secret = root / f"{COLLECTOR}{SECRET_SUFFIX}"
    if not force:
        for path in (public, secret):
            if path.exists() or path.is_symlink():
                raise KeyFileError(f"{path} already exists; refusing to overwrite it "
                                   "(use --force to make a new collector key)")
    _make_dir(root, 0o700)
    _make_dir(root / NODES_DIR, 0o700)
    _make_dir(root / REVOKED_DIR, 0o700)
    public_path, _ = _new_keypair(root, COLLECTOR)
    return public_path


def add_node(keys_dir: str | Path, node: str, *, out_dir: str | Path | None = None,
             force: bool = False) -> Path:
    """Make a keypair for ``node``, allow-list its public key as nodes/<node>.key and
    write the node bundle (node.key, node.key_secret, collector.key) to ``out_dir``
    (default ``<keys_dir>/bundles/<node>/``). Returns the bundle directory.

    A node that is already allow-listed is refused unless ``force`` (key rotation):
    then its old key is moved to revoked/ and the new one takes its place."""
    validate_node_name(node)
    root = Path(keys_dir)
    collector_public = root / f"{COLLECTOR}{PUBLIC_SUFFIX}"
    if not collector_public.is_file():
        raise KeyFileError(f"{collector_public}: no such file (run 'slurmgpu keys init' first)")
    _load(collector_public, secret=False)  # a valid key, not garbage
    nodes = root / NODES_DIR
    _make_dir(nodes, 0o700)
    installed = nodes / f"{node}{PUBLIC_SUFFIX}"
    if installed.exists() and not force:
        raise KeyFileError(f"{installed} already exists: node {node} already has a key "
                           "(revoke it first, or use --force to replace it)")
    bundle = Path(out_dir) if out_dir is not None else root / BUNDLES_DIR / node
    if out_dir is None:
        _make_dir(root / BUNDLES_DIR, 0o700)
    _make_dir(bundle, 0o700)
    node_public, _ = _new_keypair(bundle, NODE)
    _install_public(collector_public, bundle / f"{COLLECTOR}{PUBLIC_SUFFIX}")
    # Allow-list last, so a failure above never leaves a key without a bundle.
    if installed.exists():
        _move_to_revoked(root, node)
    _install_public(node_public, installed)
    return bundle


def revoke(keys_dir: str | Path, node: str) -> None:
    """Move nodes/<node>.key to revoked/; the collector refuses it from its next reload."""
    validate_node_name(node)
    root = Path(keys_dir)
    installed = root / NODES_DIR / f"{node}{PUBLIC_SUFFIX}"
    if not installed.is_file():
        raise KeyFileError(f"{installed}: no such file (node {node} is not allow-listed)")
    _move_to_revoked(root, node)


def server_keys(keys_dir: str | Path) -> tuple[bytes, bytes]:
    """(public, secret) z85 keys for the collector's CURVE server socket."""
    public, secret = _load(Path(keys_dir) / f"{COLLECTOR}{SECRET_SUFFIX}", secret=True)
    assert secret is not None
    return public, secret


def client_keys(bundle_dir: str | Path) -> tuple[bytes, bytes, bytes]:
    """(public, secret, collector_public) z85 keys for an agent's CURVE client socket."""
    root = Path(bundle_dir)
    public, secret = _load(root / f"{NODE}{SECRET_SUFFIX}", secret=True)
    assert secret is not None
    collector_public, _ = _load(root / f"{COLLECTOR}{PUBLIC_SUFFIX}", secret=False)
    return public, secret, collector_public


def allowed_nodes(keys_dir: str | Path) -> dict[bytes, str]:
    """{z85 public key: node name} from nodes/*.key (the CURVE allow-list).

    Raises KeyFileError for a malformed file, a file holding a secret key, a file name
    that is not a valid node name, or one key listed under two node names."""
    nodes = Path(keys_dir) / NODES_DIR
    if not nodes.is_dir():
        raise KeyFileError(f"{nodes}: no such directory (run 'slurmgpu keys init' first)")
    mode = stat.S_IMODE(nodes.stat().st_mode)
    if mode & 0o022:  # whoever can write here can add a node to the allow-list
        raise InsecureKeyError(f"{nodes} is writable by group/others (mode {mode:04o}); chmod 700 it")
    result: dict[bytes, str] = {}
    with _os_errors(nodes):
        files = sorted(nodes.glob(f"*{PUBLIC_SUFFIX}"))
    for path in files:
        node = path.name[:-len(PUBLIC_SUFFIX)]
        try:
            validate_node_name(node)
        except KeyFileError:
            raise KeyFileError(f"{path}: file name is not a valid node name") from None
        public, secret = _load(path, secret=False)
        if secret is not None:
            raise KeyFileError(f"{path} holds a secret key; the allow-list must hold "
                               "public keys only (remove it and rotate that key)")
        if public in result:
            raise KeyFileError(f"{path}: the same key is allow-listed for node "
                               f"{result[public]}; a key may belong to one node only")
        result[public] = node
    return result


__all__ = [
    "DEFAULT_KEYS_DIR", "KeyFileError", "add_node", "allowed_nodes", "check_private",
    "client_keys", "fingerprint", "init", "public_key", "revoke", "server_keys", "validate_node_name",
]

