"""The recipe files as a user finds them: each header's launch is the one the pipelines use, each has a purpose line,
each folder a README table of its files, and no comment speaks of how the project got there.

- Launch: for every pipeline recipe, each stage's recipe header names the accelerate config and process count the
  pipeline launches that stage with (a process count the header leaves out is the config's own), or `python` for a
  stage the pipeline runs in one plain process.
- `# purpose: ...` is the second header line (the first is the command), as `smolalign recipes` lists it.
- The research record (runs, chains, designs, tries, issues, sessions, commits, dates) lives in docs/research/.

Run: pytest tests/test_recipe_files.py -q   (a few seconds)
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from align.cli import parse
from align.pipeline.plan import PipelineConfig, resolve_stages
from align.pipeline.run import launcher_of
from align.recipes import RECIPE_SUFFIXES, TEMPLATE_SUFFIXES, header

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes"
FILES = sorted(p for p in RECIPES.rglob("*") if p.suffix in RECIPE_SUFFIXES + TEMPLATE_SUFFIXES)


def _is_pipeline(path: Path) -> bool:
    data = yaml.safe_load(path.read_text()) if path.suffix in RECIPE_SUFFIXES else None
    stages = data.get("stages") if isinstance(data, dict) else None
    return isinstance(stages, list) and bool(stages) and all(isinstance(s, dict) and "script" in s for s in stages)


PIPELINES = [p for p in FILES if _is_pipeline(p)]


def _processes(config: str) -> int:
    return int(yaml.safe_load((ROOT / config).read_text())["num_processes"])


def header_launch(recipe: Path) -> tuple[str, int]:
    """(accelerate config, processes) the recipe's first line launches with; ("python", 1) for one plain process."""
    words = recipe.read_text().splitlines()[0].lstrip("#").split()
    if words[0] == "python":
        return "python", 1
    assert words[:2] == ["accelerate", "launch"] and "--config_file" in words, f"{recipe}: {' '.join(words)}"
    config = words[words.index("--config_file") + 1]
    count = int(words[words.index("--num_processes") + 1]) if "--num_processes" in words else _processes(config)
    return config, count


def test_the_pipelines_are_found():
    names = {p.relative_to(RECIPES).as_posix() for p in PIPELINES}
    assert {"tiny/pipeline.yaml", "smollm3/pipeline.yaml", "smollm3/post_train_pipeline.yaml"} <= names


@pytest.mark.parametrize("pipeline", PIPELINES, ids=lambda p: p.relative_to(RECIPES).as_posix())
def test_each_stage_recipe_header_launches_as_its_pipeline_does(pipeline, tmp_path):
    (cfg,) = parse(PipelineConfig, args=[str(pipeline), "--run_dir", str(tmp_path)])
    wrong = []
    for stage in resolve_stages(cfg):
        if not stage.recipe:
            continue
        if launcher_of(stage, cfg) == "python":
            wanted = ("python", 1)
        else:
            config = stage.accelerate_config or cfg.accelerate_config
            wanted = (config, stage.num_processes or cfg.num_processes or _processes(config))
        if header_launch(ROOT / stage.recipe) != wanted:
            wrong.append(
                f"{stage.name}: {stage.recipe} header {header_launch(ROOT / stage.recipe)}, pipeline {wanted}"
            )
    assert not wrong, wrong


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.relative_to(RECIPES).as_posix())
def test_every_recipe_says_its_purpose_on_its_second_header_line(path):
    lines = header(path)
    assert len(lines) >= 2 and lines[1].startswith("purpose: ") and len(lines[1]) > len("purpose: ") + 10, lines[:2]


@pytest.mark.parametrize("folder", sorted({p.parent for p in FILES}), ids=lambda p: p.name)
def test_every_recipe_folder_has_a_readme_table_of_its_files(folder):
    readme = folder / "README.md"
    assert readme.is_file(), f"{folder} has no README.md"
    rows = [line for line in readme.read_text().splitlines() if line.startswith("| ")]
    listed = {m for line in rows for m in re.findall(r"`([\w.-]+\.(?:yaml|yml|slurm|sh))`", line)}
    files = {p.name for p in folder.iterdir() if p.suffix in RECIPE_SUFFIXES + TEMPLATE_SUFFIXES}
    assert files == listed, f"{readme}: files not in its table {sorted(files - listed)}, gone {sorted(listed - files)}"


# What the research record says and a recipe must not: a run's number or name in the project's history, an issue,
# a work session, a commit, a date. Words that name features ("round 2" of iterative APO, a tool "chain") are free.
ORDINAL = r"(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|\d+(?:st|nd|rd|th))"
HISTORY = re.compile(
    "|".join(
        [
            # design 7, issue 36
            r"\b(?:chain|design|try|tries|attempt|session|issue|work[- ]?log)s?\s*#?\d+(?!\d|\.\d|%)",
            rf"\b{ORDINAL}\s+(?:chain|design|try|session)\b",  # the ninth chain, APO's third design
            r"\bdesign\s+[A-F]\b",  # design E
            r"(?<![\w/])#\d+\b",  # #36
            r"\b20\d\d-\d\d-\d\d\b|\bchain_20\d{6}",  # dates, dated run folders
            r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b",  # a commit hash: hex with letters and digits
        ]
    ),
    re.IGNORECASE,
)


@pytest.mark.parametrize(
    "text, found",
    [
        ("the ninth chain's APO model", True),
        ("GRPO design 7", True),
        ("Design E", True),
        ("(issue 36)", True),
        ("session 46", True),
        ("tries 5-6", True),
        ("at 8c9707d", True),
        ("2026-11-27", True),
        ("see #38", True),
        ("APO's third design", True),
        ("docs/smol135m/chain_20261129_8", True),
        ("design 7, below", True),
        ("round 2's pairs", False),
        ("the tool_difference chain's plan", False),
        ("the chain 93.8% think", False),
        ("loss_type: dapo", False),
        ("rope_theta: 5000000.0", False),
        ("seed: 42", False),
        ("deadbeef", False),
        ("2,359,296 tokens", False),
    ],
)
def test_the_history_pattern_finds_what_it_should(text, found):
    assert bool(HISTORY.search(text)) is found, text


def test_no_recipe_speaks_of_the_projects_history():
    hits = [
        f"{p.relative_to(ROOT)}:{i}: {m.group(0)!r}"
        for p in FILES
        for i, line in enumerate(p.read_text().splitlines(), 1)
        for m in HISTORY.finditer(line)
    ]
    assert not hits, "move these to docs/research/recipes_history.md:\n" + "\n".join(hits)
