"""A client whose host vanishes mid-request, for
``test_vanished_client.py``; run as ``unshare -rn python vanished_client.py
KEEPALIVE_S PLAN`` (a network namespace of its own, where taking the loopback
down leaves a connection with no FIN and no RST: what a client powered off,
or one behind a network that went away, leaves). Prints what the server
holds once the loopback is back, as JSON."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

from serverlib import running_server

DOWN_S = 8.0  # keepalive 1 s: probes from 1 s idle, 3 of them 1 s apart, all unanswered


def loopback(state: str) -> None:
    subprocess.run(["ip", "link", "set", "lo", state], check=True)


def main(keepalive_s: str, plan: str) -> None:
    loopback("up")
    with running_server(
        "--load-format=null", f"--fault-plan={plan}", f"--tcp-keepalive={keepalive_s}"
    ) as server:
        body = json.dumps(  # an answer not streamed: the connection idle while it is made
            {"text": "Hi", "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}}
        ).encode()
        client = socket.create_connection(("127.0.0.1", server.port))
        head = f"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
        client.sendall(head.encode() + body)
        deadline = time.monotonic() + 30
        while not server.info()["requests_in_flight"]:
            assert time.monotonic() < deadline, "the request never came in"
            time.sleep(0.1)
        loopback("down")
        time.sleep(DOWN_S)
        loopback("up")
        held = server.info()["requests_in_flight"]
        client.close()
    print(json.dumps({"held": held}))


if __name__ == "__main__":
    main(*sys.argv[1:])
