"""align/data/decontamination.py and its place in the stages and the pipeline: planted overlaps in hub-shaped data
(verbatim, reworded with the same numbers and another name, the same canonical problem) are found and dropped,
warn keeps them, refuse stops; templated prompts of other problems are not flagged; the pipeline hands every training
stage its eval sets and the report lists what was found. No models; a few seconds."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import datasets
import pytest
import yaml
from hub_fixtures import chat_rows, write_repo

from align import stage
from align.data.decontamination import BOILERPLATE, decontaminate, problems_of, prompt_texts, tokens
from align.data.loading import load_source
from align.eval.suite import real_items
from align.pipeline.plan import PipelineConfig, resolve_stages
from align.pipeline.report import decontamination_lines
from data_gen.tasks import make_tasks
from data_gen.tool_tasks import make_tool_tasks

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def eval_sets() -> dict[str, list[dict]]:
    gsm = real_items("gsm8k", 10, "dev")  # what the eval suite scores by default: the dev split
    return {
        "eval:gen/tasks": make_tasks(num=70, split="dev", seed=0),
        "eval:gen/gsm8k": [{"prompt": q} for q in gsm["question"]],
    }


def _user(text: str) -> dict:
    return {
        "messages": [
            {"role": "system", "content": "/think"},
            {"role": "user", "content": text},
            {"role": "assistant", "content": "The answer is \\boxed{1}."},
        ]
    }


def planted(eval_sets) -> dict[str, str]:
    """Training prompts that overlap the eval sets, by the way they overlap."""
    tasks = {r["family"]: r["prompt"] for r in eval_sets["eval:gen/tasks"]}
    gsm = eval_sets["eval:gen/gsm8k"][0]["prompt"]  # "Melanie is a door-to-door saleswoman. ..."
    word = next(
        r["prompt"] for r in eval_sets["eval:gen/tasks"] if " gets " in r["prompt"] or " gives " in r["prompt"]
    )
    name, item = word.split()[0], word.split()[3]
    sort = tasks["sort"]
    direction = "descending" if "ascending" in sort else "ascending"
    numbers = sort.split(": ", 1)[1].rstrip(".").split(", ")
    return {
        "verbatim task": tasks["count_letters"],
        "verbatim gsm8k": gsm,
        "gsm8k, another name": gsm.replace("Melanie", "Rosalind"),
        "word problem, another name and item": word.replace(name, "Ann" if name != "Ann" else "Tom").replace(
            item, "marbles"
        ),
        "sort, other direction and order": f"Sort in {direction} order: {', '.join(reversed(numbers))}.",
    }


def clean(n: int = 120) -> list[str]:
    """Prompts that overlap nothing: training problems of the same families (templated like the eval prompts) and
    tool-use letter counts in the eval prompts' words."""
    return [r["prompt"] for r in make_tasks(num=n, split="train", seed=0)] + [
        r["prompt"] for r in make_tool_tasks(["tool_count"], num=20, split="train")
    ]


def test_planted_overlaps_are_found_in_a_hub_shaped_dataset_and_dropped(tmp_path, eval_sets):
    plants = planted(eval_sets)
    rows = [_user(p) for p in plants.values()] + [_user(p) for p in clean()] + chat_rows("chat", 20)
    rows = [{"messages": r["messages"]} for r in rows]
    repo = write_repo(tmp_path / "org" / "mixed", {"default": {"train": rows}})
    train = load_source(str(repo), split="train")
    kept, report = decontaminate(train, eval_sets, mode="drop")
    assert report["overlapping"] == report["dropped"] == len(plants), report["sources"]
    assert len(kept) == len(rows) - len(plants)
    left = {m[1]["content"] for m in kept["messages"]}
    assert not set(plants.values()) & left
    tasks, gsm = report["sources"]["eval:gen/tasks"], report["sources"]["eval:gen/gsm8k"]
    assert tasks["rows"] == tasks["by_problem"] == 3 and gsm["rows"] == gsm["by_ngram"] == 2
    assert report["eval_sets"] == {"eval:gen/tasks": 70, "eval:gen/gsm8k": 10}
    assert sorted(x["row"] for x in gsm["examples"]) == [1, 2]  # the verbatim and the renamed question
    assert [x["match"] for x in gsm["examples"]][0] == "ngram 1.00" and gsm["examples"][1]["train"].startswith("Ros")


def test_warn_keeps_the_rows_and_refuse_names_them(eval_sets):
    plants = planted(eval_sets)
    train = datasets.Dataset.from_list([{"prompt": p} for p in [*plants.values(), *clean(20)]])
    kept, report = decontaminate(train, eval_sets, mode="warn")
    assert len(kept) == len(train) and report["overlapping"] == len(plants) and report["dropped"] == 0
    with pytest.raises(ValueError, match=r"5 of 45 training rows overlap an eval set .*decontamination: drop"):
        decontaminate(train, eval_sets, mode="refuse")
    with pytest.raises(ValueError, match="choose one of"):
        decontaminate(train, eval_sets, mode="delete")


@pytest.mark.parametrize(
    "shape",
    [
        "messages",
        "prompt string",
        "prompt messages + chosen/rejected",
        "chosen only",
        "text",
        "family column",
        "another family's name",
    ],
)
def test_every_hub_shape_is_read(shape, eval_sets):
    prompt = planted(eval_sets)["word problem, another name and item"]
    user = [{"role": "user", "content": prompt}]
    answer = [{"role": "assistant", "content": "42"}]
    verbatim = planted(eval_sets)["verbatim task"]
    row = {
        "messages": {"messages": user + answer},
        "prompt string": {"prompt": prompt},
        "prompt messages + chosen/rejected": {"prompt": user, "chosen": answer, "rejected": answer},
        "chosen only": {"chosen": user + answer, "rejected": user + answer},
        # a document holding an eval prompt is no longer in its family's form: its n-grams find it
        "text": {"text": f"Question: {verbatim}\nAnswer: 3."},
        "family column": {"prompt": prompt, "family": "word_problem"},
        "another family's name": {"prompt": prompt, "family": "maths"},
    }[shape]
    _, report = decontaminate(datasets.Dataset.from_list([row]), eval_sets, mode="warn")
    assert report["overlapping"] == 1, shape


def test_the_family_column_decides_the_problem_and_a_prompt_in_a_form_is_recognised():
    assert problems_of(["What is 5 + 3?"]) == {("arithmetic", "+3+5")}
    assert problems_of(["What is 5 + 3?"], "arithmetic") == {("arithmetic", "+3+5")}
    both = problems_of(['How many times does the letter "a" appear in "abcab"?'])
    assert both == {("count_letters", "abcab"), ("tool_count", "abcab")}  # one form, two families
    assert problems_of(["Tell me a story."]) == frozenset()
    assert prompt_texts([{"role": "system", "content": "/think"}, {"role": "user", "content": "hi"}]) == ["hi"]
    assert tokens('What is 3 + 5 - 2? It\'s "fine".') == ["what", "is", "3", "+", "5", "-", "2", "it", "s", "fine"]


def test_boilerplate_is_no_evidence_and_the_check_is_linear():
    preamble = "Answer the following question with care and show every step of your reasoning please."
    evals = {
        "eval:few-shot": [
            {"prompt": f"{preamble} Question {i}: what is the colour of object number {i}?"}
            for i in range(BOILERPLATE + 5)
        ]
    }
    train = datasets.Dataset.from_list(
        [{"prompt": preamble + " What is the capital of France?"}, {"prompt": " ".join(["word"] * 200_000)}]
    )
    start = time.perf_counter()
    _, report = decontaminate(train, evals, mode="warn")
    assert report["overlapping"] == 0 and time.perf_counter() - start < 20
    verbatim = datasets.Dataset.from_list([{"prompt": evals["eval:few-shot"][3]["prompt"]}])
    assert decontaminate(verbatim, evals, mode="warn")[1]["overlapping"] == 1


def test_a_stage_checks_its_rows_against_the_pipelines_sets_and_its_own_held_out_split(tmp_path, eval_sets):
    plants = planted(eval_sets)
    held_out = make_tasks(num=30, split="validation", seed=4)  # what a later stage holds out
    own = make_tasks(num=1, split="dev", seed=9)[0]["prompt"]  # this stage's own held-out row, trained on too
    rows = [_user(p) for p in [*plants.values(), held_out[0]["prompt"], own, *clean(40)]]
    repo = write_repo(tmp_path / "org" / "sft", {"default": {"train": rows, "test": [_user(own)]}})
    sets = tmp_path / "eval_sets.json"
    sets.write_text(
        json.dumps(
            {
                "eval": [
                    {"suites": ["generative"], "gen_sets": ["tasks:70", "gsm8k:10"], "seed": 0},
                    {"suites": ["loss"], "loss_num_texts": 4, "chat_loss_data": str(tmp_path / "not_yet.jsonl")},
                ],
                "held_out": {
                    "grpo": {"dataset_name": "builtin:tasks", "dataset_args": {"num": 30, "seed": 4}},
                    "apo": {"dataset_name": str(tmp_path / "preferences")},
                },
            }
        )
    )
    args = SimpleNamespace(
        dataset_name=str(repo),
        dataset_args=None,
        dataset_mixture=None,
        dataset_config=None,
        dataset_train_split="train",
        dataset_test_split="test",
        test_split_size=None,
        max_train_samples=None,
        max_eval_samples=None,
        seed=0,
        decontamination="drop",
        decontamination_eval_sets=str(sets),
        decontamination_ngram=8,
        decontamination_threshold=0.5,
    )
    data = stage.load_data(args, str(tmp_path / "out"))
    report = json.loads((tmp_path / "out" / "decontamination.json").read_text())
    assert report["dropped"] == len(plants) + 2 and len(data["train"]) == len(rows) - len(plants) - 2
    assert {"held-out:grpo", "held-out:this stage", "eval:gen/tasks"} <= set(report["sources"])
    assert report["not_made_yet"] == ["eval:loss/chat", f"held-out:apo ({tmp_path / 'preferences'})"]
    args.decontamination = "refuse"
    with pytest.raises(ValueError, match="overlap an eval set"):
        stage.load_data(args, None)
    args.decontamination_eval_sets = None  # unset: the data as it is
    assert len(stage.load_data(args)["train"]) == len(rows)


def test_the_pipeline_hands_every_training_stage_its_eval_sets(tmp_path):
    (tmp_path / "sft.yaml").write_text("dataset_name: builtin:tasks\ndataset_args: {num: 10}\noutput_dir: x\n")
    (tmp_path / "gen.yaml").write_text("output_dir: y\n")
    stages = [
        {
            "name": "sft",
            "script": "sft",
            "recipe": str(tmp_path / "sft.yaml"),
            "overrides": {"output_dir": "${run_dir}/sft"},
        },
        {
            "name": "grpo",
            "script": "grpo",
            "recipe": str(tmp_path / "sft.yaml"),
            "overrides": {"output_dir": "${run_dir}/grpo", "decontamination": "refuse"},
            "eval_overrides": {"gen_sets": ["tasks:8"]},
        },
        {"name": "answers", "script": "generate_answers", "recipe": str(tmp_path / "gen.yaml")},
    ]
    cfg = PipelineConfig(
        stages=stages, run_dir=str(tmp_path / "run"), eval_recipe=str(ROOT / "recipes/tiny/eval.yaml"), tracking="none"
    )
    sft, grpo, answers = resolve_stages(cfg)
    path = sft.config["decontamination_eval_sets"]
    assert path == grpo.config["decontamination_eval_sets"] and "decontamination_eval_sets" not in answers.config
    assert (sft.config["decontamination"], grpo.config["decontamination"]) == ("drop", "refuse")  # a stage's key wins
    from align.pipeline.plan import decontamination_sets

    where, content = decontamination_sets(cfg, [sft, grpo, answers])
    assert str(where) == path and set(content["held_out"]) == {"sft", "grpo"}
    # each stage's dev set, and the sealed test the final model (grpo) is evaluated on once at the end
    recipe_sets = yaml.safe_load((ROOT / "recipes/tiny/eval.yaml").read_text())["gen_sets"]
    assert [(c.get("eval_split", "dev"), c.get("gen_sets")) for c in content["eval"]] == [
        ("dev", recipe_sets),
        ("dev", ["tasks:8"]),
        ("test", ["tasks:8"]),
    ]
    cfg.eval_overrides = {"seed": 3}  # another eval set: another file, so the stages run again
    assert resolve_stages(cfg)[0].config["decontamination_eval_sets"] != path
    cfg.decontamination = "off"
    assert "decontamination_eval_sets" not in resolve_stages(cfg)[0].config
    with pytest.raises(ValueError, match="decontamination='sometimes'"):
        PipelineConfig(stages=stages, decontamination="sometimes")


def test_the_report_lists_overlap_per_source_with_examples(tmp_path):
    out = tmp_path / "sft"
    out.mkdir()
    (out / "decontamination.json").write_text(
        json.dumps(
            {
                "mode": "drop",
                "rows": 100,
                "overlapping": 3,
                "dropped": 3,
                "eval_sets": {"eval:gen/tasks": 70},
                "sources": {
                    "eval:gen/tasks": {
                        "rows": 3,
                        "by_problem": 2,
                        "by_ngram": 1,
                        "examples": [
                            {"row": 4, "train": "What is 5 + `3`?", "eval": "What is 3 + 5?", "match": "problem"}
                        ],
                    }
                },
                "not_made_yet": ["held-out:apo"],
            }
        )
    )
    lines = decontamination_lines(
        [
            {"name": "sft", "output_dir": str(out), "makes_model": True, "script": "sft"},
            {"name": "pretrain", "output_dir": str(tmp_path / "p"), "makes_model": True, "script": "pretrain"},
        ]
    )
    text = "\n".join(lines)
    assert "| sft | drop | 100 | 3 | 3 | 1 |" in text
    assert "`sft` vs `eval:gen/tasks`: 3 rows (2 the same problem, 1 by n-grams)" in text
    assert "`What is 5 + '3'?` ~ `What is 3 + 5?` (problem)" in text
    assert "not made yet" in text and "not checked (their scripts read their data themselves): pretrain" in text
    assert decontamination_lines([{"name": "x", "output_dir": str(tmp_path / "none")}]) == []
