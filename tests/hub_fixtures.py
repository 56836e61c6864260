"""Local dataset repositories shaped like the hub's (no tests here), for tests and CPU rehearsals of the recipes;
and a model repo in the HF hub cache's own layout (`cache_model`), so a recipe's hub model id is read offline.

A repo is a directory with `data/<config>/<split>-0000k-of-0000n.parquet` files and a README whose YAML front
matter lists them in a `configs:` block, exactly as the hub's parquet repos are laid out; `datasets.load_dataset`
and `align.data.hub` read it like a hub id. `build_mirror(root)` writes every repo the smollm3_* recipes name under
`root/<org>/<name>`, so `SMOLALIGN_DATA_MIRROR=root` serves them in place of the hub (recipes unchanged).

The split names below are the real ones the published recipes use (alignment-handbook recipes/smollm3/), so a
misspelt split in one of our recipes fails here as it would on the hub. Contents are synthetic and tiny.
"""

from __future__ import annotations

import random
from pathlib import Path

import yaml

SMOLTALK2 = "HuggingFaceTB/smoltalk2"
SMOLTALK2_SPLITS = {
    "SFT": [
        "smoltalk_smollm3_everyday_conversations_no_think",
        "smoltalk_smollm3_systemchats_30k_no_think",
        "tulu_3_sft_personas_instruction_following_no_think",
        "hermes_function_calling_v1_no_think",
        "smoltalk_smollm3_smol_magpie_ultra_no_think",
        "smoltalk_multilingual_8languages_lang_5_no_think",
        "table_gpt_no_think",
        "OpenHermes_2.5_no_think",
        "OpenThoughts3_1.2M_no_think_no_think",
        "Mixture_of_Thoughts_science_no_think",
        "smoltalk_smollm3_explore_instruct_rewriting_no_think",
        "smoltalk_smollm3_smol_rewrite_no_think",
        "smoltalk_smollm3_smol_summarize_no_think",
        "LongAlign_64k_context_lang_annotated_lang_6_no_think",
        "multi_turn_reasoning_if_think",
        "smoltalk_everyday_convs_reasoning_Qwen3_32B_think",
        "smoltalk_systemchats_Qwen3_32B_think",
        "xlam_traces_no_think",
        "smolagents_toolcalling_traces_think",
        "s1k_1.1_think",
        "LongAlign_64k_Qwen3_32B_yarn_131k_think",
        "aya_dataset_Qwen3_32B_think",
        "smoltalk_multilingual8_Qwen3_32B_think",
        "OpenThoughts3_1.2M_think",
        "table_gpt_Qwen3_32B_think",
    ],
    "Mid": ["Llama_Nemotron_Post_Training_Dataset_reasoning_r1", "OpenThoughts3_1.2M"],
    "Preference": [
        "llama_3.1_tulu_3_8b_preference_mixture_no_think",
        "tulu_3_8b_pref_mix_Qwen3_32B_Qwen3_0.6B_think",
    ],
}
WORDS = "the a cat dog sat ran on under mat log big small red blue and then it was very happy sad".split()


def _sentence(rng: random.Random, lo: int = 4, hi: int = 16) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi))) + "."


def write_repo(
    root: str | Path,
    configs: dict[str, dict[str, list[dict]]],
    readme: bool = True,
    num_files: int = 1,
    rows_per_group: int = 1000,
) -> Path:
    """A hub-shaped parquet repo: {config: {split: rows}} -> data/<config>/<split>-0000k-of-0000n.parquet files,
    listed in the README's `configs:` block by a glob pattern as the hub does."""
    import datasets

    root = Path(root)
    blocks = []
    for config, splits in configs.items():
        files = []
        for split, rows in splits.items():
            ds = datasets.Dataset.from_list(rows)
            for k in range(num_files):
                path = root / f"data/{config}/{split}-{k:05d}-of-{num_files:05d}.parquet"
                path.parent.mkdir(parents=True, exist_ok=True)
                ds.shard(num_files, k, contiguous=True).to_parquet(str(path), batch_size=rows_per_group)
            files.append({"split": split, "path": f"data/{config}/{split}-*"})
        blocks.append({"config_name": config, "data_files": files})
    if readme:
        front = yaml.safe_dump({"configs": blocks}, sort_keys=False)
        (root / "README.md").write_text(f"---\n{front}---\n# A local fixture shaped like a hub dataset repo\n")
    return root


def chat_rows(split: str, num: int, seed: int = 0) -> list[dict]:
    """smoltalk2 SFT/Mid rows: {messages, chat_template_kwargs} (think splits in think mode)."""
    rng = random.Random(f"{split}-{seed}")
    think = split.endswith("_think") and not split.endswith("no_think")
    rows = []
    for _ in range(num):
        answer = _sentence(rng)
        if think:
            answer = f"<think>\n{_sentence(rng)}\n</think>\n{answer}"
        messages = [{"role": "user", "content": _sentence(rng)}, {"role": "assistant", "content": answer}]
        rows.append({"messages": messages, "chat_template_kwargs": {"enable_thinking": think}})
    return rows


def preference_rows(split: str, num: int, seed: int = 0) -> list[dict]:
    """smoltalk2 Preference rows in TRL's conversational format: prompt / chosen / rejected message lists."""
    rng = random.Random(f"{split}-{seed}")
    think = split.endswith("_think") and not split.endswith("no_think")
    return [
        {
            "prompt": [{"role": "user", "content": _sentence(rng)}],
            "chosen": [{"role": "assistant", "content": _sentence(rng, 8, 20)}],
            "rejected": [{"role": "assistant", "content": _sentence(rng, 2, 6)}],
            "chat_template_kwargs": {"enable_thinking": think},
        }
        for _ in range(num)
    ]


def text_rows(num: int, seed: str, column: str = "text", words: int = 60) -> list[dict]:
    rng = random.Random(seed)
    return [{column: " ".join(_sentence(rng) for _ in range(max(1, words // 10)))} for _ in range(num)]


def build_mirror(root: str | Path, rows: int = 4, corpus_rows: int = 240) -> Path:
    """Every dataset repo the smollm3_* recipes read, shaped like the hub's, under root/<org>/<name>.

    Chat/preference splits get `rows` rows each; pretraining corpora `corpus_rows` documents (more than the
    recipes' 200 held-out documents per source)."""
    import datasets

    root = Path(root)
    smoltalk = {
        config: {s: (preference_rows if config == "Preference" else chat_rows)(s, rows) for s in splits}
        for config, splits in SMOLTALK2_SPLITS.items()
    }
    write_repo(root / SMOLTALK2, smoltalk)
    write_repo(root / "HuggingFaceFW/fineweb-edu", {"default": {"train": text_rows(corpus_rows, "fineweb")}})
    write_repo(root / "mlfoundations/dclm-baseline-1.0", {"default": {"train": text_rows(corpus_rows, "dclm")}})
    languages = ("fra_Latn", "spa_Latn", "deu_Latn", "ita_Latn", "por_Latn")
    write_repo(root / "epfml/FineWeb2-HQ", {lang: {"train": text_rows(corpus_rows, lang)} for lang in languages})
    math = ("finemath-3plus", "finemath-4plus", "infiwebmath-3plus", "infiwebmath-4plus")
    write_repo(root / "HuggingFaceTB/finemath", {c: {"train": text_rows(corpus_rows, c)} for c in math})
    # StarCoderData keeps one folder per language (load_dataset(..., data_dir="python")) and the code in `content`.
    code = root / "bigcode/starcoderdata/python"
    code.mkdir(parents=True, exist_ok=True)
    datasets.Dataset.from_list(text_rows(corpus_rows, "code", column="content")).to_parquet(
        str(code / "train-00000-of-00001.parquet")
    )
    return root


def cache_model(cache: str | Path, repo_id: str, model_dir: str | Path, commit: str = "0" * 40) -> Path:
    """`model_dir`'s files as the HF hub cache holds repo `repo_id` at `main`
    (`<cache>/models--org--name/{refs/main, snapshots/<commit>/...}`): with HF_HUB_CACHE=cache and HF_HUB_OFFLINE=1,
    from_pretrained(repo_id) and snapshot_download(repo_id) read it through the hub client's own code path."""
    import shutil

    repo = Path(cache) / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    shutil.copytree(model_dir, snapshot, dirs_exist_ok=True)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot
