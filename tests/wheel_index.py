"""Local wheel folders served as a PEP 503 simple index (and PEP 691 JSON, to a client that
asks for it) over HTTP on 127.0.0.1: what a CI job
sees when it points the harness at the PyTorch CPU index, without leaving this machine.

Used by tests/test_torch_source.py and tests/bench/bench_torch_source.py. The server records
every path it was asked for, so a test can tell that a wheel came from it.
"""

from __future__ import annotations

import base64
import hashlib
import html
import http.server
import json
import threading
import urllib.parse
import zipfile
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

from packaging.utils import canonicalize_name, parse_wheel_filename

JSON_TYPE = "application/vnd.pypi.simple.v1+json"  # PEP 691


def write_wheel(
    folder: Path, name: str, version: str, files: dict[str, str], requires: tuple[str, ...] = ()
) -> Path:
    """A pure-Python wheel of `files` (path in the wheel -> text) that needs `requires`,
    byte-identical every time (fixed zip dates): the one builder of the tests' fake
    packages."""
    stem = f"{name.replace('-', '_')}-{version}"
    info = f"{stem}.dist-info"
    needs = "".join(f"Requires-Dist: {r}\n" for r in requires)
    files = {
        **files,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{needs}",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    lines = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        lines.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    files[f"{info}/RECORD"] = "\n".join([*lines, f"{info}/RECORD,,"]) + "\n"
    wheel_path = folder / f"{stem}-py3-none-any.whl"
    with zipfile.ZipFile(wheel_path, "w", zipfile.ZIP_DEFLATED) as wheel:
        for path, text in files.items():
            wheel.writestr(zipfile.ZipInfo(path, date_time=(2020, 1, 1, 0, 0, 0)), text)
    return wheel_path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


class WheelIndex:
    """`with WheelIndex(folders) as index:` serves `index.url` (the `/simple` root) until the
    block ends; `index.requests` lists the paths fetched, in order."""

    def __init__(self, folders: Iterable[str | Path]) -> None:
        self.wheels: dict[str, Path] = {}
        for folder in folders:
            for wheel in sorted(Path(folder).glob("*.whl")):
                self.wheels.setdefault(wheel.name, wheel)
        if not self.wheels:
            raise FileNotFoundError("no wheel in the folders given")
        self.projects: dict[str, list[tuple[str, str]]] = {}
        for name, path in self.wheels.items():
            project = canonicalize_name(parse_wheel_filename(name)[0])
            self.projects.setdefault(project, []).append((name, _sha256(path)))
        self.requests: list[str] = []
        self._server: http.server.ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "not serving"
        return f"http://127.0.0.1:{self._server.server_address[1]}/simple"

    def fetched(self, prefix: str) -> list[str]:
        """The requested paths that start with `prefix` (e.g. "/files/torch-")."""
        return [path for path in self.requests if path.startswith(prefix)]

    def _json(self, path: str) -> bytes | None:
        """A project's page as PEP 691 JSON: what the harness's release list asks for (its
        Accept header names the JSON type); uv reads the HTML one."""
        project = canonicalize_name(path.removeprefix("/simple/").strip("/"))
        if project not in self.projects:
            return None
        files = [
            {"filename": name, "url": f"/files/{urllib.parse.quote(name)}",
             "hashes": {"sha256": digest}}
            for name, digest in self.projects[project]
        ]  # fmt: skip
        page = {"meta": {"api-version": "1.0"}, "name": project, "files": files}
        return json.dumps(page).encode()

    def _page(self, path: str) -> bytes | None:
        if path in ("/simple", "/simple/"):
            links = [f'<a href="/simple/{p}/">{p}</a>' for p in sorted(self.projects)]
        else:
            project = path.removeprefix("/simple/").strip("/")
            if canonicalize_name(project) not in self.projects:
                return None
            links = [
                f'<a href="/files/{urllib.parse.quote(name)}#sha256={digest}">'
                f"{html.escape(name)}</a>"
                for name, digest in self.projects[canonicalize_name(project)]
            ]
        body = "<!DOCTYPE html><html><body>\n" + "<br>\n".join(links) + "\n</body></html>\n"
        return body.encode()

    def __enter__(self) -> WheelIndex:
        index = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
                index.requests.append(path)
                if path.startswith("/files/") and path[7:] in index.wheels:
                    wheel = index.wheels[path[7:]]
                    self.send_response(200)
                    self.send_header("Content-Type", "application/octet-stream")
                    self.send_header("Content-Length", str(wheel.stat().st_size))
                    self.end_headers()
                    with wheel.open("rb") as handle:
                        while chunk := handle.read(1 << 20):
                            self.wfile.write(chunk)
                    return
                wants_json = JSON_TYPE in self.headers.get("Accept", "")
                read = index._json if wants_json else index._page
                page = read(path) if path.startswith("/simple") else None
                if page is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                kind = JSON_TYPE if wants_json else "text/html; charset=utf-8"
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)

            def do_HEAD(self) -> None:
                """What uv asks before a range request for a wheel's metadata: its size, and
                no Accept-Ranges, so it takes the whole wheel."""
                path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
                if not (path.startswith("/files/") and path[7:] in index.wheels):
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(index.wheels[path[7:]].stat().st_size))
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass  # the request list is the log

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
