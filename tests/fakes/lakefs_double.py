"""A lakeFS API test double: an HTTP server on 127.0.0.1 for the tests only.

No lakeFS server can run on the CI machines (no binary, no internet), so the
tests point the real ``lakefs`` SDK at this server instead. It answers the
part of the lakeFS REST API (``/api/v1``) that the SDK calls, with the real
semantics where they matter for the tutorial:

* commits are immutable snapshots (path -> entry) with parents; branches
  are pointers to a commit plus a staging area of uncommitted changes;
  ``main@`` reads only committed data, ``ref~N`` / ``ref^N`` walk parents;
* objects written through the API are stored in the repository's storage
  namespace in the real object server; an import records the physical
  addresses of the source objects without copying a byte, and reading an
  imported object returns the bytes from where they already are;
* merges are three-way (merge base = nearest common ancestor) and fail on
  conflicts unless a ``source-wins``/``dest-wins`` strategy is given; diffs
  are three-dot by default;
* basic auth with one key pair; errors come back as the API's ``Error``.

Responses are built from ``lakefs_sdk`` models so they match the real
schema. State is in memory. ``helpers`` and the notebooks never import this
module: they talk to whatever ``LAKEFS_ENDPOINT`` names.
"""

from __future__ import annotations

import base64
import bisect
import email.parser
import hashlib
import json
import re
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import MappingProxyType
from typing import Any

import lakefs_sdk
from lakefs_sdk import models

from helpers.settings import Settings
from helpers.storage import get_client

API = "/api/v1"
USER = "tutorial"
METADATA_HEADER = "x-lakefs-meta-"
NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9-]{2,62}$")
BRANCH_PATTERN = re.compile(r"^\w[-\w]*$", re.ASCII)  # Go's \w (lakeFS's validator) is ASCII only
MERGE_STRATEGY_KEY = ".lakefs.merge.strategy"  # graveler records it on every merge and import commit
MERGE_STRATEGIES = {None: "default", "": "default", "dest-wins": "dest-wins", "source-wins": "source-wins"}
# lakeFS proves it may write a new storage namespace by writing this object there, and refuses a
# namespace that already holds one (or the older root marker): it belongs to another repository.
NAMESPACE_MARKER, ROOT_MARKER = "_lakefs/dummy", "dummy"
NAMESPACE_MARKER_DATA = b"this is dummy data - created by lakeFS to check accessibility"


class ApiError(Exception):
    """An error answered to the client as ``Error`` JSON with an HTTP status (``body`` where lakeFS answers another)."""

    def __init__(self, status: HTTPStatus, message: str, body=None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.body = body


@dataclass(frozen=True)
class Exchange:
    """One request and the response the double gave (recorded for the contract test)."""

    method: str
    path: str
    status: int
    content_type: str
    json_body: bytes | None


@dataclass(frozen=True)
class Entry:
    """One object version: where its bytes are and what they hash to."""

    physical_address: str
    checksum: str
    size: int
    mtime: int
    content_type: str = "application/octet-stream"
    metadata: tuple[tuple[str, str], ...] = ()

    def identity(self) -> tuple:
        """What lakeFS compares entries by (catalog.EntryToValue): size, ETag, user metadata, content type."""
        return self.size, self.checksum, self.metadata, self.content_type

    def same_content(self, other: Entry | None) -> bool:
        return other is not None and self.identity() == other.identity()


@dataclass(frozen=True)
class Commit:
    """An immutable commit: its tree can't change after creation."""

    id: str
    parents: tuple[str, ...]
    message: str
    metadata: MappingProxyType
    creation_date: int
    generation: int
    tree: MappingProxyType  # path -> Entry

    @property
    def meta_range_id(self) -> str:
        digest = hashlib.sha256()
        for path in sorted(self.tree):
            digest.update(f"{path}\0{self.tree[path].physical_address}\0{self.tree[path].checksum}\n".encode())
        return digest.hexdigest() if self.tree else ""

    def model(self) -> models.Commit:
        return models.Commit(
            id=self.id, parents=list(self.parents), committer=USER, message=self.message,
            creation_date=self.creation_date, meta_range_id=self.meta_range_id,
            metadata=dict(self.metadata), generation=self.generation, version=1,
        )


@dataclass
class Branch:
    """A pointer to a commit plus uncommitted changes (None marks a deletion)."""

    commit_id: str
    staging: dict[str, Entry | None] = field(default_factory=dict)


@dataclass
class Repo:
    """One repository: its commits, branches and tags."""

    name: str
    storage_namespace: str
    default_branch: str
    creation_date: int
    commits: dict[str, Commit] = field(default_factory=dict)
    branches: dict[str, Branch] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)

    def model(self) -> models.Repository:
        return models.Repository(id=self.name, creation_date=self.creation_date, default_branch=self.default_branch,
                                 storage_namespace=self.storage_namespace, read_only=False)


def split_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/key`` -> ``(bucket, key)``."""
    if not uri.startswith("s3://"):
        raise ApiError(HTTPStatus.BAD_REQUEST, f"unsupported address {uri!r}: only s3:// is supported")
    bucket, _, key = uri[len("s3://"):].partition("/")
    return bucket, key


def overlay(commit: Commit, staging: dict[str, Entry | None] | None) -> dict[str, Entry]:
    """The tree a reader sees: the commit's tree with the staged changes applied."""
    tree = dict(commit.tree)
    for path, entry in (staging or {}).items():
        if entry is None:
            tree.pop(path, None)
        else:
            tree[path] = entry
    return tree


def tree_diff(left: dict[str, Entry], right: dict[str, Entry]) -> list[tuple[str, str, Entry | None]]:
    """``(path, type, entry)`` for every path that differs, sorted by path."""
    out = []
    for path in sorted(set(left) | set(right)):
        a, b = left.get(path), right.get(path)
        if a is None and b is not None:
            out.append((path, "added", b))
        elif b is None and a is not None:
            out.append((path, "removed", a))
        elif a is not None and not a.same_content(b):
            out.append((path, "changed", b))
    return out


class LakeFSState:
    """The whole server state and the operations on it (one lock: requests are short)."""

    def __init__(self, settings: Settings, import_step_delay: float = 0.0):
        self.lock = threading.RLock()
        self.repos: dict[str, Repo] = {}
        self.imports: dict[str, dict[str, Any]] = {}
        self.s3 = get_client(settings)
        self.import_step_delay = import_step_delay

    # --- lookups ---------------------------------------------------------------------------

    def repo(self, name: str) -> Repo:
        try:
            return self.repos[name]
        except KeyError:
            raise ApiError(HTTPStatus.NOT_FOUND, f"repository not found: {name}") from None

    def branch(self, repo: Repo, name: str) -> Branch:
        try:
            return repo.branches[name]
        except KeyError:
            raise ApiError(HTTPStatus.NOT_FOUND, f"branch not found: {name}") from None

    def resolve(self, repo: Repo, ref: str) -> tuple[Commit, dict[str, Entry | None] | None]:
        """A ref expression -> (commit, staging to overlay or None)."""
        match = re.fullmatch(r"(.*?)((?:[~^]\d*)*)(@?)", ref)
        base, walk, committed_only = match.group(1), match.group(2), bool(match.group(3))
        staging = None
        if base in repo.branches:
            commit = repo.commits[repo.branches[base].commit_id]
            staging = repo.branches[base].staging
        elif base in repo.tags:
            commit = repo.commits[repo.tags[base]]
        else:
            hits = [c for cid, c in repo.commits.items() if len(base) >= 6 and cid.startswith(base)]
            if len(hits) != 1:
                raise ApiError(HTTPStatus.NOT_FOUND, f"reference not found: {ref}")
            commit = hits[0]
        for op, count in re.findall(r"([~^])(\d*)", walk):
            n = int(count or 1)
            staging = None
            if op == "~":
                for _ in range(n):
                    commit = self._parent(repo, commit, 0, ref)
            else:
                commit = self._parent(repo, commit, n - 1, ref)
        return commit, (None if committed_only else staging)

    def _parent(self, repo: Repo, commit: Commit, index: int, ref: str) -> Commit:
        if index >= len(commit.parents):
            raise ApiError(HTTPStatus.NOT_FOUND, f"reference not found: {ref} (no such parent)")
        return repo.commits[commit.parents[index]]

    def ancestors(self, repo: Repo, commit_id: str) -> dict[str, int]:
        """Every ancestor (itself included) with its distance."""
        seen, frontier, depth = {}, [commit_id], 0
        while frontier:
            nxt = []
            for cid in frontier:
                if cid not in seen:
                    seen[cid] = depth
                    nxt.extend(repo.commits[cid].parents)
            frontier, depth = nxt, depth + 1
        return seen

    def merge_base(self, repo: Repo, a: str, b: str) -> Commit | None:
        left, right = self.ancestors(repo, a), self.ancestors(repo, b)
        common = [cid for cid in left if cid in right]
        if not common:
            return None
        return repo.commits[max(common, key=lambda cid: (repo.commits[cid].generation, -left[cid] - right[cid]))]

    # --- writes ----------------------------------------------------------------------------

    def new_commit(self, repo: Repo, parents: list[str], message: str, metadata: dict[str, str] | None,
                   tree: dict[str, Entry], date: int | None = None) -> Commit:
        created = int(date or time.time())
        generation = 1 + max((repo.commits[p].generation for p in parents), default=0)
        seed = json.dumps([parents, message, metadata, created, uuid.uuid4().hex, sorted(tree)]).encode()
        commit = Commit(
            id=hashlib.sha256(seed).hexdigest(), parents=tuple(parents), message=message,
            metadata=MappingProxyType(dict(metadata or {})), creation_date=created, generation=generation,
            tree=MappingProxyType(dict(tree)),
        )
        repo.commits[commit.id] = commit
        return commit

    def claim_namespace(self, namespace: str) -> None:
        """lakeFS's check of a new repository's storage namespace (``ensureStorageNamespace``)."""
        import io

        from minio.error import S3Error

        bucket, prefix = split_s3_uri(namespace.rstrip("/"))
        refused = "failed to create repository: "
        for marker in (ROOT_MARKER, NAMESPACE_MARKER):
            key = f"{prefix.strip('/')}/{marker}".lstrip("/")
            try:
                self.s3.stat_object(bucket, key)
            except S3Error as err:
                if err.code not in ("NoSuchKey", "NoSuchBucket"):
                    raise ApiError(HTTPStatus.BAD_REQUEST, refused + "failed to access storage") from None
                continue
            raise ApiError(HTTPStatus.BAD_REQUEST, f"{refused}found lakeFS objects in the storage "
                                                   f"({namespace}) key({marker}): storage namespace already in use")
        try:
            self.s3.put_object(bucket, key, io.BytesIO(NAMESPACE_MARKER_DATA), len(NAMESPACE_MARKER_DATA))
        except S3Error:
            raise ApiError(HTTPStatus.BAD_REQUEST, refused + "failed to access storage") from None

    def store_bytes(self, repo: Repo, data: bytes, content_type: str) -> tuple[str, str]:
        """Write bytes under the repository's storage namespace; returns (physical address, md5)."""
        import io

        bucket, prefix = split_s3_uri(repo.storage_namespace)
        key = f"{prefix.strip('/')}/data/{uuid.uuid4().hex}".lstrip("/")
        self.s3.put_object(bucket, key, io.BytesIO(data), len(data), content_type=content_type)
        return f"s3://{bucket}/{key}", hashlib.md5(data).hexdigest()  # noqa: S324 - S3 ETag, not security

    def read_bytes(self, entry: Entry) -> bytes:
        bucket, key = split_s3_uri(entry.physical_address)
        response = self.s3.get_object(bucket, key)
        try:
            return response.read()
        finally:
            response.close()
            response.release_conn()

    def run_import(self, import_id: str, repo: Repo, branch_name: str, creation: models.ImportCreation) -> None:
        """List the sources in the object store and commit pointers to them (no bytes copied)."""
        record = self.imports[import_id]
        try:
            staged: dict[str, Entry] = {}
            for location in creation.paths:
                bucket, key = split_s3_uri(location.path)
                if location.type == "object":
                    stat = self.s3.stat_object(bucket, key)
                    sources = [(key, stat)]
                else:
                    sources = [(o.object_name, o) for o in self.s3.list_objects(bucket, prefix=key, recursive=True)]
                for name, obj in sources:
                    path = location.destination if location.type == "object" else location.destination + name[len(key):]
                    staged[path] = Entry(f"s3://{bucket}/{name}", (obj.etag or "").strip('"'), int(obj.size or 0),
                                         int(obj.last_modified.timestamp()) if obj.last_modified else int(time.time()))
                    if len(staged) % 1000 == 0:
                        record["ingested"] = len(staged)
                        time.sleep(self.import_step_delay)
                record["ingested"] = len(staged)
                time.sleep(self.import_step_delay)
            with self.lock:
                if record.get("cancelled"):  # lakeFS commits nothing for a cancelled import
                    return
                branch = self.branch(repo, branch_name)
                head = repo.commits[branch.commit_id]
                tree = dict(head.tree)
                for location in creation.paths:  # an import replaces what its destinations held
                    if location.type == "common_prefix":
                        for path in [p for p in tree if p.startswith(location.destination)]:
                            del tree[path]
                tree.update(staged)
                # an import always commits, changed or not, and records itself as a source-wins merge
                metadata = {**(creation.commit.metadata or {}), MERGE_STRATEGY_KEY: "source-wins"}
                commit = self.new_commit(repo, [head.id], creation.commit.message or "Import objects",
                                         metadata, tree)
                branch.commit_id = commit.id
                record.update(commit=commit, completed=True)
        except ApiError as err:
            record["error"] = err.message
        except Exception as err:  # the object store said no: report it the way lakeFS does
            record["error"] = f"import failed: {err}"
        record["updated"] = datetime.now(UTC)


def valid_tag(tag: str) -> bool:
    """lakeFS's tag rules (git's ref format, ``~`` allowed)."""
    return bool(tag) and tag != "@" and not tag.endswith((".", ".lock")) \
        and not any(bad in tag for bad in ("..", "/", "@{")) and not any(c in "^:?*[\\" for c in tag) \
        and not any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in tag)


def paginate(items: list[Any], key: Callable[[Any], str], query: dict[str, str]) -> tuple[list[Any], models.Pagination]:
    """One page after ``after`` of at most ``amount`` items (the API's pagination)."""
    after = query.get("after", "")
    amount = min(int(query.get("amount") or 100), 1000)
    rest = items[bisect.bisect_right([key(item) for item in items], after):] if after else items  # items are sorted
    page = rest[:amount]
    more = len(rest) > amount
    return page, models.Pagination(has_more=more, next_offset=key(page[-1]) if more else "",
                                   results=len(page), max_per_page=amount)


def object_stats(path: str, entry: Entry) -> models.ObjectStats:
    return models.ObjectStats(path=path, path_type="object", physical_address=entry.physical_address,
                              checksum=entry.checksum, size_bytes=entry.size, mtime=entry.mtime,
                              content_type=entry.content_type, metadata=dict(entry.metadata))


def group_prefixes(paths: list[str], prefix: str, delimiter: str) -> list[tuple[str, bool]]:
    """``(name, is_prefix)`` for a delimited listing: objects plus rolled-up common prefixes."""
    out: dict[str, bool] = {}
    for path in paths:
        rest = path[len(prefix):]
        if delimiter and delimiter in rest:
            out[prefix + rest.split(delimiter, 1)[0] + delimiter] = True
        else:
            out[path] = False
    return sorted(out.items())


class Handler(BaseHTTPRequestHandler):
    """Routes ``/api/v1/...`` requests to the state's operations."""

    protocol_version = "HTTP/1.1"  # keep-alive, as the SDK's urllib3 pool expects
    server: LakeFSServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    # --- plumbing ----------------------------------------------------------------------------

    def _record(self, status: int, content_type: str, body: bytes) -> None:
        if self.server.exchanges is not None:
            self.server.exchanges.append(Exchange(self.command, urllib.parse.urlsplit(self.path).path, int(status),
                                                  content_type, body if content_type == "application/json" else None))

    def _send(self, status: int, body: bytes = b"", content_type: str = "application/json",
              headers: dict[str, str] | None = None) -> None:
        self._record(status, content_type, body)
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, model: Any) -> None:
        self._send(status, json.dumps(SERIALISER.sanitize_for_serialization(model)).encode())

    def _body(self) -> bytes:
        if self._read_body is not None:
            return self._read_body
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():  # the SDK streams file uploads
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
                pass
            self._read_body = b"".join(chunks)
        else:
            length = int(self.headers.get("Content-Length") or 0)
            self._read_body = self.rfile.read(length) if length else b""
        return self._read_body

    def _model(self, cls: type) -> Any:
        try:
            return cls.from_json(self._body().decode() or "{}")
        except Exception as err:
            raise ApiError(HTTPStatus.BAD_REQUEST, f"invalid request body: {err}") from None

    def _authorised(self) -> bool:
        header = self.headers.get("Authorization", "")
        if not header.startswith("Basic "):
            return False
        try:
            user, _, password = base64.b64decode(header[6:]).decode().partition(":")
        except ValueError:
            return False
        return (user, password) == (self.server.access_key, self.server.secret_key)

    def _dispatch(self) -> None:
        self._read_body: bytes | None = None
        url = urllib.parse.urlsplit(self.path)
        query = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query, keep_blank_values=True).items()}
        route = url.path[len(API):] if url.path.startswith(API) else None
        try:
            if route is None:
                raise ApiError(HTTPStatus.NOT_FOUND, "not found")
            if route == "/healthcheck":
                self._send(HTTPStatus.NO_CONTENT)
                return
            if not self._authorised():
                raise ApiError(HTTPStatus.UNAUTHORIZED, "error authenticating request")
            for method, pattern, handler in ROUTES:
                match = pattern.fullmatch(route)
                if method == self.command and match:
                    args = [urllib.parse.unquote(a) for a in match.groups()]
                    if handler in SELF_LOCKING:  # they talk to the object store outside the lock
                        handler(self, self.server.state, query, *args)
                    else:
                        with self.server.state.lock:
                            handler(self, self.server.state, query, *args)
                    return
            raise ApiError(HTTPStatus.NOT_FOUND, f"no such endpoint: {self.command} {route}")
        except ApiError as err:
            self._body()  # an unread request body would be taken for the next request
            self._json(err.status, err.body if err.body is not None else models.Error(message=err.message))
        except Exception as err:  # a bug in the double: say so plainly
            self._json(HTTPStatus.INTERNAL_SERVER_ERROR, models.Error(message=f"test double error: {err!r}"))

    do_GET = do_POST = do_DELETE = do_PUT = do_HEAD = _dispatch

    # --- config, repositories ------------------------------------------------------------------

    def get_config(self, state: LakeFSState, query: dict) -> None:
        storage = models.StorageConfig(
            blockstore_type="s3", blockstore_namespace_example="s3://example-bucket/",
            blockstore_namespace_ValidityRegex="^s3://", pre_sign_support=False, pre_sign_support_ui=False,
            import_support=True, import_validity_regex="^s3://",
        )
        self._json(200, models.Config(version_config=models.VersionConfig(version=self.server.version),
                                      storage_config=storage))

    def create_repository(self, state: LakeFSState, query: dict) -> None:
        body = self._model(models.RepositoryCreation)
        if not NAME_PATTERN.fullmatch(body.name):
            raise ApiError(HTTPStatus.BAD_REQUEST, f"invalid repository name {body.name!r}")
        if body.name in state.repos:  # checked before the namespace, as lakeFS does
            raise ApiError(HTTPStatus.CONFLICT, "error creating repository: not unique")
        state.claim_namespace(body.storage_namespace)
        repo = Repo(body.name, body.storage_namespace, body.default_branch or "main", int(time.time()))
        first = state.new_commit(repo, [], "Repository created", {}, {})
        repo.branches[repo.default_branch] = Branch(first.id)
        state.repos[repo.name] = repo
        self._json(201, repo.model())

    def list_repositories(self, state: LakeFSState, query: dict) -> None:
        repos = sorted((r for r in state.repos.values() if r.name.startswith(query.get("prefix", ""))),
                       key=lambda r: r.name)
        page, pagination = paginate(repos, lambda r: r.name, query)
        self._json(200, models.RepositoryList(pagination=pagination, results=[r.model() for r in page]))

    def get_repository(self, state: LakeFSState, query: dict, name: str) -> None:
        self._json(200, state.repo(name).model())

    def get_repository_metadata(self, state: LakeFSState, query: dict, name: str) -> None:
        state.repo(name)
        self._json(200, {})

    def delete_repository(self, state: LakeFSState, query: dict, name: str) -> None:
        state.repo(name)
        del state.repos[name]
        self._send(HTTPStatus.NO_CONTENT)

    # --- branches, commits, tags ---------------------------------------------------------------

    def create_branch(self, state: LakeFSState, query: dict, name: str) -> None:
        repo = state.repo(name)
        body = self._model(models.BranchCreation)
        if not BRANCH_PATTERN.fullmatch(body.name):
            raise ApiError(HTTPStatus.BAD_REQUEST, f"invalid branch name {body.name!r}")
        if body.name in repo.branches:
            raise ApiError(HTTPStatus.CONFLICT, f"branch already exists: {body.name}")
        commit, _ = state.resolve(repo, body.source)
        repo.branches[body.name] = Branch(commit.id)
        self._send(201, commit.id.encode(), "text/html")

    def list_branches(self, state: LakeFSState, query: dict, name: str) -> None:
        repo = state.repo(name)
        names = sorted(b for b in repo.branches if b.startswith(query.get("prefix", "")))
        page, pagination = paginate(names, str, query)
        refs = [models.Ref(id=b, commit_id=repo.branches[b].commit_id) for b in page]
        self._json(200, models.RefList(pagination=pagination, results=refs))

    def get_branch(self, state: LakeFSState, query: dict, name: str, branch: str) -> None:
        self._json(200, models.Ref(id=branch, commit_id=state.branch(state.repo(name), branch).commit_id))

    def delete_branch(self, state: LakeFSState, query: dict, name: str, branch: str) -> None:
        repo = state.repo(name)
        state.branch(repo, branch)
        if branch == repo.default_branch:
            raise ApiError(HTTPStatus.FORBIDDEN, "cannot delete the repository's default branch")
        del repo.branches[branch]
        self._send(HTTPStatus.NO_CONTENT)

    def commit(self, state: LakeFSState, query: dict, name: str, branch_name: str) -> None:
        repo = state.repo(name)
        branch = state.branch(repo, branch_name)
        body = self._model(models.CommitCreation)
        head = repo.commits[branch.commit_id]
        tree = overlay(head, branch.staging)
        if not tree_diff(dict(head.tree), tree) and not body.allow_empty:
            raise ApiError(HTTPStatus.BAD_REQUEST, "commit: no changes")
        commit = state.new_commit(repo, [head.id], body.message, body.metadata, tree, body.var_date)
        branch.commit_id, branch.staging = commit.id, {}
        self._json(201, commit.model())

    def get_commit(self, state: LakeFSState, query: dict, name: str, ref: str) -> None:
        commit, _ = state.resolve(state.repo(name), ref)
        self._json(200, commit.model())

    def log_commits(self, state: LakeFSState, query: dict, name: str, ref: str) -> None:
        repo = state.repo(name)
        commit, _ = state.resolve(repo, ref)
        history = [repo.commits[cid] for cid in state.ancestors(repo, commit.id)]
        history.sort(key=lambda c: (c.generation, c.creation_date), reverse=True)
        after = query.get("after", "")
        if after:  # commit ids aren't ordered: "after" means after that commit in this log
            ids = [c.id for c in history]
            history = history[ids.index(after) + 1:] if after in ids else []
        amount = min(int(query.get("amount") or 100), 1000)
        page, more = history[:amount], len(history) > amount
        pagination = models.Pagination(has_more=more, next_offset=page[-1].id if more else "",
                                       results=len(page), max_per_page=amount)
        self._json(200, models.CommitList(pagination=pagination, results=[c.model() for c in page]))

    def create_tag(self, state: LakeFSState, query: dict, name: str) -> None:
        repo = state.repo(name)
        body = self._model(models.TagCreation)
        if not valid_tag(body.id):
            raise ApiError(HTTPStatus.BAD_REQUEST, "tag id: validation error")
        if body.id in repo.tags:
            raise ApiError(HTTPStatus.CONFLICT, f"tag already exists: {body.id}")
        commit, _ = state.resolve(repo, body.ref)
        repo.tags[body.id] = commit.id
        self._json(201, models.Ref(id=body.id, commit_id=commit.id))

    def list_tags(self, state: LakeFSState, query: dict, name: str) -> None:
        repo = state.repo(name)
        names = sorted(t for t in repo.tags if t.startswith(query.get("prefix", "")))
        page, pagination = paginate(names, str, query)
        self._json(200, models.RefList(pagination=pagination,
                                       results=[models.Ref(id=t, commit_id=repo.tags[t]) for t in page]))

    def get_tag(self, state: LakeFSState, query: dict, name: str, tag: str) -> None:
        repo = state.repo(name)
        if tag not in repo.tags:
            raise ApiError(HTTPStatus.NOT_FOUND, f"tag not found: {tag}")
        self._json(200, models.Ref(id=tag, commit_id=repo.tags[tag]))

    def delete_tag(self, state: LakeFSState, query: dict, name: str, tag: str) -> None:
        repo = state.repo(name)
        if repo.tags.pop(tag, None) is None:
            raise ApiError(HTTPStatus.NOT_FOUND, f"tag not found: {tag}")
        self._send(HTTPStatus.NO_CONTENT)

    # --- diff and merge ------------------------------------------------------------------------

    def _diff_response(self, changes: list[tuple[str, str, Entry | None]], query: dict) -> None:
        prefix, delimiter = query.get("prefix", ""), query.get("delimiter", "")
        changes = [c for c in changes if c[0].startswith(prefix)]
        kinds = {path: (kind, entry) for path, kind, entry in changes}
        rows = []
        for path, is_prefix in group_prefixes([c[0] for c in changes], prefix, delimiter):
            if is_prefix:
                rows.append(models.Diff(type="changed", path=path, path_type="common_prefix"))
            else:
                kind, entry = kinds[path]
                rows.append(models.Diff(type=kind, path=path, path_type="object",
                                        size_bytes=entry.size if entry else None))
        page, pagination = paginate(rows, lambda d: d.path, query)
        self._json(200, models.DiffList(pagination=pagination, results=page))

    def diff_refs(self, state: LakeFSState, query: dict, name: str, left: str, right: str) -> None:
        repo = state.repo(name)
        left_commit, _ = state.resolve(repo, left)
        right_commit, _ = state.resolve(repo, right)
        base = left_commit
        if query.get("type", "three_dot") == "three_dot":
            base = state.merge_base(repo, left_commit.id, right_commit.id) or left_commit
        self._diff_response(tree_diff(dict(base.tree), dict(right_commit.tree)), query)

    def diff_branch(self, state: LakeFSState, query: dict, name: str, branch_name: str) -> None:
        repo = state.repo(name)
        branch = state.branch(repo, branch_name)
        head = repo.commits[branch.commit_id]
        self._diff_response(tree_diff(dict(head.tree), overlay(head, branch.staging)), query)

    def merge(self, state: LakeFSState, query: dict, name: str, source: str, destination: str) -> None:
        repo = state.repo(name)
        body = self._model(models.Merge)
        if body.strategy not in MERGE_STRATEGIES:
            raise ApiError(HTTPStatus.BAD_REQUEST, "invalid merge strategy")
        dest = state.branch(repo, destination)
        if dest.staging:
            raise ApiError(HTTPStatus.BAD_REQUEST, f"branch {destination} has uncommitted changes")
        src_commit, _ = state.resolve(repo, source)
        dest_commit = repo.commits[dest.commit_id]
        base = state.merge_base(repo, src_commit.id, dest_commit.id)
        base_tree = dict(base.tree) if base else {}
        if src_commit.id in state.ancestors(repo, dest_commit.id) and not body.allow_empty:
            raise ApiError(HTTPStatus.BAD_REQUEST, "no changes")
        tree, conflicts = dict(dest_commit.tree), []
        for path, _, _ in tree_diff(base_tree, dict(src_commit.tree)):
            b, s, d = base_tree.get(path), src_commit.tree.get(path), dest_commit.tree.get(path)
            dest_changed = not ((b is None and d is None) or (b is not None and b.same_content(d)))
            same = (s is None and d is None) or (s is not None and s.same_content(d))
            if dest_changed and not same:
                if body.strategy == "dest-wins":
                    continue
                if body.strategy != "source-wins":
                    conflicts.append(path)
                    continue
            if s is None:
                tree.pop(path, None)
            else:
                tree[path] = s
        if conflicts:
            # lakeFS answers a conflict with an empty MergeResult (its API declares that schema for 409)
            raise ApiError(HTTPStatus.CONFLICT, f"conflict found: {', '.join(conflicts[:5])}",
                           models.MergeResult(reference=""))
        parents = [dest_commit.id] if body.squash_merge else [dest_commit.id, src_commit.id]
        message = body.message or f"Merge '{source}' into '{destination}'"
        metadata = {**(body.metadata or {}), MERGE_STRATEGY_KEY: MERGE_STRATEGIES[body.strategy]}
        commit = state.new_commit(repo, parents, message, metadata, tree)
        dest.commit_id = commit.id
        self._json(200, models.MergeResult(reference=commit.id))

    # --- objects -------------------------------------------------------------------------------

    def _entry(self, state: LakeFSState, name: str, ref: str, path: str) -> Entry:
        with state.lock:
            repo = state.repo(name)
            commit, staging = state.resolve(repo, ref)
            # one lookup, not a copy of the whole tree: a full-size read loop makes 60,000 of these
            entry = staging[path] if staging and path in staging else commit.tree.get(path)
        if entry is None:
            raise ApiError(HTTPStatus.NOT_FOUND, f"object not found: {path}")
        return entry

    def upload_object(self, state: LakeFSState, query: dict, name: str, branch_name: str) -> None:
        path = query.get("path", "")
        data, content_type = self._body(), self.headers.get("Content-Type", "application/octet-stream")
        with state.lock:
            repo = state.repo(name)
            state.branch(repo, branch_name)
        if not path:
            raise ApiError(HTTPStatus.BAD_REQUEST, "missing path")
        if content_type.startswith("multipart/form-data"):
            data, content_type = self._multipart_content(data, content_type)
        metadata = tuple(sorted((k.lower()[len(METADATA_HEADER):], v) for k, v in self.headers.items()
                                if k.lower().startswith(METADATA_HEADER)))
        address, checksum = state.store_bytes(repo, data, content_type)
        entry = Entry(address, checksum, len(data), int(time.time()), content_type, metadata)
        with state.lock:
            branch = state.branch(repo, branch_name)
            if self.headers.get("If-None-Match") == "*" and path in overlay(repo.commits[branch.commit_id],
                                                                             branch.staging):
                raise ApiError(HTTPStatus.PRECONDITION_FAILED, "object already exists")
            branch.staging[path] = entry
        self._json(201, object_stats(path, entry))

    @staticmethod
    def _multipart_content(data: bytes, content_type: str) -> tuple[bytes, str]:
        message = email.parser.BytesParser().parsebytes(b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + data)
        for part in message.walk():
            if part.get_param("name", header="content-disposition") == "content":
                return part.get_payload(decode=True) or b"", part.get_content_type()
        raise ApiError(HTTPStatus.BAD_REQUEST, "multipart upload without a 'content' part")

    def get_object(self, state: LakeFSState, query: dict, name: str, ref: str) -> None:
        entry = self._entry(state, name, ref, query.get("path", ""))
        headers = {"ETag": f'"{entry.checksum}"', "Last-Modified": time.strftime(
            "%a, %d %b %Y %H:%M:%S GMT", time.gmtime(entry.mtime))}
        if self.command == "HEAD":
            self._record(200, entry.content_type, b"")
            self.send_response(200)
            self.send_header("Content-Length", str(entry.size))
            for key, value in headers.items():
                self.send_header(key, value)
            self.end_headers()
            return
        data = state.read_bytes(entry)
        wanted = re.fullmatch(r"bytes=(\d*)-(\d*)", self.headers.get("Range", "") or "")
        if not wanted:
            self._send(200, data, entry.content_type, headers)
            return
        start = int(wanted.group(1) or 0)
        end = min(int(wanted.group(2)) if wanted.group(2) else len(data) - 1, len(data) - 1)
        if start >= len(data):
            self._send(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE,
                       json.dumps({"message": "invalid range"}).encode(),
                       headers={"Content-Range": f"bytes */{len(data)}"})
            return
        headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
        self._send(206, data[start:end + 1], entry.content_type, headers)

    def stat_object(self, state: LakeFSState, query: dict, name: str, ref: str) -> None:
        path = query.get("path", "")
        self._json(200, object_stats(path, self._entry(state, name, ref, path)))

    def list_objects(self, state: LakeFSState, query: dict, name: str, ref: str) -> None:
        repo = state.repo(name)
        commit, staging = state.resolve(repo, ref)
        tree = overlay(commit, staging)
        prefix = query.get("prefix", "")
        paths = sorted(p for p in tree if p.startswith(prefix))
        names, pagination = paginate(group_prefixes(paths, prefix, query.get("delimiter", "")), lambda r: r[0], query)
        page = [models.ObjectStats(path=path, path_type="common_prefix", physical_address="", checksum="", mtime=0)
                if is_prefix else object_stats(path, tree[path]) for path, is_prefix in names]  # this page only
        self._json(200, models.ObjectStatsList(pagination=pagination, results=page))

    def delete_object(self, state: LakeFSState, query: dict, name: str, branch_name: str) -> None:
        repo = state.repo(name)
        state.branch(repo, branch_name).staging[query.get("path", "")] = None
        self._send(HTTPStatus.NO_CONTENT)

    def delete_objects(self, state: LakeFSState, query: dict, name: str, branch_name: str) -> None:
        repo = state.repo(name)
        branch = state.branch(repo, branch_name)
        for path in self._model(models.PathList).paths:
            branch.staging[path] = None
        self._json(200, models.ObjectErrorList(errors=[]))

    # --- import --------------------------------------------------------------------------------

    def import_start(self, state: LakeFSState, query: dict, name: str, branch_name: str) -> None:
        repo = state.repo(name)
        state.branch(repo, branch_name)
        body = self._model(models.ImportCreation)
        import_id = uuid.uuid4().hex
        state.imports[import_id] = {"branch": (name, branch_name), "ingested": 0, "completed": False,
                                    "commit": None, "error": None, "updated": datetime.now(UTC)}
        threading.Thread(target=state.run_import, args=(import_id, repo, branch_name, body), daemon=True).start()
        self._json(202, models.ImportCreationResponse(id=import_id))

    def import_cancel(self, state: LakeFSState, query: dict, name: str, branch_name: str) -> None:
        record = state.imports.get(query.get("id", ""))
        if record is None or record["branch"] != (name, branch_name):
            raise ApiError(HTTPStatus.NOT_FOUND, "import not found")
        with state.lock:
            if record["completed"]:
                raise ApiError(HTTPStatus.CONFLICT, "import already completed")
            record.update(cancelled=True, error="import canceled", updated=datetime.now(UTC))
        self._send(HTTPStatus.NO_CONTENT)

    def import_status(self, state: LakeFSState, query: dict, name: str, branch_name: str) -> None:
        record = state.imports.get(query.get("id", ""))
        if record is None or record["branch"] != (name, branch_name):
            raise ApiError(HTTPStatus.NOT_FOUND, "import not found")
        commit = record["commit"]
        self._json(200, models.ImportStatus(
            completed=record["completed"], update_time=record["updated"], ingested_objects=record["ingested"],
            metarange_id=commit.meta_range_id if commit else None, commit=commit.model() if commit else None,
            error=models.Error(message=record["error"]) if record["error"] else None,
        ))


_REPO = r"/repositories/([^/]+)"
ROUTES: list[tuple[str, re.Pattern, Callable]] = [
    (method, re.compile(pattern), handler) for method, pattern, handler in [
        ("GET", r"/config", Handler.get_config),
        ("POST", r"/repositories", Handler.create_repository),
        ("GET", r"/repositories", Handler.list_repositories),
        ("GET", _REPO, Handler.get_repository),
        ("DELETE", _REPO, Handler.delete_repository),
        ("GET", _REPO + r"/metadata", Handler.get_repository_metadata),
        ("POST", _REPO + r"/branches", Handler.create_branch),
        ("GET", _REPO + r"/branches", Handler.list_branches),
        ("GET", _REPO + r"/branches/([^/]+)", Handler.get_branch),
        ("DELETE", _REPO + r"/branches/([^/]+)", Handler.delete_branch),
        ("GET", _REPO + r"/branches/([^/]+)/diff", Handler.diff_branch),
        ("POST", _REPO + r"/branches/([^/]+)/commits", Handler.commit),
        ("POST", _REPO + r"/branches/([^/]+)/objects", Handler.upload_object),
        ("DELETE", _REPO + r"/branches/([^/]+)/objects", Handler.delete_object),
        ("POST", _REPO + r"/branches/([^/]+)/objects/delete", Handler.delete_objects),
        ("POST", _REPO + r"/branches/([^/]+)/import", Handler.import_start),
        ("GET", _REPO + r"/branches/([^/]+)/import", Handler.import_status),
        ("DELETE", _REPO + r"/branches/([^/]+)/import", Handler.import_cancel),
        ("GET", _REPO + r"/commits/([^/]+)", Handler.get_commit),
        ("GET", _REPO + r"/refs/([^/]+)/commits", Handler.log_commits),
        ("GET", _REPO + r"/refs/([^/]+)/diff/([^/]+)", Handler.diff_refs),
        ("POST", _REPO + r"/refs/([^/]+)/merge/([^/]+)", Handler.merge),
        ("GET", _REPO + r"/refs/([^/]+)/objects", Handler.get_object),
        ("HEAD", _REPO + r"/refs/([^/]+)/objects", Handler.get_object),
        ("GET", _REPO + r"/refs/([^/]+)/objects/stat", Handler.stat_object),
        ("GET", _REPO + r"/refs/([^/]+)/objects/ls", Handler.list_objects),
        ("POST", _REPO + r"/tags", Handler.create_tag),
        ("GET", _REPO + r"/tags", Handler.list_tags),
        ("GET", _REPO + r"/tags/([^/]+)", Handler.get_tag),
        ("DELETE", _REPO + r"/tags/([^/]+)", Handler.delete_tag),
    ]
]


SERIALISER = lakefs_sdk.ApiClient()  # the SDK's own JSON encoding of its models (aliases, dates)
SELF_LOCKING = {Handler.get_object, Handler.upload_object}


class LakeFSServer(ThreadingHTTPServer):
    """The double's HTTP server; ``with LakeFSServer(settings) as server:`` runs it in a thread."""

    daemon_threads = True

    def __init__(self, settings: Settings, access_key: str = "AKIAIOSFOLKFSSAMPLES",
                 secret_key: str = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", port: int = 0,
                 import_step_delay: float = 0.0, record: bool = False):
        super().__init__(("127.0.0.1", port), Handler)
        self.exchanges: list[Exchange] | None = [] if record else None
        self.state = LakeFSState(settings, import_step_delay)
        self.access_key, self.secret_key = access_key, secret_key
        self.version = f"{lakefs_sdk.__version__}-test-double"
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:PORT`` (the SDK adds ``/api/v1``)."""
        return f"http://127.0.0.1:{self.server_address[1]}"

    def env(self) -> dict[str, str]:
        """The ``LAKEFS_*`` variables that point ``helpers.settings`` at this server."""
        return {"LAKEFS_ENDPOINT": self.endpoint, "LAKEFS_ACCESS_KEY_ID": self.access_key,
                "LAKEFS_SECRET_ACCESS_KEY": self.secret_key}

    def __enter__(self) -> LakeFSServer:
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()
