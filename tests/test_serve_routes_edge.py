"""Edge cases of the server's routes that the fuzzing found (tests/test_serve_fuzz.py), against two real
``python -m sweep serve`` processes, both with an API key: the tiny RoBERTa classifier (no OpenAI routes) and the
tiny GPT-2 (the OpenAI routes).

- A request for no route is the app's 404 (405: a known path, another method) whatever the key: the key was
  checked before routing, so a POST to an unknown path was a 401 (sweep/serving/api_key.py).
- ``GET /openai/v1/models/NAME`` is the OpenAI model object, as ``GET /openai/v1/models`` lists it: KServe's
  route answered 200 with ``null`` (sweep/serving/routes.py's ``add_openai_model_routes``).
- An OpenAI body without ``"model"`` is a 400 naming the field: KServe looked up a model named None, a 404
  (sweep/serving/openai_model.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sweep.train.tiny_exports import export_tiny_classifier, export_tiny_lm
from tests.helpers.serving import CLASSIFIER_NAME, LM_NAME, Server, serving, start_server

pytest.importorskip("openai")  # the OpenAI routes need vLLM's protocol types, installed with it

KEY = "sk-edge-0123456789abcdef"
BEARER = {"Authorization": f"Bearer {KEY}"}
NO_KEY: dict[str, str] = {}
WRONG_KEY = {"Authorization": "Bearer sk-wrong"}
MALFORMED = {"Authorization": "Basic xyz"}


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Iterator[dict[str, Server]]:
    root = tmp_path_factory.mktemp("routes-edge")
    classifier_dir = export_tiny_classifier(root / "best" / "RTE", cache_dir)
    lm_dir = export_tiny_lm(root / "best" / "wikitext-2", cache_dir)
    started = {
        "classifier": start_server(CLASSIFIER_NAME, classifier_dir, root / "classifier.log", cache_dir,
                                   f"api_key={KEY}", "grpc=false", "log_requests=false"),
        "lm": start_server(LM_NAME, lm_dir, root / "lm.log", cache_dir, "grpc=false", "log_requests=false",
                           "max_output_tokens=4", env={"SWEEP_API_KEY": KEY}),
    }
    with serving(started):
        yield started


def _ask(server: Server, method: str, path: str, headers: dict[str, str], body: Any = None) -> httpx.Response:
    return httpx.request(method, server.url + path.format(name=server.name), headers=headers, json=body, timeout=30)


# ---------------------------------------------------------------------------------------------
# 1. No route: the app's 404 or 405, whatever the key.

NO_ROUTE = [  # (method, path, the app's status)
    ("POST", "/nothing", 404),
    ("POST", "/v2/models/{name}/nothing", 404),
    ("POST", "/v2/models/{name}/infer/extra", 404),
    ("POST", "/openai/v1/nothing", 404),
    ("PUT", "/v2/models/{name}/nothing", 404),
    ("DELETE", "/nothing", 404),
    ("POST", "/v2/health/ready", 405),  # a GET route
    ("PUT", "/v2/models/{name}/infer", 405),  # a POST route asked with another method
]


@pytest.mark.parametrize("kind", ["classifier", "lm"])
@pytest.mark.parametrize(("method", "path", "status"), NO_ROUTE)
def test_no_route_is_the_apps_answer_whatever_the_key(servers: dict[str, Server], kind: str, method: str, path: str,
                                                      status: int) -> None:
    server = servers[kind]
    answers = {name: _ask(server, method, path, headers, {"inputs": []})
               for name, headers in {"no key": NO_KEY, "wrong key": WRONG_KEY, "malformed": MALFORMED,
                                     "the key": BEARER}.items()}
    for name, answer in answers.items():
        assert (answer.status_code, answer.json()) == (status, answers["the key"].json()), (name, answer.text)
        assert "www-authenticate" not in answer.headers, name


def test_the_classifiers_openai_paths_are_no_route_whatever_the_key(servers: dict[str, Server]) -> None:
    """A classifier serves no OpenAI route: its POST /openai/v1/completions is a 404, not a 401 without the key."""
    for headers in (NO_KEY, WRONG_KEY, BEARER):
        answer = _ask(servers["classifier"], "POST", "/openai/v1/completions", headers, {"prompt": "hi"})
        assert answer.status_code == 404, answer.text


@pytest.mark.parametrize(("kind", "path"), [
    ("classifier", "/v2/models/{name}/infer"),
    ("classifier", "/v2/models/{name}/versions/1/infer"),
    ("classifier", "/v1/models/{name}:predict"),
    ("classifier", "/v2/repository/models/no-such-model/unload"),  # (never the served one: the key would unload it)
    ("classifier", "/v2/models/no-such-model/infer"),  # a route, whatever the model: the key first
    ("lm", "/openai/v1/completions"),
    ("lm", "/openai/v1/chat/completions"),
    ("lm", "/openai/v1/embeddings"),
    ("lm", "/openai/v1/rerank"),
    ("lm", "/v2/models/{name}/infer"),
])
def test_a_post_route_still_needs_the_key(servers: dict[str, Server], kind: str, path: str) -> None:
    server = servers[kind]
    for headers, why in ((NO_KEY, "missing API key"), (WRONG_KEY, "wrong API key"),
                         (MALFORMED, "malformed Authorization header")):
        answer = _ask(server, "POST", path, headers, {"inputs": []})
        assert answer.status_code == 401, (headers, answer.text)
        assert answer.headers["www-authenticate"] == "Bearer" and why in answer.text
    assert _ask(server, "POST", path, BEARER, {}).status_code != 401


def test_the_classifier_still_answers_with_the_key(servers: dict[str, Server]) -> None:
    from tests.helpers.serving import output, texts

    body = {"inputs": [texts("text", ["a cat sleeps"]), texts("text_pair", ["an animal rests"])]}
    answer = _ask(servers["classifier"], "POST", "/v2/models/{name}/infer", BEARER, body)
    assert answer.status_code == 200 and output(answer.json(), "label"), answer.text


# ---------------------------------------------------------------------------------------------
# 2. GET /openai/v1/models/NAME: the model object.

def test_the_openai_model_route_answers_the_model_object(servers: dict[str, Server]) -> None:
    server = servers["lm"]
    (listed,) = _ask(server, "GET", "/openai/v1/models", NO_KEY).json()["data"]
    answer = _ask(server, "GET", "/openai/v1/models/{name}", NO_KEY)
    assert answer.status_code == 200, answer.text
    model = answer.json()
    assert model == listed
    assert (model["id"], model["object"], model["owned_by"]) == (LM_NAME, "model", "")
    assert isinstance(model["created"], int) and model["created"] > 0


def test_the_openai_model_route_of_an_unknown_model_is_a_404_naming_the_served(servers: dict[str, Server]) -> None:
    answer = _ask(servers["lm"], "GET", "/openai/v1/models/no-such-model", NO_KEY)
    assert answer.status_code == 404, answer.text
    assert "no-such-model" in answer.text and f"Served here: {LM_NAME}." in answer.text


# ---------------------------------------------------------------------------------------------
# 3. An OpenAI body without "model": 400 naming the field.

CHAT = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(("route", "body", "what"), [
    ("embeddings", {"messages": []}, "required"),
    ("embeddings", {"messages": CHAT}, "required"),
    ("embeddings", {"input": "a text"}, "required"),
    ("embeddings", {"input": ["a", "b"], "model": None}, "required"),
    ("rerank", {"query": "q", "documents": ["a", "b"]}, "required"),
    ("rerank", {"query": "q", "documents": ["a"], "model": ""}, "must not be empty"),
    ("completions", {"prompt": "hi"}, "required"),
    ("completions", {"prompt": "hi", "model": None}, "required"),
    ("completions", {"prompt": "hi", "model": ""}, "must not be empty"),
    ("completions", {"prompt": "hi", "stream": True}, "required"),
    ("chat/completions", {"messages": CHAT}, "required"),
    ("chat/completions", {"messages": []}, "required"),
    ("chat/completions", {"messages": CHAT, "model": ""}, "must not be empty"),
])
def test_an_openai_body_without_a_model_is_a_400_naming_the_field(servers: dict[str, Server], route: str,
                                                                  body: dict[str, Any], what: str) -> None:
    answer = _ask(servers["lm"], "POST", f"/openai/v1/{route}", BEARER, body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["message"].startswith(f"malformed request: model: {what}; "), answer.text
    assert "/openai/v1/models" in error["message"] and "None" not in error["message"]
    assert (error["param"], error["code"], error["type"]) == ("model", "400", "BadRequestError")


@pytest.mark.parametrize("route", ["completions", "embeddings"])
def test_a_model_nobody_serves_is_still_a_404_naming_the_served(servers: dict[str, Server], route: str) -> None:
    """A name, even "None", is a model's name: the 404 of a model nobody serves, as before."""
    body = {"model": "None", "prompt": "hi"} if route == "completions" else {"model": "None", "input": "hi"}
    answer = _ask(servers["lm"], "POST", f"/openai/v1/{route}", BEARER, body)
    assert answer.status_code == 404, answer.text
    assert "Model with name None does not exist" in answer.text and f"Served here: {LM_NAME}." in answer.text


def test_the_served_model_still_completes(servers: dict[str, Server]) -> None:
    answer = _ask(servers["lm"], "POST", "/openai/v1/completions", BEARER,
                  {"model": LM_NAME, "prompt": "Once upon a time", "max_tokens": 2, "temperature": 0})
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["finish_reason"] in ("length", "stop")
    embeddings = _ask(servers["lm"], "POST", "/openai/v1/embeddings", BEARER, {"model": LM_NAME, "input": "hi"})
    assert embeddings.status_code == 400 and "does not support Embeddings" in embeddings.text, embeddings.text
