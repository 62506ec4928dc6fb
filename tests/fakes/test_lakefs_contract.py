"""The lakeFS test double answers as lakeFS's API says it must (the contract the SDK was generated from).

A recording double serves one pass over everything ``helpers`` and notebook 06
ask of lakeFS, plus the refusals they must understand. Every exchange is then
checked against the pinned ``lakefs_sdk``: the status must be one the
operation declares, and the body must validate strictly as the model declared
for that status, with no field the model does not know. Where the SDK's map is
empty (operations without a body), lakeFS's ``api/swagger.yml`` is the
reference. The pass must touch every endpoint the double serves, so an
endpoint added for ``helpers`` can't go unchecked.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import json
import pkgutil
import re
import uuid

import lakefs
import lakefs_sdk
import pytest
from pydantic.v1 import BaseModel

from helpers import lakefs_experiments as exp
from helpers import versioning
from tests.fakes.lakefs_double import API, ROUTES, LakeFSServer
from tests.suite.mnist_buckets import uploaded_bucket

# lakeFS's swagger.yml for the operations whose SDK map is empty (no response body on success)
NO_BODY = {"204": None, "400": "Error", "401": "Error", "403": "Error", "404": "Error"}
SWAGGER_WHERE_SDK_IS_SILENT = {
    "delete_repository": NO_BODY, "delete_branch": NO_BODY, "delete_object": NO_BODY, "delete_tag": NO_BODY,
    "import_cancel": {**NO_BODY, "409": "Error"},  # lakeFS swagger: 204, or an Error (401, 403, 404, 409, 420)
    "head_object": dict.fromkeys(("200", "206", "400", "401", "404", "410", "416")),
}


@dataclasses.dataclass(frozen=True)
class Operation:
    """One generated SDK method: its HTTP method, path template and response models by status."""

    name: str
    method: str
    template: str
    responses: dict[str, str | None]

    def matches(self, method: str, path: str) -> bool:
        pattern = re.sub(r"\\\{\w+\\\}", "[^/]+", re.escape(self.template))
        return method == self.method and re.fullmatch(pattern, path) is not None


def sdk_operations() -> list[Operation]:
    """Every operation of ``lakefs_sdk``, read from its generated ``*_with_http_info`` methods."""
    operations = []
    for module_info in pkgutil.iter_modules(lakefs_sdk.api.__path__):
        module = importlib.import_module(f"lakefs_sdk.api.{module_info.name}")
        for function in ast.walk(ast.parse(inspect.getsource(module))):
            if not (isinstance(function, ast.FunctionDef) and function.name.endswith("_with_http_info")):
                continue
            responses, call = None, None
            for node in ast.walk(function):
                if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "_response_types_map":
                    responses = ast.literal_eval(node.value)
                if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "call_api":
                    call = (node.args[0].value, node.args[1].value)
            name = function.name.removesuffix("_with_http_info")
            responses = responses or SWAGGER_WHERE_SDK_IS_SILENT.get(name, {})
            operations.append(Operation(name, call[1], call[0], responses))
    return operations


def operation_for(operations: list[Operation], method: str, path: str) -> Operation:
    """The operation a request calls; where templates overlap, the one with the most literal text."""
    found = [op for op in operations if op.matches(method, path)]
    assert found, f"{method} {path} is no lakeFS API operation"
    return max(found, key=lambda op: len(re.sub(r"\{\w+\}", "", op.template)))


def unknown_fields(model: type[BaseModel], data, where: str) -> list[str]:
    """Keys in ``data`` that ``model`` (and its nested models) does not declare."""
    if not isinstance(data, dict):
        return []
    fields = {field.alias: field for field in model.__fields__.values()}
    out = [f"{where}.{key}" for key in data if key not in fields]
    for key, value in data.items():
        inner = getattr(fields.get(key), "type_", None)
        if inspect.isclass(inner) and issubclass(inner, BaseModel):
            for i, item in enumerate(value if isinstance(value, list) else [value]):
                out += unknown_fields(inner, item, f"{where}.{key}[{i}]")
    return out


def violations(operation: Operation, status: int, body: bytes | None, content_type: str) -> list[str]:
    """What is wrong with one response, measured against the operation's declared responses."""
    declared = operation.responses
    if str(status) not in declared:
        return [f"status {status} is not one {operation.name} declares ({sorted(declared)})"]
    model_name = declared[str(status)]
    if model_name in (None, "bytearray", "str"):
        return []
    if content_type != "application/json" or body is None:
        return [f"{operation.name} {status}: {model_name} expected, got {content_type}"]
    data = json.loads(body)
    if model_name.startswith("Dict[str, str]"):
        ok = isinstance(data, dict) and all(isinstance(v, str) for v in data.values())
        return [] if ok else [f"{operation.name} {status}: not a map of strings"]
    model = getattr(lakefs_sdk.models, model_name)
    try:
        model.from_dict(data)  # the SDK's own strict validation
    except Exception as err:
        return [f"{operation.name} {status}: not a valid {model_name}: {err}"]
    return [f"{operation.name} {status}: no field {key} in the API"
            for key in unknown_fields(model, data, model_name)]


# --- the pass over what helpers and notebook 06 ask of lakeFS ---------------------------

def refused(call, exception=lakefs.exceptions.LakeFSException) -> None:
    with pytest.raises(exception):
        call()


def exercise(settings, source_bucket: str) -> None:
    """Everything ``helpers`` and notebook 06 do with lakeFS, then every refusal they handle."""
    client = versioning.connect(settings)
    name = f"c-{uuid.uuid4().hex[:10]}"
    repo = exp.ensure_repository(client, name, settings)
    exp.ensure_repository(client, name, settings)  # exists: 409, then read back
    refused(lambda: exp.import_from_bucket(repo, source_bucket, branch="cancelled", settings=settings,
                                          timeout=0),
            versioning.LakeFSError)  # past its deadline: cancelled
    imported = exp.import_from_bucket(repo, source_bucket, settings=settings)
    assert exp.import_from_bucket(repo, source_bucket, settings=settings).reused
    first = exp.list_paths(repo, imported.commit_id, "train/")[0]
    repo.ref(imported.commit_id).object(first).stat()
    assert repo.ref(imported.commit_id).object(first).exists()
    assert exp.commit_pointers(repo, imported.commit_id)[0] == source_bucket  # listed with physical addresses
    grid, start = [{"optimizer": "sgd", "epochs": 1}], exp.DEFAULT_PARAMS
    results = exp.run_experiments(repo, grid, start, "contract", settings, 0)
    table = exp.compare_experiments(repo, [r.branch for r in results])
    exp.evaluate_commit(repo, table.commit_id[0])
    list(repo.ref(exp.INGEST_BRANCH).diff(repo.ref(results[0].branch)))
    promotion = exp.promote(repo, results[0].branch, table.commit_id[0])
    list(repo.ref(promotion.tag).log(max_amount=3))
    exp.reproduce(repo, results[0].commit_id, tolerance=1.0, settings=settings)
    exp.run_experiments(repo, grid, start, "contract", settings, 0)  # replaces the branch

    scratch = repo.branch("scratch").create(imported.commit_id)
    scratch.object("a.txt").upload("a", mode="w", pre_sign=False)
    list(scratch.uncommitted())
    scratch.object("a.txt").delete()
    scratch.delete_objects([first])
    assert scratch.commit("scratch changes").get_commit().id == scratch.head.get_commit().id
    assert [r.id for r in lakefs.repositories(client, prefix=name)] == [name]
    assert repo.metadata == {}
    repo.tag("scratch-tag").create(imported.commit_id)
    list(repo.tags())
    assert client.sdk_client.tags_api.get_tag(name, "scratch-tag").commit_id == imported.commit_id
    repo.tag("scratch-tag").delete()
    for side, text in (("notes-a", "a"), ("notes-b", "b")):  # notebook 06's exercise 3: a conflict, then resolved
        branch = repo.branch(side).create("scratch")
        branch.object("notes.txt").upload(text, mode="w", pre_sign=False)
        branch.commit(f"notes from {side}")
    repo.branch("notes-a").merge_into(scratch)
    refused(lambda: repo.branch("notes-b").merge_into(scratch), lakefs.exceptions.ConflictException)
    repo.branch("notes-b").merge_into(scratch, strategy="source-wins")
    assert exp.read_bytes(repo, "scratch", "notes.txt") == b"b"

    refused(lambda: lakefs.repository("no-such-repository", client=client).properties)
    refused(lambda: repo.branch("scratch").create(imported.commit_id))
    refused(lambda: repo.branch("not ascii ä").create(imported.commit_id))
    refused(lambda: repo.branch(results[0].branch).merge_into("scratch", strategy="mine-wins"))
    refused(lambda: repo.tag(promotion.tag).create(imported.commit_id))
    refused(lambda: repo.tag("no/slashes").create(imported.commit_id))
    refused(lambda: repo.branch(repo.properties.default_branch).delete())
    refused(lambda: exp.read_bytes(repo, imported.commit_id, "no/such/object.png"), versioning.LakeFSError)
    refused(lambda: repo.branch("scratch").commit("nothing staged"))
    refused(lambda: versioning.connect(dataclasses.replace(settings, lakefs_secret_key="wrong")),
            versioning.LakeFSAuthError)
    scratch.delete()
    repo.delete()
    refused(lambda: exp.ensure_repository(client, name, settings), versioning.LakeFSError)  # namespace in use


@pytest.fixture(scope="module")
def exchanges(settings, client):
    with uploaded_bucket(client, "contract", 60) as source, LakeFSServer(settings, record=True,
                                                                             import_step_delay=0.2) as server:
        lakefs_settings = dataclasses.replace(settings, lakefs_endpoint=server.endpoint,
                                              lakefs_access_key=server.access_key,
                                              lakefs_secret_key=server.secret_key)
        exercise(lakefs_settings, source)
        return list(server.exchanges)


@pytest.mark.slow
@pytest.mark.lakefs
def test_every_response_of_the_double_is_one_lakefs_declares(exchanges):
    operations = sdk_operations()
    problems, seen = [], set()
    for exchange in exchanges:
        path = exchange.path.removeprefix(API)
        if path == "/healthcheck":
            continue
        operation = operation_for(operations, exchange.method, path)
        seen.add(operation.name)
        problems += [f"{exchange.method} {path}: {v}" for v in
                     violations(operation, exchange.status, exchange.json_body, exchange.content_type)]
    assert not problems, "\n".join(problems[:20])
    statuses = {e.status for e in exchanges}
    assert {200, 201, 202, 204, 400, 401, 403, 404, 409} <= statuses, "successes and refusals were both checked"


@pytest.mark.slow
@pytest.mark.lakefs
def test_the_pass_covers_every_endpoint_the_double_serves(exchanges):
    served = {(method, pattern.pattern) for method, pattern, _ in ROUTES}
    hit = {(method, pattern.pattern) for method, pattern, _ in ROUTES for e in exchanges
           if e.method == method and pattern.fullmatch(e.path.removeprefix(API))}
    assert served == hit, f"never exercised: {sorted(served - hit)}"


def test_the_contract_check_catches_a_wrong_response():
    operations = sdk_operations()
    create = operation_for(operations, "POST", "/repositories")
    assert create.name == "create_repository" and create.responses["201"] == "Repository"
    good = {"id": "r", "creation_date": 1, "default_branch": "main", "storage_namespace": "s3://b/r"}
    assert violations(create, 201, json.dumps(good).encode(), "application/json") == []
    assert "not a valid Repository" in violations(create, 201, json.dumps({**good, "creation_date": "1"}).encode(),
                                                  "application/json")[0]
    assert "no field Repository.extra" in violations(create, 201, json.dumps({**good, "extra": 1}).encode(),
                                          "application/json")[0]
    assert "status 200 is not one" in violations(create, 200, b"{}", "application/json")[0]
    assert operation_for(operations, "GET", "/repositories/r/refs/main/objects/stat").name == "stat_object"
    assert operation_for(operations, "DELETE", "/repositories/r/tags/t").responses == NO_BODY
