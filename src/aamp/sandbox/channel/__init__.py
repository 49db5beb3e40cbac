"""The host end of the guest-agent channel: the only way the host reaches into a sandbox.

The host *listens* on a Unix socket and the guest agent (`aamp.guest.agent`) dials it: for
gVisor the socket's directory is bind-mounted into the guest, for Firecracker the vsock device
forwards guest connections to it. The agent keeps one idle connection open; each operation
takes that connection, sends one request on it, and the agent dials a fresh spare at once.
So an exec costs one request frame and its answer, with no handshake on the hot path.

Trust: the guest is hostile until proven otherwise. Every frame header is checked before its
payload is read (`aamp.guest.wire`), every JSON message is validated field by field, sizes the
guest claims are never believed beyond `max_file_bytes`, and every wait on the guest has a
timeout. Whatever the guest does, the host gets one of these clean exceptions, and only the
connection concerned is dropped:

- `GuestError`: the guest refused the request and said why (message shown as it came).
- `FileTooLargeError`: a file over `max_file_bytes` (refused before any data moves).
- `GuestProtocolError`: the guest sent something malformed or out of place.
- `GuestTimeout`: the guest went silent.
- `GuestUnavailable`: no guest connection within the timeout, or the guest hung up.
- `PathEscapeError` (a `ValueError`): a put/get path outside /workspace, refused up front.

Usage::

    channel = GuestChannel(sock_path, max_file_bytes=settings.max_file_bytes)
    await channel.start()                      # listen before the guest boots
    ...                                        # start the sandbox
    await channel.wait_ready(timeout=10)
    result, out, err = await channel.run(["python3", "-c", "print(6*7)"], timeout=30)
    async with await channel.exec(["sh", "-c", "make"]) as session:
        async for chunk in session:            # Output("stdout"|"stderr", bytes), live
            ...
    print(session.result.exit_code)
    await channel.put("/workspace/in.csv", data, len(data))
    async with await channel.get("/workspace/out.pdf") as stream:
        async for chunk in stream: ...
    answer = await channel.browser({"action": "snapshot", ...}, timeout=60, max_answer=2**23)
    await channel.close()

One module per job: `errors.py` (the exceptions above), `workspace.py` (the path rule),
`messages.py` (validation of what the guest sends), `pool.py` (the socket and its
connections), `guest_channel.py` (the operations), `exec_session.py` (a running command),
`downloads.py` (a file coming out). Import the names from `aamp.sandbox`.
"""
