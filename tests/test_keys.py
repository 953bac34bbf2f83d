"""CURVE key management: the head-node layout, node bundles, permissions, the CLI, and a
real pyzmq CURVE handshake on loopback against the allow-list."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
import zmq.auth
from click.testing import CliRunner
from zmq.auth.thread import ThreadAuthenticator

from slurmgpu import keys
from slurmgpu.cli.keys_cmd import keys as keys_group
from slurmgpu.errors import SlurmGpuError
from slurmgpu.keys import KeyFileError


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture()
def head(tmp_path: Path) -> Path:
    root = tmp_path / "keys"
    keys.init(root)
    return root


def test_key_file_error_is_a_slurmgpu_error() -> None:
    assert issubclass(KeyFileError, SlurmGpuError)


def test_round_trip(tmp_path: Path) -> None:
    root = tmp_path / "etc" / "keys"
    public = keys.init(root)
    assert public == root / "collector.key"
    assert (root / "nodes").is_dir() and (root / "revoked").is_dir()
    server_public, server_secret = keys.server_keys(root)
    assert len(server_public) == len(server_secret) == 40
    assert zmq.auth.load_certificate(public) == (server_public, None)

    bundle = keys.add_node(root, "gpu-n1")
    assert bundle == root / "bundles" / "gpu-n1"
    assert sorted(p.name for p in bundle.iterdir()) == ["collector.key", "node.key",
                                                       "node.key_secret"]
    node_public, node_secret, collector_public = keys.client_keys(bundle)
    assert collector_public == server_public
    assert node_secret != node_public
    assert (root / "nodes" / "gpu-n1.key").read_bytes() == (bundle / "node.key").read_bytes()

    out = tmp_path / "elsewhere" / "n2"
    assert keys.add_node(root, "gpu-n2", out_dir=out) == out
    n2_public = keys.client_keys(out)[0]
    assert keys.allowed_nodes(root) == {node_public: "gpu-n1", n2_public: "gpu-n2"}

    keys.revoke(root, "gpu-n1")
    assert keys.allowed_nodes(root) == {n2_public: "gpu-n2"}
    revoked = list((root / "revoked").iterdir())
    assert len(revoked) == 1 and revoked[0].name.startswith("gpu-n1.")
    assert zmq.auth.load_certificate(revoked[0])[0] == node_public
    # Revoked, the node can be added again with a new key (the old bundle is replaced).
    keys.add_node(root, "gpu-n1")
    assert keys.client_keys(bundle)[0] != node_public
    assert set(keys.allowed_nodes(root).values()) == {"gpu-n1", "gpu-n2"}
    # No temporary files left behind anywhere.
    assert not [p for p in root.rglob("*") if p.name.startswith(".tmp")]


def test_every_secret_is_0600_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        root = tmp_path / "keys"
        keys.init(root)
        keys.add_node(root, "n1")
        keys.add_node(root, "n2", out_dir=tmp_path / "out" / "n2")
        keys.add_node(root, "n1", force=True)
    finally:
        os.umask(old)
    secrets = sorted(tmp_path.rglob("*.key_secret"))
    assert sorted(p.name for p in secrets) == ["collector.key_secret", "node.key_secret",
                                               "node.key_secret"]
    for path in secrets:
        assert mode(path) == 0o600, path
    for d in (root, root / "nodes", root / "revoked", root / "bundles", root / "bundles" / "n1",
              tmp_path / "out" / "n2"):
        assert mode(d) == 0o700, d


@pytest.mark.parametrize(("bits", "word"), [(0o644, "readable"), (0o640, "readable"),
                                            (0o604, "readable"), (0o620, "writable"),
                                            (0o700, None), (0o400, None)])
def test_loose_permissions_refused(head: Path, bits: int, word: str | None) -> None:
    secret = head / "collector.key_secret"
    os.chmod(secret, bits)
    bundle = keys.add_node(head, "n1")
    os.chmod(bundle / "node.key_secret", bits)
    if word is None:
        keys.server_keys(head)
        keys.client_keys(bundle)
        return
    expected = f"{secret} is {word} by group/others (mode {bits:04o}); chmod 600 it"
    with pytest.raises(KeyFileError) as info:
        keys.server_keys(head)
    assert str(info.value) == expected
    with pytest.raises(KeyFileError, match=r"node\.key_secret is .* by group/others"):
        keys.client_keys(bundle)


def test_check_private(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match="not a regular file"):
        keys.check_private(tmp_path)
    with pytest.raises(KeyFileError, match="no such file"):
        keys.check_private(tmp_path / "missing")
    path = tmp_path / "s"
    path.write_text("x")
    path.chmod(0o600)
    keys.check_private(path)
    link = tmp_path / "link"
    link.symlink_to(path)
    keys.check_private(link)  # the target is what gets read
    path.chmod(0o644)
    with pytest.raises(KeyFileError, match=r"\(mode 0644\)"):
        keys.check_private(link)


@pytest.mark.parametrize("node", ["", "x" * 129, "gpu n1", "gpu/n1", "..", ".", ".hidden",
                                  "-rf", "gpu\nn1", "gpu*", "nöde", "a@b"])
def test_bad_node_name(head: Path, node: str) -> None:
    with pytest.raises(KeyFileError, match="bad node name"):
        keys.add_node(head, node)
    with pytest.raises(KeyFileError, match="bad node name"):
        keys.revoke(head, node)
    assert not list((head / "nodes").iterdir())
    assert not (head / "bundles").exists()


def test_good_node_names(head: Path) -> None:
    for node in ("x" * 128, "gpu-h100-001.cluster_a", "7", "N1"):
        keys.add_node(head, node)
    assert sorted(keys.allowed_nodes(head).values()) == sorted(
        ["x" * 128, "gpu-h100-001.cluster_a", "7", "N1"])


def test_init_refuses_overwrite(head: Path) -> None:
    before = keys.server_keys(head)
    with pytest.raises(KeyFileError, match=r"collector\.key already exists; refusing"):
        keys.init(head)
    assert keys.server_keys(head) == before
    keys.init(head, force=True)
    assert keys.server_keys(head) != before
    assert mode(head / "collector.key_secret") == 0o600


def test_add_node_errors(tmp_path: Path, head: Path) -> None:
    with pytest.raises(KeyFileError, match="run 'slurmgpu keys init' first"):
        keys.add_node(tmp_path / "nothing", "n1")
    keys.add_node(head, "n1")
    first = keys.allowed_nodes(head)
    with pytest.raises(KeyFileError, match=r"n1\.key already exists"):
        keys.add_node(head, "n1")
    assert keys.allowed_nodes(head) == first
    keys.add_node(head, "n1", force=True)  # rotation: the old key goes to revoked/
    assert keys.allowed_nodes(head) != first
    assert len(list((head / "revoked").iterdir())) == 1
    with pytest.raises(KeyFileError, match="not allow-listed"):
        keys.revoke(head, "n2")


def test_allowed_nodes_errors(tmp_path: Path, head: Path) -> None:
    with pytest.raises(KeyFileError, match="run 'slurmgpu keys init' first"):
        keys.allowed_nodes(tmp_path / "nothing")
    bundle = keys.add_node(head, "n1")
    nodes = head / "nodes"
    (nodes / "n2.key").write_bytes((bundle / "node.key").read_bytes())
    with pytest.raises(KeyFileError, match="same key is allow-listed for node n1"):
        keys.allowed_nodes(head)
    (nodes / "n2.key").write_bytes((bundle / "node.key_secret").read_bytes())
    with pytest.raises(KeyFileError, match="holds a secret key"):
        keys.allowed_nodes(head)
    (nodes / "n2.key").write_text("garbage\n")
    with pytest.raises(KeyFileError, match=r"n2\.key: not a CURVE certificate"):
        keys.allowed_nodes(head)
    (nodes / "n2.key").write_text('curve\n    public-key = "tooshort"\n')
    with pytest.raises(KeyFileError, match="not a 40-character z85"):
        keys.allowed_nodes(head)
    (nodes / "n2.key").unlink()
    (nodes / "bad name.key").write_bytes((bundle / "node.key").read_bytes())
    with pytest.raises(KeyFileError, match="not a valid node name"):
        keys.allowed_nodes(head)


def test_missing_files_are_key_file_errors(tmp_path: Path, head: Path) -> None:
    with pytest.raises(KeyFileError, match="no such file"):
        keys.server_keys(tmp_path)
    bundle = keys.add_node(head, "n1")
    (bundle / "collector.key").unlink()
    with pytest.raises(KeyFileError, match=r"collector\.key: no such file"):
        keys.client_keys(bundle)


# ---------------------------------------------------------------------------- CURVE


@pytest.fixture()
def ctx() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def _server(ctx: zmq.Context, root: Path) -> tuple[zmq.Socket, str]:
    public, secret = keys.server_keys(root)
    sock = ctx.socket(zmq.PULL)
    sock.curve_secretkey = secret
    sock.curve_publickey = public
    sock.curve_server = True
    sock.rcvtimeo = 2000
    sock.linger = 0
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    return sock, f"tcp://127.0.0.1:{port}"


def _client(ctx: zmq.Context, bundle: Path, endpoint: str) -> zmq.Socket:
    public, secret, collector_public = keys.client_keys(bundle)
    sock = ctx.socket(zmq.PUSH)
    sock.curve_secretkey = secret
    sock.curve_publickey = public
    sock.curve_serverkey = collector_public
    sock.linger = 0
    sock.connect(endpoint)
    return sock


def _nothing_arrives(server: zmq.Socket, ms: int = 300) -> bool:
    return server.poll(ms, zmq.POLLIN) == 0


def test_curve_handshake_against_the_allow_list(ctx: zmq.Context, tmp_path: Path,
                                                head: Path) -> None:
    good = keys.add_node(head, "gpu-n1")
    # A stranger: a valid keypair that knows our collector's public key, but whose key
    # is not in head/nodes/ (it was made by another head).
    keys.init(tmp_path / "other-head")
    stranger = keys.add_node(tmp_path / "other-head", "gpu-n9")
    (stranger / "collector.key").write_bytes((head / "collector.key").read_bytes())
    doomed = keys.add_node(head, "gpu-n2")

    auth = ThreadAuthenticator(ctx)
    auth.start()
    try:
        auth.configure_curve(domain="*", location=str(head / "nodes"))
        server, endpoint = _server(ctx, head)
        allowed = keys.allowed_nodes(head)

        # An allow-listed node connects; User-Id is its z85 public key -> its node name.
        client = _client(ctx, good, endpoint)
        client.send(b"hello from n1")
        msg = server.recv(copy=False)
        assert msg.bytes == b"hello from n1"
        user_id = msg.get("User-Id")
        assert isinstance(user_id, str)
        assert user_id == keys.client_keys(good)[0].decode()
        assert allowed[user_id.encode()] == "gpu-n1"

        # A node whose key is not allow-listed (made for another head) gets nothing through.
        outsider = _client(ctx, stranger, endpoint)
        outsider.send(b"let me in", zmq.NOBLOCK)
        assert _nothing_arrives(server)

        # gpu-n2 works until revoked ...
        n2 = _client(ctx, doomed, endpoint)
        n2.send(b"n2 before")
        assert allowed[str(server.recv(copy=False).get("User-Id")).encode()] == "gpu-n2"
        keys.revoke(head, "gpu-n2")
        auth.configure_curve(domain="*", location=str(head / "nodes"))
        # ... a new connection with the revoked key is refused after the reload ...
        n2_again = _client(ctx, doomed, endpoint)
        n2_again.send(b"n2 after", zmq.NOBLOCK)
        # ... but ZAP runs at handshake only: the connection made before the revocation
        # still delivers. The collector must check User-Id against the reloaded
        # allowed_nodes() (or rebind its socket) for revocation to cut it off.
        n2.send(b"n2 old connection")
        received = []
        # Wait (bounded) for the old connection's frame, then drain anything after it.
        while server.poll(300 if received else 10_000, zmq.POLLIN):
            frame = server.recv(copy=False)
            received.append((frame.bytes, str(frame.get("User-Id"))))
        assert [body for body, _ in received] == [b"n2 old connection"]
        assert received[0][1].encode() not in keys.allowed_nodes(head)

        # The allow-listed node is unaffected.
        client.send(b"still here")
        assert server.recv() == b"still here"
        for sock in (client, outsider, n2, n2_again, server):
            sock.close(linger=0)
    finally:
        auth.stop()


# ---------------------------------------------------------------------------- CLI


def run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, BaseException | None]:
    result = CliRunner().invoke(keys_group, list(args), env=env)
    return result.exit_code, result.output, result.exception


def test_cli_round_trip(tmp_path: Path) -> None:
    d = str(tmp_path / "k")
    code, out, exc = run("init", "--dir", d, "--json")
    assert (code, exc) == (0, None)
    info = json.loads(out)
    assert info["public_key_file"] == f"{d}/collector.key"
    assert info["fingerprint"] == info["public_key"][:8]

    code, out, _ = run("add-node", "gpu-n1", "--dir", d, "--json")
    added = json.loads(out)
    assert code == 0 and added["bundle_dir"] == f"{d}/bundles/gpu-n1"
    assert sorted(Path(f).name for f in added["files"]) == ["collector.key", "node.key",
                                                           "node.key_secret"]
    code, out, _ = run("add-node", "gpu-n2", "--dir", d, "--out", str(tmp_path / "b2"))
    assert code == 0 and str(tmp_path / "b2") in out

    code, out, _ = run("list", "--dir", d, "--json")
    listed = json.loads(out)
    assert listed["collector"] == info["fingerprint"]
    assert [n["node"] for n in listed["nodes"]] == ["gpu-n1", "gpu-n2"]
    assert listed["nodes"][0]["fingerprint"] == added["fingerprint"]
    code, out, _ = run("list", "--dir", d)
    assert code == 0 and f"gpu-n1  {added['fingerprint']}" in out

    code, out, _ = run("revoke", "gpu-n1", "--dir", d, "--json")
    assert code == 0 and json.loads(out) == {"ok": True, "node": "gpu-n1",
                                             "fingerprint": added["fingerprint"]}
    code, out, _ = run("list", "--dir", d, "--json")
    assert [n["node"] for n in json.loads(out)["nodes"]] == ["gpu-n2"]
    code, out, _ = run("revoke", "gpu-n2", "--dir", d)
    assert code == 0 and "revoked" in out
    code, out, _ = run("list", "--dir", d)
    assert "no nodes allow-listed" in out


def test_cli_env_dir(tmp_path: Path) -> None:
    env = {"SLURMGPU_KEYS_DIR": str(tmp_path / "env")}
    code, out, _ = run("init", env=env)
    assert code == 0 and str(tmp_path / "env" / "collector.key") in out
    assert run("add-node", "n1", env=env)[0] == 0
    assert (tmp_path / "env" / "nodes" / "n1.key").is_file()
    # --dir wins over the environment.
    assert run("init", "--dir", str(tmp_path / "flag"), env=env)[0] == 0
    assert (tmp_path / "flag" / "collector.key").is_file()


def test_cli_errors_are_slurmgpu_errors(tmp_path: Path) -> None:
    d = str(tmp_path / "k")
    code, _, exc = run("add-node", "n1", "--dir", d)
    assert code != 0 and isinstance(exc, KeyFileError)
    assert run("init", "--dir", d)[0] == 0
    _, _, exc = run("init", "--dir", d)
    assert isinstance(exc, KeyFileError) and "--force" in str(exc)
    assert run("init", "--dir", d, "--force")[0] == 0
    _, _, exc = run("add-node", "bad/name", "--dir", d)
    assert isinstance(exc, KeyFileError) and "bad node name" in str(exc)
    _, _, exc = run("revoke", "n1", "--dir", d)
    assert isinstance(exc, KeyFileError) and "not allow-listed" in str(exc)
    assert run("add-node", "n1", "--dir", d)[0] == 0
    _, _, exc = run("add-node", "n1", "--dir", d)
    assert isinstance(exc, KeyFileError) and "already" in str(exc)
    assert run("add-node", "n1", "--dir", d, "--force")[0] == 0


@pytest.mark.parametrize("args", [[], ["init"], ["add-node"], ["revoke"], ["list"]])
def test_cli_help(args: list[str]) -> None:
    code, out, _ = run(*args, "--help")
    assert code == 0 and "Usage:" in out
    if args:
        assert "--dir DIR" in out and "--json" in out
