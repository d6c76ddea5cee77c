"""The documentation stays true: docstring examples run, every public name is documented, the
README keeps CI's commands, and the docs' links point at files that exist. Fast, CPU only."""
import doctest
import importlib
import re
from pathlib import Path

import pytest

import flashattn_lite

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

# Modules whose docstrings hold runnable ``>>>`` examples (tiny CPU tensors: under
# TRITON_INTERPRET=1 they run the Triton kernels in the interpreter, otherwise the PyTorch twins).
DOCTEST_MODULES = [
    "flashattn_lite.ops.softmax",
    "flashattn_lite.ops.merge_states",
    "flashattn_lite.ops.decode",
    "flashattn_lite.ops.attention",
    "flashattn_lite.nn",
    "flashattn_lite.merge",
    "flashattn_lite.reference",
]
# Those that must have at least one example (the public functions' homes).
MUST_HAVE_EXAMPLES = {"flashattn_lite.ops.softmax", "flashattn_lite.ops.merge_states", "flashattn_lite.ops.decode",
                      "flashattn_lite.nn", "flashattn_lite.merge", "flashattn_lite.reference"}


@pytest.mark.parametrize("name", DOCTEST_MODULES)
def test_docstring_examples(name):
    import torch

    module = importlib.import_module(name)
    tests = [t for t in doctest.DocTestFinder(exclude_empty=True).find(module, name, globs={})
             if t.examples and t.name.startswith(name)]
    if name in MUST_HAVE_EXAMPLES:
        assert tests, f"{name}: no docstring examples found"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in tests:
        torch.manual_seed(0)
        test.globs = dict(vars(module))
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} docstring examples failed (see above)"


def _documented_text() -> str:
    return (ROOT / "README.md").read_text() + (DOCS / "api.md").read_text()


@pytest.mark.parametrize("name", flashattn_lite.__all__)
def test_public_name_documented(name):
    obj = getattr(flashattn_lite, name)
    assert (getattr(obj, "__doc__", None) or "").strip(), f"flashattn_lite.{name} has no docstring"
    assert re.search(rf"\b{re.escape(name)}\b", _documented_text()), \
        f"flashattn_lite.{name} appears in neither README.md nor docs/api.md"


def test_readme_keeps_ci_commands():
    """.ci/run installs and tests exactly as the README says."""
    readme = (ROOT / "README.md").read_text()
    for command in ('pip install torch==2.13.0', 'pip install -e ".[dev,bench,hf]"', "flashattn-lite memory",
                    "TRITON_INTERPRET=1 python -m pytest -q -n 2 tests"):
        assert command in readme, f"README.md no longer says {command!r}"


def _markdown_files():
    return [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted(DOCS.glob("*.md"))]


@pytest.mark.parametrize("path", _markdown_files(), ids=lambda p: p.name)
def test_relative_links_resolve(path):
    text = path.read_text()
    missing = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        if not (path.parent / target.split("#")[0]).exists():
            missing.append(target)
    assert not missing, f"{path.name} links to missing files: {missing}"


@pytest.mark.parametrize("path", _markdown_files() + [ROOT / "benchmarks" / "NOTES.md"], ids=lambda p: p.name)
def test_no_development_history_numbering(path):
    """Measurements are dated and named by their result files, not numbered by working session."""
    hits = re.findall(r".{0,30}\bsessions? \d.{0,30}", path.read_text(), flags=re.IGNORECASE)
    assert not hits, f"{path.name}: {hits[:3]}"


def _slug(heading: str) -> str:
    """A heading as GitHub anchors it: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _recipe_blocks():
    """(heading slug, first line, code) of every ```python block of docs/recipes.md, in order; a block
    whose info string says no-run (e.g. one that needs the network) is left out."""
    blocks, heading, code, start, info = [], "top", None, 0, []
    for number, line in enumerate((DOCS / "recipes.md").read_text().splitlines(), 1):
        if code is None:
            if line.startswith("#"):
                heading = _slug(line.lstrip("#"))
            elif line.startswith("```"):  # any fenced block is read to its end (its # lines are no headings)
                code, start, info = [], number + 1, line[3:].split()
        elif line.startswith("```"):
            if info[:1] == ["python"] and "no-run" not in info:
                blocks.append((heading, start, "\n".join(code)))
            code = None
        else:
            code.append(line)
    return blocks


_RECIPES = _recipe_blocks()


@pytest.mark.parametrize("index", range(len(_RECIPES)), ids=[heading for heading, _, _ in _RECIPES])
def test_recipes_run(index):
    """Each recipe's block runs in a fresh namespace and checks itself against the model's own
    attention in plain PyTorch (its asserts). Tracebacks give the line in docs/recipes.md."""
    heading, start, code = _RECIPES[index]
    assert code.strip(), f"docs/recipes.md, {heading}: empty block"
    exec(compile("\n" * (start - 1) + code, str(DOCS / "recipes.md"), "exec"), {"__name__": f"recipe_{index}"})
