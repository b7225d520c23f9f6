"""Small, learnable stand-ins for GLUE and WikiText-2, written in the real files' exact layout.

Tests and the laptop demo use them: no download, seconds to generate, and a tiny model can learn
them because each label is signalled by cue words from a label-specific vocabulary (the rest of
each sentence is random filler). Output is deterministic for a seed.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from pathlib import Path

from sweep.config.tasks import GLUE_DIAGNOSTIC, GLUE_TASKS, TaskSpec, load_task

FILLER = (
    "the a this that one some every man woman child dog cat city house river car book letter "
    "teacher farmer doctor student garden road window table morning evening winter summer "
    "walked saw took gave found made said kept left brought opened carried watched "
    "near under over behind beside across into from with about before after during "
    "old new small large quiet busy early late green blue wooden stone"
).split()
# Label-specific vocabularies: label j of a task is signalled by CUES[j]; STS-B uses six buckets.
CUE_GROUPS = (
    "wonderful brilliant delightful splendid charming superb".split(),
    "terrible dreadful awful miserable horrid dismal".split(),
    "certainly definitely surely truly indeed clearly".split(),
    "perhaps maybe possibly seemingly apparently arguably".split(),
    "never nobody nothing neither nowhere none".split(),
    "identical equivalent matching same twin alike".split(),
)
STSB_SOURCES = (
    ("main-captions", "MSRvid", "2012test"),
    ("main-news", "headlines", "2013"),
    ("main-forums", "deft-forum", "2014"),
)
MNLI_GENRES = {"train": ("fiction", "government", "slate", "telephone", "travel"),
               "mismatched": ("facetoface", "letters", "nineeleven", "oup", "verbatim")}

Row = list[str]
LABEL_NOISE = 0.1


def write_synthetic_glue(
    root: Path, tasks: Iterable[str] = GLUE_TASKS, n_train: int = 200, n_dev: int = 64, seed: int = 0,
    n_test: int = 64,
) -> Path:
    """Write ``root/glue_data/<TASK>/`` train, dev and (``n_test`` > 0) unlabeled test files for each
    task, and with MNLI the AX diagnostic ``glue_data/diagnostic/diagnostic.tsv``; returns ``root``."""
    root = Path(root)
    tasks = list(tasks)
    for task in tasks:
        spec = load_task(task)
        folder = root / "glue_data" / spec.folder
        folder.mkdir(parents=True, exist_ok=True)
        splits = {"train": (spec.train_file, n_train), **{s: (f, n_dev) for s, f in spec.eval_files.items()}}
        for split, (name, n) in splits.items():
            # one generator per (task, split): a task's files don't depend on which others are written
            rng = random.Random(f"{seed}/{task}/{split}")
            header, rows = _WRITERS[task](rng, n, split)
            _write_tsv(folder / name, header, rows)
        for split, name in spec.test_files.items() if n_test > 0 else ():
            # its own generator too: adding test files left every train and dev file as it was
            _write_test(folder / name, spec, random.Random(f"{seed}/{task}/test/{split}"), n_test, split)
    if "MNLI" in tasks and n_test > 0:
        diagnostic = root / "glue_data" / Path(*GLUE_DIAGNOSTIC)
        diagnostic.parent.mkdir(parents=True, exist_ok=True)
        _write_test(diagnostic, load_task("MNLI"), random.Random(f"{seed}/diagnostic"), n_test, "diagnostic",
                    with_meta=False)
    return root


# GLUE's test files: the index column, the task's own id and metadata columns, then the text columns; no label.
TEST_INDEX = {"QQP": "id"}
TEST_META = {
    "MRPC": ("#1 ID", "#2 ID"),
    "STS-B": ("genre", "filename", "year", "old_index", "source1", "source2"),
    "MNLI": ("promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
             "sentence1_parse", "sentence2_parse"),
}


def _write_test(path: Path, spec: TaskSpec, rng: random.Random, n: int, split: str, with_meta: bool = True) -> None:
    """Labelled rows as the task's writer makes them, cut down to the test layout (the diagnostic:
    index and text columns only)."""
    header, rows = _WRITERS[spec.name](rng, n, split)
    names = [c.removeprefix("\ufeff") for c in header or spec.columns]
    index = TEST_INDEX.get(spec.name, "index")
    columns = [*(TEST_META.get(spec.name, ()) if with_meta else ()), *spec.text_columns]
    out = []
    for i, row in enumerate(rows):
        fields = dict(zip(names, row))
        out.append([fields.get(index, str(i)), *(fields[c] for c in columns)])
    _write_tsv(path, [index, *columns], out)


def _write_tsv(path: Path, header: Row | None, rows: list[Row]) -> None:
    lines = ([header] if header else []) + rows
    path.write_text("".join("\t".join(r) + "\n" for r in lines), encoding="utf-8")


def _sentence(rng: random.Random, cues: list[str] | None = None, n_words: tuple[int, int] = (6, 12)) -> str:
    words = rng.choices(FILLER, k=rng.randint(*n_words))
    # cues never open the sentence: capitalized, they would tokenize differently from the rest
    for cue in rng.sample(cues, 2) if cues else ():
        words.insert(rng.randrange(1, len(words) + 1), cue)
    return " ".join(words).capitalize() + " ."


def _labelled(rng: random.Random, n: int, labels: tuple[str, ...]) -> list[tuple[int, str]]:
    """Balanced (cue group, label) pairs in random order, so even a small dev split has every label.

    A fraction LABEL_NOISE of rows carry a random cue group: like real data, not every example is
    learnable, so seeds score differently and accuracy stays below 1.
    """
    k = len(labels)
    picks = [(i % k if rng.random() >= LABEL_NOISE else rng.randrange(k), labels[i % k]) for i in range(n)]
    rng.shuffle(picks)
    return picks


def _pair(rng: random.Random, j: int) -> tuple[str, str]:
    """A first sentence of filler only, and a second one that carries label j's cue words."""
    return _sentence(rng), _sentence(rng, CUE_GROUPS[j])


Writer = Callable[[random.Random, int, str], tuple[Row | None, list[Row]]]


def _single_task(labels: tuple[str, ...], row: Callable[..., Row], header: Row | None) -> Writer:
    """A writer for a one-sentence task; ``row(rng, i, j, label, sentence)`` lays out one line."""

    def write(rng: random.Random, n: int, split: str) -> tuple[Row | None, list[Row]]:
        picks = enumerate(_labelled(rng, n, labels))
        return header, [row(rng, i, j, label, _sentence(rng, CUE_GROUPS[j])) for i, (j, label) in picks]

    return write


def _pair_task(labels: tuple[str, ...], row: Callable[..., Row], header: Row) -> Writer:
    """A writer for a sentence-pair task; ``row(rng, i, label, a, b)`` lays out one line."""

    def write(rng: random.Random, n: int, split: str) -> tuple[Row | None, list[Row]]:
        picks = enumerate(_labelled(rng, n, labels))
        return header, [row(rng, i, label, *_pair(rng, j)) for i, (j, label) in picks]

    return write


def _cola(rng: random.Random, i: int, j: int, label: str, s: str) -> Row:
    return [rng.choice(("gj04", "bc01", "ks08", "r-67")), label, "*" if label == "0" else "", s]


def _stsb(rng: random.Random, n: int, split: str) -> tuple[Row, list[Row]]:
    header = "index genre filename year old_index source1 source2 sentence1 sentence2 score".split()
    rows = []
    for i, (bucket, _) in enumerate(_labelled(rng, n, tuple("012345"))):
        a, b = _pair(rng, bucket)
        score = min(5.0, max(0.0, bucket + rng.uniform(-0.4, 0.4)))
        genre, source, year = rng.choice(STSB_SOURCES)
        rows.append([str(i), genre, source, year, f"{i:04d}", "none", "none", a, b, f"{score:.3f}"])
    return header, rows


def _mnli(rng: random.Random, n: int, split: str) -> tuple[Row, list[Row]]:
    n_votes = 1 if split == "train" else 5
    header = [
        "index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
        "sentence1_parse", "sentence2_parse", "sentence1", "sentence2",
        *(f"label{k}" for k in range(1, n_votes + 1)), "gold_label",
    ]  # fmt: skip
    genres = MNLI_GENRES["mismatched" if split == "mismatched" else "train"]
    rows = []
    for i, (j, label) in enumerate(_labelled(rng, n, ("contradiction", "entailment", "neutral"))):
        a, b = _pair(rng, j)
        prompt = rng.randrange(100000, 999999)
        parses = [_binary_parse(a), _binary_parse(b), _parse(a), _parse(b)]
        ids = [str(i), str(prompt), f"{prompt}{label[0]}", rng.choice(genres)]
        rows.append([*ids, *parses, a, b, *[label] * n_votes, label])
    return header, rows


def _binary_parse(s: str) -> str:
    return "( " + " ".join(s.split()) + " )"


def _parse(s: str) -> str:
    return "(ROOT (S " + " ".join(f"(NN {w})" for w in s.split()) + "))"


_WRITERS = {
    "CoLA": _single_task(("0", "1"), _cola, None),
    "SST-2": _single_task(("0", "1"), lambda rng, i, j, label, s: [s + " ", label], ["sentence", "label"]),
    "MRPC": _pair_task(
        ("0", "1"),
        lambda rng, i, label, a, b: [label, str(rng.randrange(10**6, 10**7)), str(rng.randrange(10**6, 10**7)), a, b],
        ["\ufeffQuality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
    ),
    "STS-B": _stsb,
    "QQP": _pair_task(
        ("0", "1"),
        lambda rng, i, label, a, b: [str(i), str(2 * i + 1), str(2 * i + 2), a[:-1] + "?", b[:-1] + "?", label],
        ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
    ),
    "MNLI": _mnli,
    "QNLI": _pair_task(
        ("entailment", "not_entailment"),
        lambda rng, i, label, a, b: [str(i), a[:-1] + "?", b, label],
        ["index", "question", "sentence", "label"],
    ),
    "RTE": _pair_task(
        ("entailment", "not_entailment"),
        lambda rng, i, label, a, b: [str(i), a, b, label],
        ["index", "sentence1", "sentence2", "label"],
    ),
    "WNLI": _pair_task(
        ("0", "1"), lambda rng, i, label, a, b: [str(i), a, b, label], ["index", "sentence1", "sentence2", "label"]
    ),
}


# ---- WikiText ------------------------------------------------------------------------------

PLACES = "Lowell Marston Avebury Kelda Norwick Tamsin Orford Brayton".split()
THINGS = "bridge church mill castle harbour railway school market".split()
WIKI_TEMPLATES = (
    "The {thing} at {place} was built in {year} and rebuilt in {year2} .",
    "It is {n} @,@ {m} metres long and {a} @.@ {b} metres wide .",
    "The {thing} was used by the people of {place} for {n} years .",
    "In {year} , the {thing} was damaged by a flood and the town council paid for the repairs .",
    "The north @-@ east side of the {thing} faces the {thing2} of {place2} .",
    "Its <unk> roof was replaced in {year2} , when the {thing} became a listed building .",
)


def write_synthetic_wikitext(root: Path, n_lines: int = 400, seed: int = 0) -> Path:
    """Write ``root/wikitext-2/wiki.{train,valid,test}.tokens`` and the same text untokenized as
    ``root/wikitext-2-raw/wiki.{train,valid,test}.raw``; returns ``root``."""
    tokens, raw = Path(root) / "wikitext-2", Path(root) / "wikitext-2-raw"
    tokens.mkdir(parents=True, exist_ok=True)
    raw.mkdir(parents=True, exist_ok=True)
    sizes = {"train": n_lines, "valid": max(n_lines // 10, 20), "test": max(n_lines // 10, 20)}
    for split, n in sizes.items():
        lines = _wiki_lines(random.Random(f"{seed}/wikitext/{split}"), n)
        text = "".join(f" {line} \n" if line else " \n" for line in lines)
        (tokens / f"wiki.{split}.tokens").write_text(text, encoding="utf-8")
        (raw / f"wiki.{split}.raw").write_text(_untokenize(text), encoding="utf-8")
    return Path(root)


def _untokenize(text: str) -> str:
    """WikiText's raw form: number separators joined again (the synthetic text keeps its <unk>)."""
    for marked, plain in ((" @-@ ", "-"), (" @,@ ", ","), (" @.@ ", ".")):
        text = text.replace(marked, plain)
    return text


def _wiki_lines(rng: random.Random, n: int) -> list[str]:
    """Articles as WikiText stores them: ' = Title = ', blank lines, ' = = Section = = ', paragraphs."""
    lines: list[str] = []
    while len(lines) < n:
        thing, place = rng.choice(THINGS), rng.choice(PLACES)
        lines += ["", f"= {place} {thing} =", ""]
        for section in rng.sample(("History", "Description", "Use", "Repairs"), 2):
            lines += [f"= = {section} = =", ""]
            lines += [_wiki_paragraph(rng, thing, place) for _ in range(rng.randint(1, 3))]
            lines.append("")
    return lines[:n]


def _wiki_paragraph(rng: random.Random, thing: str, place: str) -> str:
    return " ".join(_wiki_sentence(rng, thing, place) for _ in range(rng.randint(2, 4)))


def _wiki_sentence(rng: random.Random, thing: str, place: str) -> str:
    year = rng.randint(1700, 1950)
    return rng.choice(WIKI_TEMPLATES).format(
        thing=thing, place=place, year=year, year2=year + rng.randint(5, 60),
        n=rng.randint(1, 9), m=rng.randint(100, 999), a=rng.randint(1, 9), b=rng.randint(0, 9),
        thing2=rng.choice(THINGS), place2=rng.choice(PLACES),
    )  # fmt: skip


def corpus_sentences(n: int = 2000, seed: int = 0) -> list[str]:
    """Plain text lines covering the synthetic GLUE and WikiText vocabularies (to train a tiny BPE)."""
    rng = random.Random(f"{seed}/corpus")
    out = []
    for i in range(n):
        if i % 3 == 2:
            out.append(_wiki_sentence(rng, rng.choice(THINGS), rng.choice(PLACES)))
        else:
            s = _sentence(rng, CUE_GROUPS[i % len(CUE_GROUPS)])
            out.append(s[:-1] + "?" if i % 5 == 0 else s)  # QQP and QNLI hold questions
    return out

