"""python -m sweep.infer --url http://127.0.0.1:8080 --model NAME "The meaning of life is"

One inference call to a model server (``python -m sweep.serve``, or the same server running as a
KServe InferenceService): prints the completion of a causal LM, or ``label<TAB>score`` of a
classifier, one line per text. What kind of model it is comes from ``GET /v2/models/NAME``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

import httpx

from sweep.serving.protocol import STOP, TEXT, TEXT_PAIR, tensor_by_name


class InferError(RuntimeError):
    """The call failed: the server is unreachable or refused the request (its message included)."""


def _bytes_tensor(name: str, texts: Sequence[str]) -> dict[str, Any]:
    return {"name": name, "shape": [len(texts)], "datatype": "BYTES", "data": list(texts)}


def _check(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except json.JSONDecodeError:
        body = {"error": response.text.strip()[:300]}
    if response.status_code >= 400:
        message = body.get("error") if isinstance(body, dict) else None
        raise InferError(f"the server answered {response.status_code}: {message or body}")
    return body


def _get(client: httpx.Client, path: str) -> dict[str, Any]:
    return _check(client.get(path))


def pick_model(client: httpx.Client, name: str | None) -> str:
    """``name``, or the server's only model."""
    if name:
        return name
    models = _get(client, "/v1/models").get("models", [])
    if len(models) != 1:
        raise InferError(f"the server has {len(models)} models ({', '.join(models)}): choose one with --model")
    return models[0]


def build_request(kind: str, texts: Sequence[str], args: argparse.Namespace) -> dict[str, Any]:
    if kind == "classifier":
        inputs = [_bytes_tensor(TEXT, texts)]
        if args.pair:
            inputs.append(_bytes_tensor(TEXT_PAIR, args.pair))
        return {"inputs": inputs}
    if args.pair:
        raise InferError("--pair is for classifiers; this model generates text")
    parameters: dict[str, Any] = {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "top_p": args.top_p}
    if args.seed is not None:
        parameters["seed"] = args.seed
    inputs = [_bytes_tensor(TEXT, texts)]
    if args.stop:
        inputs.append(_bytes_tensor(STOP, args.stop))
    return {"inputs": inputs, "parameters": parameters}


def infer(url: str, model: str | None, texts: Sequence[str], args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """(kind, v2 response) of one call; ``kind`` is ``classifier`` or ``generator``."""
    try:
        with httpx.Client(base_url=url.rstrip("/"), timeout=args.timeout) as client:
            name = pick_model(client, model)
            outputs = {o["name"] for o in _get(client, f"/v2/models/{name}").get("outputs", [])}
            kind = "generator" if "text" in outputs else "classifier"
            return kind, _check(client.post(f"/v2/models/{name}/infer", json=build_request(kind, texts, args)))
    except httpx.ConnectError as e:
        raise InferError(f"cannot reach the model server at {url} ({e}); is `python -m sweep.serve` running there?") from None
    except httpx.TimeoutException:
        raise InferError(f"no answer from {url} within {args.timeout:g} s (--timeout)") from None
    except httpx.HTTPError as e:
        raise InferError(f"request to {url} failed: {e}") from None


def format_response(kind: str, response: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(lines for stdout, lines for stderr) of a response."""
    outputs = response.get("outputs", [])
    if kind == "generator":
        texts = tensor_by_name(outputs, "text") or []
        prompt = tensor_by_name(outputs, "prompt_tokens") or []
        completion = tensor_by_name(outputs, "completion_tokens") or []
        reasons = tensor_by_name(outputs, "finish_reason") or []
        notes = [f"[{p} prompt + {c} completion tokens, finish: {r}]" for p, c, r in zip(prompt, completion, reasons)]
        return [str(t) for t in texts], notes
    scores = tensor_by_name(outputs, "score") or []
    labels = tensor_by_name(outputs, "label") or [None] * len(scores)
    return [f"{label}\t{score:.4f}" if label is not None else f"{score:.4f}" for label, score in zip(labels, scores)], []


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m sweep.infer", description=__doc__.splitlines()[0])
    parser.add_argument("texts", nargs="+", help="prompts (causal LM) or texts to classify")
    parser.add_argument("--url", default="http://127.0.0.1:8080", help="the server's base URL")
    parser.add_argument("--model", default=None, help="the published model name (default: the server's only model)")
    parser.add_argument("--pair", action="append", help="second text of a pair, once per text (RTE, MRPC, ...)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default)")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=None, help="makes sampling reproducible")
    parser.add_argument("--stop", action="append", help="stop sequence (repeatable)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds")
    parser.add_argument("--json", action="store_true", help="print the raw v2 response")
    args = parser.parse_args(argv)
    if args.pair and len(args.pair) != len(args.texts):
        parser.error(f"--pair given {len(args.pair)} time(s) for {len(args.texts)} text(s): one per text")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        kind, response = infer(args.url, args.model, args.texts, args)
    except InferError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    if args.json:
        print(json.dumps(response, indent=2))
        return
    lines, notes = format_response(kind, response)
    for line in lines:
        print(line)
    for note in notes:
        print(note, file=sys.stderr)


if __name__ == "__main__":
    main()
