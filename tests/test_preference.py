"""align/preference/trainer.py: APO/DPO, KTO and ORPO train a tiny random model on task pairs; data errors are
clear."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest
import torch

from align.config import ModelConfig, ScriptArguments
from align.preference.accuracy import pair_token_ids, preference_accuracy
from align.preference.config import DPOConfig, KTOConfig, ORPOConfig
from align.preference.data import prepare_preference_data, to_unpaired
from align.preference.trainer import main
from data_gen.tasks import assistant_text, make_tasks, prompt_messages

FAMILIES = ["arithmetic", "compare", "count_items"]


def _pairs(split: str, num: int) -> list[dict]:
    """Chosen: the right answer in the boxed format; rejected: a wrong one, unboxed (as a weak model writes it).

    The format difference is what a tiny random model can learn in a few steps and carry to held-out pairs."""
    rows = []
    for r in make_tasks(FAMILIES, num=num, split=split, seed=0):
        rows.append(
            {
                "prompt": prompt_messages(r, "no_think"),
                "chosen": [{"role": "assistant", "content": assistant_text(r, "no_think")}],
                "rejected": [{"role": "assistant", "content": f"I think it is {int(r['answer']) + 1}."}],
            }
        )
    return rows


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, tiny_model):
    """A tiny random Llama + our tokenizer saved to a dir, and a dir of train/test pair files."""
    from pretrain.tokenizer import train_tokenizer

    # 1 thread: on a shared, loaded 2-core machine a 2-thread OpenMP pool spins and runs tiny ops ~50x slower
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("pref")
    train, test = _pairs("train", 64), _pairs("test", 24)
    texts = [m["content"] for row in train for m in row["prompt"] + row["chosen"] + row["rejected"]]
    tok = train_tokenizer(texts * 4, vocab_size=400)
    model = tiny_model(root / "model", tok, seed=0)
    data = root / "pairs"
    data.mkdir()
    for name, rows in (("train", train), ("test", test)):
        (data / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"model": model, "data": str(data), "root": root, "tokenizer": tok}


def _args(cls, out, **kw):
    base = dict(
        output_dir=str(out),
        max_steps=10,
        per_device_train_batch_size=8,
        learning_rate=5e-3,
        logging_steps=1,
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        seed=0,
        lr_scheduler_type="constant",
        max_length=128,
        bf16=False,
    )
    base.update(kw)
    return cls(**base)


def _run(tiny, cls, name, script_kw=None, model_kw=None, **kw):
    from transformers import AutoModelForCausalLM

    out = tiny["root"] / name
    metrics = main(
        ScriptArguments(dataset_name=tiny["data"], **(script_kw or {})),
        _args(cls, out, **kw),
        ModelConfig(model_name_or_path=tiny["model"], **(model_kw or {})),
    )
    start = AutoModelForCausalLM.from_pretrained(tiny["model"]).state_dict()
    trained = AutoModelForCausalLM.from_pretrained(out).state_dict()
    changed = [k for k in start if not torch.equal(start[k], trained[k])]
    return metrics, changed, start


def _assert_learned(metrics, changed, start, every_param=True):
    train = metrics["train"]
    assert train["last_logged_loss"] < train["first_logged_loss"], train
    if every_param:  # full fine-tuning: every weight moved (tied embeddings share one tensor)
        assert sorted(changed) == sorted(start), set(start) - set(changed)
    else:
        assert changed


def test_a_training_stage_runs_the_memory_valve_after_each_step(tiny, monkeypatch):
    # align.stage.train adds it for every stage: keep_freed_memory's kept free memory goes back when the machine runs
    # low
    import align.stage

    calls = []
    monkeypatch.setattr(align.stage, "trim_if_memory_low", lambda: calls.append(1) or False)
    _run(tiny, DPOConfig, "valve", loss_type="apo_zero", beta=0.1, max_steps=3)
    assert len(calls) == 3


def test_apo_zero_raises_held_out_preference_accuracy(tiny):
    metrics, changed, start = _run(tiny, DPOConfig, "apo", loss_type="apo_zero", beta=0.1)
    _assert_learned(metrics, changed, start)
    before, after = metrics["before"], metrics["after"]
    assert before["preference_accuracy"] == 0.5 and before["num_pairs"] == 24  # start model == reference: ties
    assert after["preference_accuracy"] >= 0.75 and after["mean_margin"] > 0, after
    saved = json.loads((tiny["root"] / "apo" / "preference_eval.json").read_text())
    assert saved["after"] == after and saved["loss_type"] == ["apo_zero"]


@pytest.mark.parametrize(
    "name, kw",
    [
        ("weighted", {"loss_type": ["sigmoid", "sft"], "loss_weights": [1.0, 0.5]}),
        ("ipo", {"loss_type": "ipo"}),
        ("apo_down_precomputed", {"loss_type": "apo_down", "precompute_ref_log_probs": True}),
    ],
)
def test_dpo_loss_variants_learn_the_preference(tiny, name, kw):
    metrics, changed, start = _run(tiny, DPOConfig, name, max_steps=6, **kw)
    _assert_learned(metrics, changed, start)
    assert metrics["after"]["preference_accuracy"] > 0.6, metrics["after"]


def test_dpo_with_lora_saves_a_merged_model(tiny):
    model_kw = {"use_peft": True, "lora_r": 4, "lora_alpha": 8, "lora_target_modules": ["q_proj", "v_proj"]}
    metrics, changed, _ = _run(
        tiny, DPOConfig, "lora", model_kw=model_kw, loss_type="apo_zero", max_steps=6, learning_rate=2e-2
    )
    assert changed and all(("q_proj" in k or "v_proj" in k) for k in changed), changed  # only the adapted layers
    assert (tiny["root"] / "lora" / "adapter" / "adapter_config.json").is_file()
    assert not (tiny["root"] / "lora" / "adapter_config.json").exists()  # the top dir is a plain HF model
    assert metrics["after"]["preference_accuracy"] > 0.5


def test_kto_trains_on_paired_data(tiny):
    metrics, changed, start = _run(tiny, KTOConfig, "kto", per_device_train_batch_size=16)
    _assert_learned(metrics, changed, start)
    assert metrics["after"]["preference_accuracy"] > 0.6, metrics["after"]


def test_orpo_trains_without_reference(tiny):
    metrics, changed, start = _run(tiny, ORPOConfig, "orpo", beta=0.5)
    _assert_learned(metrics, changed, start)
    assert (
        metrics["after"]["logp_accuracy"] > metrics["before"]["logp_accuracy"]
        or metrics["after"]["logp_accuracy"] >= 0.9
    ), metrics


def test_paired_to_unpaired_conversion():
    ds = datasets.Dataset.from_list(
        [
            {"prompt": "Q1", "chosen": "good", "rejected": "bad", "id": 1},
            {"prompt": "Q2", "chosen": "yes", "rejected": "no", "id": 2},
        ]
    )
    out = to_unpaired(ds)
    rows = sorted(out, key=lambda r: (r["id"], not r["label"]))
    assert [(r["prompt"], r["completion"], r["label"], r["id"]) for r in rows] == [
        ("Q1", "good", True, 1),
        ("Q1", "bad", False, 1),
        ("Q2", "yes", True, 2),
        ("Q2", "no", False, 2),
    ]
    # prepare_preference_data unpairs for KTO only, and keeps already-unpaired data as is
    assert set(prepare_preference_data(ds, "kto").column_names) >= {"prompt", "completion", "label"}
    assert set(prepare_preference_data(ds, "dpo").column_names) >= {"prompt", "chosen", "rejected"}
    # KTO samples sequentially and takes its KL term from batch neighbours: every batch must mix both labels
    many = datasets.Dataset.from_list([{"prompt": f"Q{i}", "chosen": "good", "rejected": "bad"} for i in range(32)])
    labels = to_unpaired(many, seed=0)["label"]
    assert sorted(labels) == [False] * 32 + [True] * 32
    assert all(0 < sum(labels[i : i + 8]) < 8 for i in range(0, 64, 8))
    assert to_unpaired(many, seed=None)["label"][:32] == [True] * 32  # TRL's own order: one label per block
    unpaired = datasets.Dataset.from_list([{"prompt": "Q", "completion": "A", "label": True}])
    assert len(prepare_preference_data(unpaired, "kto")) == 1


@pytest.mark.parametrize(
    "rows, kind, match",
    [
        (
            [{"prompt": "Q", "completion": "A"}],
            "dpo",
            r"lacks column\(s\) \['chosen', 'rejected'\]; it has \['completion', 'prompt'\]",
        ),
        ([{"prompt": "Q", "answer": "A", "rejected": "B"}], "orpo", r"lacks column\(s\) \['chosen'\]"),
        (
            [{"prompt": "Q", "chosen": "same", "rejected": "same"}] * 3,
            "dpo",
            r"empty after filtering: 3 rows, 0 with an empty chosen/rejected, 3 with chosen == rejected",
        ),
        ([{"prompt": "Q", "chosen": " ", "rejected": "x"}], "kto", r"empty after filtering: 1 rows, 1 with an empty"),
        ([{"prompt": "Q", "completion": "", "label": True}], "kto", r"all 1 completions are empty"),
    ],
)
def test_bad_data_errors_name_the_cause(rows, kind, match):
    with pytest.raises(ValueError, match=match):
        prepare_preference_data(datasets.Dataset.from_list(rows), kind)


def test_config_errors_name_the_field(tmp_path):
    with pytest.raises(ValueError, match=r"loss_type \['apo_zer'\] is not a DPO loss"):
        DPOConfig(output_dir=str(tmp_path), loss_type="apo_zer")
    with pytest.raises(ValueError, match=r"loss_type 'sigmoid' is not a KTO loss"):
        KTOConfig(output_dir=str(tmp_path), loss_type="sigmoid")


def test_preference_round_settings_fail_before_round_1_trains(tiny, tmp_path):
    """Iterative APO's settings are checked before anything trains, one line each naming the fix; a later round's pairs
    config is the recipe's with the previous round's model, its own output dir, the seed moved on and the overrides."""
    from align.preference.rounds import check, pairs_config

    recipe = Path(__file__).resolve().parents[1] / "recipes" / "smol135m/preferences.yaml"
    model = ModelConfig(model_name_or_path=tiny["model"])
    cases = [
        ({}, r"needs round_pairs_recipe"),
        ({"round_pairs_recipe": "recipes/tiny/preferences.yaml"}, r"must use method: graded"),
        (
            {"round_pairs_recipe": str(recipe), "round_pairs_overrides": {"num_sample": 4}},
            r"unknown key 'num_sample' in round_pairs_overrides; did you mean 'num_samples'\?",
        ),
        (
            {"round_pairs_recipe": str(recipe), "round_pairs_overrides": {"num_samples": "six"}},
            r"key 'num_samples' in round_pairs_overrides has value 'six' \(str\); expected int",
        ),
        ({"round_pairs_recipe": str(tmp_path / "missing.yaml")}, r"missing.yaml' not found"),
    ]
    for kw, match in cases:
        with pytest.raises(ValueError, match=match):  # a RecipeError is a ValueError: one line at the command line
            check(_args(DPOConfig, tmp_path / "out", preference_rounds=2, **kw), model)
    with pytest.raises(ValueError, match=r"needs merge_lora_on_save: true"):
        check(
            _args(
                DPOConfig,
                tmp_path / "out",
                preference_rounds=2,
                round_pairs_recipe=str(recipe),
                merge_lora_on_save=False,
            ),
            ModelConfig(model_name_or_path=tiny["model"], use_peft=True),
        )
    with pytest.raises(ValueError, match=r"preference_rounds must be >= 1"):
        main(
            ScriptArguments(dataset_name=tiny["data"]), _args(DPOConfig, tmp_path / "out", preference_rounds=0), model
        )
    assert not (tmp_path / "out").exists()
    args = _args(
        DPOConfig,
        tmp_path / "out",
        preference_rounds=3,
        round_pairs_recipe=str(recipe),
        round_pairs_overrides={"dataset_args": {"num": 1600, "seed": 3, "mode": "mixed"}},
    )
    script, cfg = pairs_config(args, 3, str(tmp_path / "out" / "round-2"))
    assert (cfg.policy_model, cfg.output_dir) == (
        str(tmp_path / "out" / "round-2"),
        str(tmp_path / "out" / "pairs-round-3"),
    )
    assert cfg.seed == 2 and cfg.num_samples == 6 and cfg.max_new_tokens_by_mode == {"think": 160, "no_think": 48}
    assert script.dataset_name == "builtin:tasks" and script.dataset_args == {"num": 1600, "seed": 3, "mode": "mixed"}


def test_pair_token_ids_split_at_the_assistant_turn(tiny):
    tok = tiny["tokenizer"]
    row = _pairs("test", 1)[0]
    prompt, chosen, rejected = pair_token_ids(tok, row)
    assert tok.decode(prompt).endswith("<|im_start|>assistant\n<think>\n\n</think>\n")
    assert tok.decode(chosen).startswith("The answer is \\boxed{") and tok.decode(chosen).endswith("<|im_end|>\n")
    assert chosen != rejected
    plain = pair_token_ids(tok, {"prompt": "Q: 1+1?", "chosen": " 2", "rejected": " 3"})
    assert tok.decode(plain[1]) == " 2<|im_end|>"  # plain text gets the eos appended, as TRL does


def test_preference_accuracy_counts_ties_as_half():
    t = torch.tensor
    m = preference_accuracy(t([0.0, 1.0, 2.0, 0.0]), t([0.0, 0.0, 3.0, 1.0]), t([0.0] * 4), t([0.0] * 4))
    assert m["preference_accuracy"] == pytest.approx((0.5 + 1 + 0 + 0) / 4)
    assert m["logp_accuracy"] == m["preference_accuracy"] and m["num_pairs"] == 4


def test_cli_missing_chosen_column_is_one_line(tiny, tmp_path, capsys):
    """The script's path (align.cli.run -> main) ends a bad dataset in one line and exit code 1."""
    from align.cli import run

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "Q", "completion": "A"}) + "\n")
    args = ["--dataset_name", str(bad), "--model_name_or_path", tiny["model"], "--output_dir", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as exit_info:
        run(main, ScriptArguments, DPOConfig, ModelConfig, args=args)
    assert exit_info.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert "lacks column(s) ['chosen', 'rejected']" in err[-1] and "generate_preferences" in err[-1]


@pytest.mark.parametrize(
    "recipe, cls, expect",
    [
        ("tiny/apo", DPOConfig, {"loss_type": ["apo_zero"]}),
        ("tiny/kto", KTOConfig, {"loss_type": "kto"}),
        ("tiny/orpo", ORPOConfig, {}),
        # the published recipe (alignment-handbook recipes/smollm3/dpo/apo.yaml)
        (
            "smollm3/apo",
            DPOConfig,
            {
                "loss_type": ["apo_zero"],
                "beta": 0.05,
                "learning_rate": 1e-6,
                "num_train_epochs": 1,
                "max_length": 24576,
                "max_grad_norm": 0.2,
            },
        ),
    ],
)
def test_recipes_parse_and_start_with_their_command(recipe, cls, expect):
    from align.cli import parse

    path = Path(__file__).resolve().parents[1] / "recipes" / f"{recipe}.yaml"
    first = path.read_text().splitlines()[0]
    assert first.startswith("# ") and f"recipes/{recipe}.yaml" in first
    script, training, model = parse(ScriptArguments, cls, ModelConfig, args=[str(path)])
    if recipe.startswith("smollm3"):  # smoltalk2's Preference splits, from the published SFT checkpoint
        assert {e["config"] for e in script.dataset_mixture["datasets"]} == {"Preference"}
        assert model.model_name_or_path.endswith("@it-SFT")
    else:
        assert script.dataset_name.endswith("preferences") and model.model_name_or_path.endswith("sft")
    for key, value in expect.items():
        assert getattr(training, key) == value, key


# ----------------------------------------------------------------------------- replay rows (replay_data)

CHATS = [("Who are you?", "I am a small assistant."), ("Say hello.", "Hello there!"), ("Name a colour.", "Blue.")]


def _replay_file(path: Path, times: int = 4) -> str:
    rows = [
        {
            "messages": [
                {"role": "system", "content": "/no_think"},
                {"role": "user", "content": q},
                {"role": "assistant", "content": a},
            ]
        }
        for q, a in CHATS * times
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _grads(tiny, loss_type, weights=None, shift=0.05):
    """TRL's DPO loss on a batch of replay rows (chosen == rejected), the policy moved off the reference by `shift`
    noise: the gradient of every weight, flattened."""
    import trl
    from transformers import AutoModelForCausalLM

    from align.preference.data import replay_pairs

    rows = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]} for q, a in CHATS]
    model = AutoModelForCausalLM.from_pretrained(tiny["model"])
    args = trl.DPOConfig(
        output_dir=str(tiny["root"] / "grads"),
        loss_type=loss_type,
        beta=0.1,
        report_to="none",
        per_device_train_batch_size=len(rows),
        max_length=64,
        bf16=False,
        **({"loss_weights": weights} if weights else {}),
    )
    trainer = trl.DPOTrainer(
        model=model, args=args, train_dataset=replay_pairs(rows), processing_class=tiny["tokenizer"]
    )
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(shift * torch.randn_like(p))
    batch = next(iter(trainer.get_train_dataloader()))
    model.zero_grad()
    trainer.compute_loss(model, batch).backward()
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


@pytest.mark.parametrize("loss_type", ["apo_zero", "sigmoid", "ipo"])
def test_replay_rows_train_only_the_nll_term(tiny, loss_type):
    """chosen == rejected: the preference term's gradient is zero (TRL's own loss), so [loss, sft] trains exactly
    what the weighted NLL term alone does; a loss outside REPLAY_LOSS_TYPES (bco_pair) would not cancel."""
    from align.preference.config import REPLAY_LOSS_TYPES

    assert loss_type in REPLAY_LOSS_TYPES and "bco_pair" not in REPLAY_LOSS_TYPES
    preference = _grads(tiny, [loss_type])
    nll = _grads(tiny, ["sft"])
    both = _grads(tiny, [loss_type, "sft"], [1.0, 0.5])
    assert nll.abs().max() > 1e-3
    # float rounding leaves chosen's and rejected's gradients apart by ~1e-7 of their size; the loss's slope at zero
    # margin scales that remainder: at most beta for sigmoid (beta/2) and apo_zero (beta/4 a side), 1/beta for ipo's
    # squared loss (beta = 0.1 in _grads)
    slope = 1 / 0.1 if loss_type == "ipo" else 0.1
    assert preference.abs().max() < 1e-5 * slope * nll.abs().max()
    torch.testing.assert_close(both, 0.5 * nll, rtol=1e-4, atol=1e-5 * nll.abs().max().item())
    assert _grads(tiny, ["bco_pair"]).abs().max() > 1e-3 * nll.abs().max()  # the control: this one does not cancel


def test_apo_with_replay_rows_learns_the_replay_answers_and_the_preference(tiny, tmp_path):
    """replay_data in a preference stage: its conversations join the pairs (logged count) and the NLL term makes
    their answers likelier, while the held-out pairs are still learned."""
    from transformers import AutoModelForCausalLM

    from align.preference.accuracy import pair_logps

    replay = _replay_file(tmp_path / "replay.jsonl")
    metrics, changed, start = _run(
        tiny,
        DPOConfig,
        "apo_replay",
        loss_type=["apo_zero", "sft"],
        loss_weights=[1.0, 0.5],
        beta=0.1,
        replay_data=replay,
        max_steps=8,
    )
    _assert_learned(metrics, changed, start)
    assert metrics["after"]["preference_accuracy"] >= 0.75, metrics["after"]
    rows = [
        {
            "prompt": [{"role": "system", "content": "/no_think"}, {"role": "user", "content": q}],
            "chosen": [{"role": "assistant", "content": a}],
            "rejected": [{"role": "assistant", "content": a}],
        }
        for q, a in CHATS
    ]
    logp = {}
    for name, path in (("start", tiny["model"]), ("trained", tiny["root"] / "apo_replay")):
        model = AutoModelForCausalLM.from_pretrained(path)
        logp[name] = pair_logps(model, tiny["tokenizer"], datasets.Dataset.from_list(rows), 4, None)[0]
    assert (logp["trained"] > logp["start"] + 1.0).all(), logp  # every replay answer: far likelier


def test_replay_data_errors_name_the_fix(tiny, tmp_path):
    from align.preference.data import add_replay

    replay = _replay_file(tmp_path / "replay.jsonl")
    with pytest.raises(ValueError, match=r"replay_data needs a DPO loss_type list with 'sft'.*e\.g\. loss_type: \["):
        DPOConfig(output_dir=str(tmp_path), loss_type="apo_zero", replay_data=replay)
    with pytest.raises(ValueError, match=r"replay_data needs .*\['bco_pair', 'sft'\]"):
        DPOConfig(output_dir=str(tmp_path), loss_type=["bco_pair", "sft"], replay_data=replay)
    with pytest.raises(ValueError, match=r"replay_data needs .*KTOConfig"):
        KTOConfig(output_dir=str(tmp_path), replay_data=replay)
    pairs = datasets.Dataset.from_list(_pairs("train", 2))
    (tmp_path / "pairs.jsonl").write_text(json.dumps(_pairs("train", 1)[0]) + "\n")
    with pytest.raises(ValueError, match=r"has no `messages` column .*generate_answers"):
        add_replay(pairs, str(tmp_path / "pairs.jsonl"))
    (tmp_path / "user_last.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    with pytest.raises(ValueError, match=r"row 0 has no conversation ending in an assistant turn"):
        add_replay(pairs, str(tmp_path / "user_last.jsonl"))
    (tmp_path / "no_role.jsonl").write_text(json.dumps({"messages": [{"content": "hi"}]}) + "\n")
    with pytest.raises(ValueError, match=r"row 0 has no conversation ending in an assistant turn"):
        add_replay(pairs, str(tmp_path / "no_role.jsonl"))
    both = add_replay(pairs, replay, limit=5)
    assert len(both) == len(pairs) + 5 and both[-1]["chosen"] == both[-1]["rejected"]
