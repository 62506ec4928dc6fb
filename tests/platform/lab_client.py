"""Run a notebook through a running JupyterLab, as its page does: a session over the server's REST API, each code
cell sent to the kernel over the server's websocket. Prints one JSON line: the cells run and any error.

    python tests/platform/lab_client.py http://127.0.0.1:8888/lab?token=... 01_upload_mnist.ipynb

Run with the learner's own environment (it needs websocket-client, which JupyterLab brings), where the lab is
reachable: inside the network namespace of a test with the network cut.
"""

from __future__ import annotations

import json
import sys
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import websocket

CELL_TIMEOUT = 600.0


def api(base: str, token: str, method: str, path: str, body: dict | None = None) -> dict:
    """One call of the server's REST API with the lab's token."""
    request = urllib.request.Request(f"{base}{path}", method=method, data=json.dumps(body).encode() if body else None,
                                     headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        text = response.read()
    return json.loads(text) if text else {}


def execute(channel: websocket.WebSocket, session: str, code: str) -> list[dict]:
    """Run ``code`` in the kernel; the error outputs it produced (empty: it ran cleanly)."""
    msg_id = uuid.uuid4().hex
    channel.send(json.dumps({
        "header": {"msg_id": msg_id, "msg_type": "execute_request", "session": session, "username": "test",
                   "version": "5.3"},
        "parent_header": {}, "metadata": {}, "channel": "shell",
        "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                    "allow_stdin": False, "stop_on_error": True}}))
    errors, replied, idle = [], False, False
    while not (replied and idle):
        message = json.loads(channel.recv())
        if message.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        kind = message["header"]["msg_type"]
        if kind == "error":
            errors.append({"ename": message["content"]["ename"], "evalue": message["content"]["evalue"]})
        elif kind == "stream" and message["content"]["name"] == "stderr" and "Traceback" in message["content"]["text"]:
            errors.append({"ename": "stderr", "evalue": message["content"]["text"][-500:]})
        replied |= kind == "execute_reply"
        idle |= kind == "status" and message["content"]["execution_state"] == "idle"
    return errors


def main(url: str, notebook: str) -> int:
    """Open a session for ``notebook`` in the lab at ``url`` and run its code cells in order."""
    parts = urllib.parse.urlsplit(url)
    token = urllib.parse.parse_qs(parts.query)["token"][0]
    base = f"{parts.scheme}://{parts.netloc}"
    content = api(base, token, "GET", f"/api/contents/{notebook}")["content"]  # the notebook, as the page reads it
    cells = [c for c in content["cells"] if c["cell_type"] == "code"]
    session = api(base, token, "POST", "/api/sessions",
                  {"path": notebook, "type": "notebook", "name": Path(notebook).name, "kernel": {"name": "python3"}})
    channel = websocket.create_connection(f"ws://{parts.netloc}/api/kernels/{session['kernel']['id']}/channels"
                                          f"?session_id={session['id']}", timeout=CELL_TIMEOUT,
                                          header=[f"Authorization: token {token}"])
    ran, errors = 0, []
    try:
        for cell in cells:
            errors = execute(channel, session["id"], "".join(cell["source"]))
            ran += 1
            if errors:
                break
    finally:
        channel.close()
        api(base, token, "DELETE", f"/api/sessions/{session['id']}")
    print(json.dumps({"notebook": notebook, "code cells": len(cells), "ran": ran, "errors": errors}))
    return 0 if not errors and ran == len(cells) else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
