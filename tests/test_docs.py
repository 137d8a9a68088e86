"""The README stays a front door (short), and every relative link in it and in docs/*.md leads
to a file that exists and, with a #anchor, to a heading that exists there (GitHub's rule)."""

import contextlib
import importlib
import importlib.metadata
import importlib.util
import io
import os
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
README = REPO_ROOT / "README.md"
DOCS = [README, *sorted((REPO_ROOT / "docs").glob("*.md"))]
MAX_README_LINES = 220

FENCE = re.compile(r"^ *(```|~~~).*?^ *\1", re.M | re.S)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} +(.+?) *#* *$", re.M)


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lowercase, punctuation other than - and _ dropped, spaces to -;
    a repeated one gets -1, -2, ... Headings inside fenced code are not headings."""
    found: set[str] = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text())):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        anchor, n = slug, 0
        while anchor in found:
            n += 1
            anchor = f"{slug}-{n}"
        found.add(anchor)
    return found


def relative_links(path: Path) -> list[str]:
    text = FENCE.sub("", path.read_text())
    return [url for url in LINK.findall(text) if not re.match(r"[a-z]+:", url)]


@pytest.mark.parametrize("path", DOCS, ids=lambda path: path.name)
def test_every_relative_link_and_anchor_exists(path):
    broken = []
    for url in relative_links(path):
        target, _, anchor = url.partition("#")
        target_path = (path.parent / target).resolve() if target else path
        if not target_path.exists():
            broken.append(f"{url}: no file {os.path.relpath(target_path, REPO_ROOT)}")
        elif anchor and target_path.suffix == ".md" and anchor not in anchors(target_path):
            broken.append(f"{url}: no heading #{anchor} in {target_path.name}")
    assert not broken, f"{path.relative_to(REPO_ROOT)}: " + "; ".join(broken)


def test_anchor_rule_and_broken_links_are_caught(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "## `pretrain/` — data preparation\n```\n# not a heading\n```\n"
        "[a](#pretrain--data-preparation) [b](#not-a-heading) [c](missing.md) [d](https://x.org)\n"
    )
    assert anchors(page) == {"pretrain--data-preparation"}
    assert relative_links(page) == ["#pretrain--data-preparation", "#not-a-heading", "missing.md"]


def test_readme_is_short():
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; move detail into docs/"


# --- every command shown parses: its flags exist, its config loads --------------------------

BASH_BLOCK = re.compile(r"^ *```bash\n(.*?)^ *```", re.M | re.S)
ASSIGNMENT = re.compile(r"^([A-Z_]+)=(\"[^\"]*\"|'[^']*'|\S*)$")
SCRIPTS = {
    point.name: point.module for point in importlib.metadata.distribution("wos-gpt2").entry_points
}
# What a batch script hands its arguments to (scripts/slurm/*.sbatch: "$@").
SBATCH_ARGUMENTS = {"mnist.sbatch": "mnist.train", "pretrain_": "pretrain.run"}
WRAPPERS = {"nice": 3, "/usr/bin/time": 2}  # words to drop before the command: nice -n 10


def logical_lines(block: str) -> Iterator[str]:
    """A block's command lines: continuations joined, a quote left open running on (python -c
    "..."), a here-document's lines skipped."""
    lines, pending = iter(re.sub(r"\\\n", " ", block).splitlines()), ""
    for line in lines:
        if "<<" in line:  # python - <<'EOF' ... EOF
            end = line.split("<<")[1].strip("'\" ")
            while next(lines, end) != end:
                pass
            continue
        try:
            shlex.split(pending + line, comments=True)
        except ValueError:  # no closing quotation yet
            pending += line + "\n"
            continue
        yield pending + line
        pending = ""


def shown_commands() -> list[tuple[str, str, list[str]]]:
    """(where, the section's heading, the words) of each command line in a bash block, with
    continuations joined, comments dropped and the page's variables (NAME="...") expanded."""
    commands = []
    for path in DOCS:
        text, variables = path.read_text(), {}
        for block in BASH_BLOCK.finditer(text):
            line_number = text.count("\n", 0, block.start()) + 2
            heading = ([""] + re.findall(r"^## (.+)$", text[: block.start()], re.M))[-1]
            for line in logical_lines(block.group(1)):
                if match := ASSIGNMENT.match(line.strip()):
                    variables[match[1]] = shlex.split(match[2])[0] if match[2] else ""
                    continue
                for name, value in variables.items():
                    line = line.replace(f"${name}", value)
                words = shlex.split(line, comments=True)
                while words and (re.match(r"[A-Z_]+=", words[0]) or words[0] in WRAPPERS):
                    words = words[WRAPPERS.get(words[0], 1) :]
                if words:
                    where = f"{path.relative_to(REPO_ROOT)}:{line_number}"
                    commands.append((where, heading, words))
    return commands


def entry_module(words: list[str]) -> tuple[str | None, list[str]]:
    """The module whose `main` takes the command's arguments, and those arguments."""
    program = words[0].removeprefix(".venv/bin/")
    if program in SCRIPTS:
        return SCRIPTS[program], words[1:]
    if program in ("python", "python3") and words[1:2] == ["-m"] and words[2] != "venv":
        return words[2], words[3:]
    if program in ("python", "python3") and words[1].endswith(".py"):
        # tests/ is on the path of the suite's modules (no package): tests/x.py is x.
        module = words[1].removesuffix(".py").removeprefix("tests/").replace("/", ".")
        return module, words[2:]
    if program == "sbatch":
        script = next(word for word in words if word.endswith(".sbatch"))
        assert (REPO_ROOT / script).is_file(), f"no batch script {script}"
        rest = words[words.index(script) + 1 :]
        return next(m for key, m in SBATCH_ARGUMENTS.items() if key in script), rest
    if program == "make":
        assert re.search(rf"^{words[1]}:", (REPO_ROOT / "Makefile").read_text(), re.M)
    return None, []


def parse_error(module: str, argv: list[str]) -> str:
    """'' when `module`'s main reads `argv` up to a --help put at its end (its flags exist, its
    config loads), else what it printed."""
    split = argv.index("--") if "--" in argv else len(argv)  # after --: another command's
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            code = importlib.import_module(module).main([*argv[:split], "--help", *argv[split:]])
    except SystemExit as exit_:  # --help's
        code = exit_.code
    return "" if code == 0 else stderr.getvalue() or f"exit code {code}"


# A synopsis ("[--flag value ...]") is not a command.
COMMANDS = [command for command in shown_commands() if not any("[" in w for w in command[2])]


@pytest.mark.parametrize(("where", "heading", "words"), COMMANDS, ids=[c[0] for c in COMMANDS])
def test_every_command_shown_in_the_docs_parses(where, heading, words, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)  # the docs' paths are the repository's
    from pretrain.launch import parse_launch_args

    module, argv = entry_module(words)
    if module == "pretrain.launch":
        launch = parse_launch_args(argv)
        assert (REPO_ROOT / launch.config_file).is_file(), f"{where}: no {launch.config_file}"
        module = launch.training_script.removesuffix(".py").replace("/", ".")
        argv = launch.training_script_args
    if module is None:
        return
    if importlib.util.find_spec(module) is None:  # a benchmark retired at a named commit
        assert re.search(r"at commit [0-9a-f]{7}", heading), f"{where}: no module {module}"
        return
    assert parse_error(module, argv) == "", f"{where}: {shlex.join(words)}"


def test_a_mistyped_flag_or_a_missing_config_in_a_shown_command_is_caught(monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    tiny = ["--config", "pretrain/configs/tiny.yaml"]
    assert parse_error("pretrain.run", tiny) == ""
    assert "did you mean --learning_rate?" in parse_error("pretrain.run", [*tiny, "--lerning_rate"])
    assert "does not exist" in parse_error("pretrain.prepare_blocks", ["--config", "nope.yaml"])
    assert "invalid integer" in parse_error("tokenizer.train", ["--vocab_size", "many"])
