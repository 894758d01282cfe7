"""A small OAuth 2.1 authorization server and the MCP server it guards, with accounts (issue 26).

A real process for the OAuth attack tests (tests/e2e/test_oauth_callback.py): stdlib only, on
127.0.0.1, printing `{"port": N}` once it listens. The MCP server at `/mcp` has one tool,
`whoami`, which answers `account=<name>`: the account whose authorization issued the bearer
token, so a test can tell whose login a session's calls act on.

The authorization endpoint approves at once for the account its caller names in an `X-Account`
header (what a browser's session cookie does at a real server): each local user's "browser"
authorizes its own account. The code is bound to the client, the redirect URI and the PKCE
challenge of that request, and the token endpoint checks all three, as a real server does.

Options: `--token-fails` (the token endpoint refuses every code, with a multi-line body),
`--hold-token` (a token request waits until `POST /control/release`, bounded), and
`--resource-mismatch` (the protected resource metadata names another resource).
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

# A held token request gives up after this: a test that never releases it fails, not hangs.
HOLD_LIMIT = 30.0
MAX_BODY = 64 * 1024


class State:
    def __init__(self, options: set[str]) -> None:
        self.options = options
        self.lock = threading.Lock()
        self.codes: dict[str, dict[str, str]] = {}  # code -> what it was issued for
        self.tokens: dict[str, str] = {}  # access token -> account
        self.clients = 0
        self.release = threading.Event()
        self.origin = ""


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: the tests read what they need from the answers

    # -- helpers ---------------------------------------------------------------------------------

    def _send(self, status: int, body: Any = None, headers: dict[str, str] | None = None) -> None:
        data = (
            b""
            if body is None
            else (body if isinstance(body, bytes) else json.dumps(body).encode())
        )
        self.send_response(status)
        if body is not None and not isinstance(body, bytes):
            self.send_header("Content-Type", "application/json")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> bytes:
        length = min(int(self.headers.get("Content-Length") or 0), MAX_BODY)
        return self.rfile.read(length) if length else b""

    @property
    def state(self) -> State:
        return self.server.state

    # -- routes --------------------------------------------------------------------------------

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        origin = self.state.origin
        if url.path == "/.well-known/oauth-protected-resource/mcp":
            resource = (
                f"{origin}/other"
                if "--resource-mismatch" in self.state.options
                else f"{origin}/mcp"
            )
            self._send(200, {"resource": resource, "authorization_servers": [origin]})
        elif url.path == "/.well-known/oauth-authorization-server":
            self._send(
                200,
                {
                    "issuer": origin,
                    "authorization_endpoint": f"{origin}/authorize",
                    "token_endpoint": f"{origin}/token",
                    "registration_endpoint": f"{origin}/register",
                    "response_types_supported": ["code"],
                    "grant_types_supported": ["authorization_code"],
                    "code_challenge_methods_supported": ["S256"],
                    "token_endpoint_auth_methods_supported": ["none"],
                },
            )
        elif url.path == "/authorize":
            self._authorize({k: v[0] for k, v in parse_qs(url.query).items()})
        elif url.path == "/mcp":
            self._send(405 if self._account() else 401, headers=self._challenge())
        else:
            self._send(404, {"error": "not found"})

    def do_DELETE(self) -> None:
        self._send(200)

    def do_POST(self) -> None:
        path = urlsplit(self.path).path
        body = self._body()
        if path == "/register":
            with self.state.lock:
                self.state.clients += 1
                client_id = f"client-{self.state.clients}"
            doc = json.loads(body)
            self._send(201, {**doc, "client_id": client_id, "token_endpoint_auth_method": "none"})
        elif path == "/token":
            self._token({k: v[0] for k, v in parse_qs(body.decode()).items()})
        elif path == "/control/release":
            self.state.release.set()
            self._send(200, {"released": True})
        elif path == "/mcp":
            self._mcp(body)
        else:
            self._send(404, {"error": "not found"})

    def _authorize(self, query: dict[str, str]) -> None:
        account = self.headers.get("X-Account") or "anonymous"
        redirect = query.get("redirect_uri", "")
        if query.get("code_challenge_method") != "S256" or not query.get("code_challenge"):
            self._send(400, {"error": "invalid_request"})
            return
        code = "code-" + secrets.token_urlsafe(12)
        with self.state.lock:
            self.state.codes[code] = {
                "account": account,
                "client_id": query.get("client_id", ""),
                "redirect_uri": redirect,
                "challenge": query["code_challenge"],
                "scope": query.get("scope", ""),
            }
        target = f"{redirect}?{urlencode({'code': code, 'state': query.get('state', '')})}"
        self._send(302, headers={"Location": target})

    def _token(self, form: dict[str, str]) -> None:
        if "--hold-token" in self.state.options:
            self.state.release.wait(HOLD_LIMIT)
        if "--token-fails" in self.state.options:
            self._send(
                400, b'{"error": "invalid_grant",\n "error_description": "the code\nis bad"}'
            )
            return
        with self.state.lock:
            issued = self.state.codes.pop(form.get("code", ""), None)
        verifier = form.get("code_verifier", "").encode()
        challenge = (
            base64.urlsafe_b64encode(hashlib.sha256(verifier).digest()).rstrip(b"=").decode()
        )
        if (
            issued is None
            or form.get("grant_type") != "authorization_code"
            or issued["client_id"] != form.get("client_id")
            or issued["redirect_uri"] != form.get("redirect_uri")
            or not secrets.compare_digest(issued["challenge"], challenge)
        ):
            self._send(400, {"error": "invalid_grant"})
            return
        token = "tok-" + secrets.token_urlsafe(16)
        with self.state.lock:
            self.state.tokens[token] = issued["account"]
        answer: dict[str, Any] = {"access_token": token, "token_type": "Bearer", "expires_in": 3600}
        if issued["scope"]:
            answer["scope"] = issued["scope"]
        self._send(200, answer)

    def _account(self) -> str | None:
        auth = self.headers.get("Authorization") or ""
        token = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else ""
        with self.state.lock:
            return self.state.tokens.get(token)

    def _challenge(self) -> dict[str, str]:
        prm = f"{self.state.origin}/.well-known/oauth-protected-resource/mcp"
        return {"WWW-Authenticate": f'Bearer resource_metadata="{prm}"'}

    def _mcp(self, body: bytes) -> None:
        account = self._account()
        if account is None:
            self._send(401, {"error": "unauthorized"}, headers=self._challenge())
            return
        msg = json.loads(body)
        if "id" not in msg:
            self._send(202)
            return
        method = msg.get("method")
        result: dict[str, Any]
        if method == "initialize":
            result = {
                "protocolVersion": "2025-06-18",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "accounts", "version": "1"},
            }
        elif method == "tools/list":
            result = {"tools": [{"name": "whoami", "inputSchema": {"type": "object"}}]}
        elif method == "tools/call":
            result = {"content": [{"type": "text", "text": f"account={account}"}]}
        elif method == "ping":
            result = {}
        else:
            answer = {"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32601, "message": "no"}}
            self._send(200, answer)
            return
        self._send(200, {"jsonrpc": "2.0", "id": msg["id"], "result": result})


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, state: State) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.state = state
        state.origin = f"http://127.0.0.1:{self.server_address[1]}"


def main() -> None:
    server = Server(State(set(sys.argv[1:])))
    print(json.dumps({"port": server.server_address[1]}), flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
