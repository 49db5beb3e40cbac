"""The client's HTTP/1.1 connection against a real TCP server on loopback whose answers each
test scripts byte by byte (`ScriptedHttpServerForTests`, in scripted_http.py): what a control
plane can do to a client (refuse, stream slowly, stop reading an upload, break off, stay
silent, close an idle connection) and what the client then says."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from scripted_http import answer, json_answer

from aamp.client import Client, ClientError
from aamp.client.transport import Connection


def test_a_refusal_is_the_apis_code_and_message(serve) -> None:
    refusal = {"code": "not_found", "message": "no sandbox 'sb-1'"}
    server = serve(lambda conn, head: conn.sendall(json_answer(refusal, "404 Not Found")))
    with Client(server.url, "aamp_t") as client, pytest.raises(ClientError) as caught:
        client.call("GET", "/v1/sandboxes/sb-1")
    assert (caught.value.code, caught.value.message, caught.value.status) == (
        "not_found",
        "no sandbox 'sb-1'",
        404,
    )
    assert b"authorization: Bearer aamp_t" in server.heads[0]


def test_an_error_without_the_apis_body_names_the_status(serve) -> None:
    server = serve(lambda conn, head: conn.sendall(answer("502 Bad Gateway", b"<html>")))
    with Client(server.url, "t") as client, pytest.raises(ClientError) as caught:
        client.call("GET", "/v1/sandboxes")
    assert (caught.value.code, caught.value.message) == ("http_error", "HTTP 502")


def test_requests_share_one_connection_and_survive_an_idle_close(serve) -> None:
    def script(conn: socket.socket, head: bytes) -> None:
        if head.startswith(b"GET /close"):
            conn.sendall(json_answer([]))
            time.sleep(0.1)
            conn.shutdown(socket.SHUT_RDWR)  # as a keep-alive timeout does, between requests
        else:
            conn.sendall(json_answer([1]))

    server = serve(script)
    with Client(server.url, "t") as client:
        assert client.call("GET", "/a") == [1] and client.call("GET", "/b") == [1]
        assert server.connections == 1
        client.call("GET", "/close")
        time.sleep(0.3)
        assert client.call("GET", "/c") == [1]  # a new connection, not an error
    assert server.connections == 2


def test_lines_arrive_as_the_server_sends_them(serve) -> None:
    release = threading.Event()

    def script(conn: socket.socket, head: bytes) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        conn.sendall(b"6;ext=1\r\nfirst\n\r\n")
        release.wait(10)
        conn.sendall(b"8\r\nsecond\r\n\r\n0\r\ntrailer: x\r\n\r\n")

    server = serve(script)
    with Client(server.url, "t") as client, client.stream("GET", "/v1/x") as resp:
        lines = resp.iter_lines()
        assert next(lines) == "first"  # before the rest was even sent
        release.set()
        assert list(lines) == ["second"]
        assert resp.complete


def test_an_upload_refused_unread_gets_the_refusal_not_a_broken_pipe(serve) -> None:
    refusal = {"code": "too_large", "message": "the file is 67108864 bytes; the limit is 1"}

    def script(conn: socket.socket, head: bytes) -> bool:
        conn.sendall(json_answer(refusal, "413 Content Too Large"))
        time.sleep(0.5)  # the client is still sending, into full buffers
        return True  # closed with the body unread: the client's next send fails

    server = serve(script)
    body = (b"x" * (1 << 20) for _ in range(64))
    with Client(server.url, "t") as client, pytest.raises(ClientError) as caught:
        client.call("PUT", "/v1/f", content=body, headers={"content-length": str(64 << 20)})
    assert caught.value.code == "too_large", caught.value.message


@pytest.mark.parametrize(
    "read",
    [lambda resp: b"".join(resp.iter_bytes()), lambda resp: list(resp.iter_lines())],
    ids=["bytes", "lines"],
)
def test_a_body_cut_short_is_a_transfer_failure(serve, read) -> None:
    def script(conn: socket.socket, head: bytes) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n" + b"y" * 10)
        conn.shutdown(socket.SHUT_RDWR)

    server = serve(script)
    with (
        Client(server.url, "t") as client,
        client.stream("GET", "/v1/f") as resp,
        pytest.raises(ClientError) as caught,
    ):
        read(resp)
    assert caught.value.code == "transfer_failed"
    assert caught.value.message == "transfer failed: the answer ended 90 bytes short of its length"


def test_a_garbled_answer_is_a_transfer_failure(serve) -> None:
    server = serve(lambda conn, head: conn.sendall(b"SSH-2.0-OpenSSH\r\n\r\n"))
    with Client(server.url, "t") as client, pytest.raises(ClientError) as caught:
        client.call("GET", "/v1/x")
    assert caught.value.code == "transfer_failed", caught.value.message


def test_a_silent_server_is_a_timeout_naming_the_wait(serve) -> None:
    server = serve(lambda conn, head: time.sleep(5))
    started = time.monotonic()
    with Client(server.url, "t", timeout=0.5) as client, pytest.raises(ClientError) as caught:
        client.call("GET", "/v1/x")
    assert time.monotonic() - started < 3
    assert (caught.value.code, caught.value.message) == (
        "timed_out",
        "the control plane did not answer within 0.5 s",
    )


def test_nothing_listening_is_unreachable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    with Client(url, "t") as client, pytest.raises(ClientError) as caught:
        client.call("GET", "/v1/sandboxes")
    assert caught.value.code == "unreachable"
    assert caught.value.message == (
        f"the control plane is not reachable at {url}; start it with `aamp up`"
    )


def test_a_name_stays_in_the_path_and_the_query_is_only_params(serve) -> None:
    server = serve(lambda conn, head: conn.sendall(json_answer({})))
    with Client(server.url, "t") as client:
        client.call("GET", "/v1/policies/a?b c#d/../..")
        client.call("GET", "/v1/approvals", params={"pending": "false", "q": "x&y"})
    assert server.heads[0].split(b"\r\n")[0] == b"GET /v1/policies/a%3Fb%20c%23d/../.. HTTP/1.1"
    assert server.heads[1].split(b"\r\n")[0] == b"GET /v1/approvals?pending=false&q=x%26y HTTP/1.1"


def test_leaving_a_stream_early_closes_the_connection(serve) -> None:
    def script(conn: socket.socket, head: bytes) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n6\r\nfirst\n\r\n")

    server = serve(script)
    connection = Connection(server.url, {}, timeout=5)
    with connection.stream("POST", "/v1/sandboxes/sb-1/exec") as resp:
        assert next(resp.iter_lines()) == "first"
    # The server sees the end of its connection: that is what stops a command it streams.
    assert server.closed_by_client.wait(5)
    connection.close()


def test_only_an_http_address_is_used() -> None:
    with pytest.raises(ClientError) as caught:
        Connection("https://cp.internal:8700", {}, timeout=5)
    assert caught.value.code == "bad_url"


def test_a_header_that_would_break_the_head_is_refused_unsent(serve) -> None:
    server = serve(lambda conn, head: conn.sendall(json_answer({})))
    token = "aamp_t\r\nx-injected: yes"  # e.g. a token file with a line break in it
    with Client(server.url, token) as client, pytest.raises(ClientError) as caught:
        client.call("GET", "/v1/sandboxes")
    assert caught.value.code == "bad_request"
    assert "'authorization'" in caught.value.message and "line break" in caught.value.message
    assert "aamp_t" not in caught.value.message  # a token is never repeated in an error
    assert server.heads == [] and server.connections == 0


def test_a_body_of_unknown_length_goes_chunked_and_arrives_whole(serve) -> None:
    received = []

    def script(conn: socket.socket, head: bytes) -> bool:
        assert b"\r\nTransfer-Encoding: chunked" in head
        body = server.after_head
        while not body.endswith(b"\r\n0\r\n\r\n"):
            body += conn.recv(65536)
        received.append(body)
        conn.sendall(json_answer({"ok": True}, extra_close=True))
        return True

    server = serve(script)
    with Client(server.url, "t", timeout=5) as client:
        assert client.call("PUT", "/v1/f", content=iter([b"ab", b"", b"cde"])) == {"ok": True}
    assert received == [b"2\r\nab\r\n3\r\ncde\r\n0\r\n\r\n"]


def test_an_answer_that_closes_its_connection_is_followed_by_a_new_one(serve) -> None:
    server = serve(lambda conn, head: conn.sendall(json_answer([1], extra_close=True)))
    with Client(server.url, "t") as client:
        assert client.call("GET", "/a") == [1] and client.call("GET", "/b") == [1]
    assert server.connections == 2


def test_a_body_framed_by_the_connections_end_and_an_interim_answer(serve) -> None:
    def script(conn: socket.socket, head: bytes) -> bool:
        conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.0 200 OK\r\nx-a: 1\r\n\r\n[1,")
        conn.sendall(b"2]")
        return True  # the end of the connection is the end of the body

    server = serve(script)
    with Client(server.url, "t") as client:
        assert client.call("GET", "/a") == [1, 2]
        assert client.call("GET", "/b") == [1, 2]
    assert server.connections == 2


@pytest.mark.parametrize(
    "answer_bytes",
    [
        b"HTTP/1.1 200 OK\r\ncontent-length: nine\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\n" + b"x-a: 1\r\n" * 101 + b"\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nx-long: " + b"a" * 70000 + b"\r\n\r\n",
    ],
    ids=["length", "chunk-size", "too-many-headers", "no-colon", "long-line"],
)
def test_an_answer_that_is_not_http_it_can_read_is_a_transfer_failure(serve, answer_bytes) -> None:
    server = serve(lambda conn, head: conn.sendall(answer_bytes) or True)
    with Client(server.url, "t") as client, pytest.raises(ClientError) as caught:
        client.call("GET", "/v1/x")
    assert caught.value.code == "transfer_failed", caught.value.message


def test_a_method_that_is_not_one_is_refused_unsent(serve) -> None:
    server = serve(lambda conn, head: conn.sendall(json_answer({})))
    with Client(server.url, "t") as client, pytest.raises(ClientError) as caught:
        client.call("GET /v1/other HTTP/1.1\r\nx:", "/v1/sandboxes")
    assert caught.value.code == "bad_request", caught.value.message
    assert "is not an HTTP method" in caught.value.message
    assert server.heads == []
