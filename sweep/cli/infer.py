"""``sweep infer --url http://127.0.0.1:8080 --model NAME "The meaning of life is"`` (also ``python -m sweep infer``)

One inference call to a model server (``sweep serve``, or the same server running as a KServe
InferenceService): prints the completion of a causal LM, or ``label<TAB>score`` of a classifier, one
line per text. ``--grpc HOST:PORT`` makes the same call over the v2 gRPC protocol; ``--stream`` asks a
causal LM through the server's OpenAI completions endpoint, printing the tokens as they arrive.
The client is sweep/serving/client.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

PROG = "sweep infer"


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="One inference call to a model server: a causal LM's "
                                     "completion, or a classifier's label<TAB>score, one line per text.")
    parser.add_argument("texts", nargs="+", help="prompts (causal LM) or texts to classify")
    parser.add_argument("--url", default="http://127.0.0.1:8080", help="the server's base URL")
    parser.add_argument("--grpc", metavar="HOST:PORT", default=None,
                        help="call the server's v2 gRPC service at HOST:PORT instead of REST at --url (needs --model)")
    parser.add_argument("--model", default=None, help="the published model name (default: the server's only model)")
    parser.add_argument("--pair", action="append", help="second text of a pair, once per text (RTE, MRPC, ...)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default)")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=None, help="makes sampling reproducible")
    parser.add_argument("--stop", action="append", help="stop sequence (repeatable)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds")
    parser.add_argument("--api-key", default=None,
                        help="the server's API key, sent as Authorization: Bearer (default: $SWEEP_API_KEY; prefer "
                             "the variable: a command line is visible to every user of the machine)")
    parser.add_argument("--json", action="store_true", help="print the raw v2 response")
    parser.add_argument("--stream", action="store_true",
                        help="causal LM: print tokens as they arrive (the OpenAI completions endpoint, stream=true)")
    return parser


def parse_args(argv: Sequence[str] | None, prog: str = PROG) -> argparse.Namespace:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if args.stream and (args.grpc or args.json):
        parser.error("--stream prints text as it arrives from the OpenAI REST endpoint: not with --grpc or --json")
    if args.grpc and not args.model:  # a usage mistake (exit 2), found before any connection
        parser.error("--grpc needs --model NAME: the v2 gRPC protocol has no list of models")
    if args.pair and len(args.pair) != len(args.texts):
        parser.error(f"--pair given {len(args.pair)} time(s) for {len(args.texts)} text(s): one per text")
    return args


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> None:
    args = parse_args(argv, prog)
    from sweep.serving.api_key import API_KEY_ENV
    from sweep.serving.client import InferError, InferOptions, format_response, infer, infer_grpc, stream_completions

    options = InferOptions(pair=tuple(args.pair or ()), max_new_tokens=args.max_new_tokens,
                           temperature=args.temperature, top_p=args.top_p, seed=args.seed,
                           stop=tuple(args.stop or ()), timeout=args.timeout,
                           api_key=args.api_key or os.environ.get(API_KEY_ENV) or None)
    try:
        if args.stream:
            for note in stream_completions(args.url, args.model, args.texts, options):
                print(note, file=sys.stderr)
            return
        if args.grpc:
            kind, response = infer_grpc(args.grpc, args.model, args.texts, options)
        else:
            kind, response = infer(args.url, args.model, args.texts, options)
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
