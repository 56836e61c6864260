"""Preference data: pairs checked for shape, paired data made unpaired for KTO, replay rows added."""

from __future__ import annotations

import logging

from align.data.loading import load_replay_conversations

logger = logging.getLogger(__name__)


def _is_empty(value) -> bool:
    if value is None:
        return True
    if isinstance(value, str):
        return not value.strip()
    if isinstance(value, list):  # conversational: every message empty
        return all(_is_empty(m.get("content") if isinstance(m, dict) else m) for m in value)
    return False


def to_unpaired(dataset, seed: int | None = 0):
    """{prompt, chosen, rejected} -> {prompt, completion, label}: each pair gives a desirable and an undesirable row.

    The rows are shuffled under `seed` (None keeps TRL's order): TRL's KTO samples sequentially and estimates its KL
    term from each batch's neighbours, and unpairing writes a block of desirable rows then a block of undesirable
    ones, so unshuffled batches hold one label only and the KL term cancels the reward (the loss sits at 0.5)."""
    from trl.data_utils import unpair_preference_dataset

    out = unpair_preference_dataset(dataset)
    return out if seed is None else out.shuffle(seed=seed).flatten_indices()


def _is_text_or_messages(value) -> bool:
    if isinstance(value, str):
        return True
    return isinstance(value, list) and all(isinstance(m, dict) and "content" in m for m in value)


def _check_text_column(dataset, column: str, name: str, kind: str) -> None:
    """A number or a list of ids in `chosen` would reach TRL's tokenizer and die there with a TypeError."""
    for i, value in enumerate(dataset[column][:1000]):
        if value is not None and not _is_text_or_messages(value):
            raise ValueError(
                f"{name} dataset for {kind}: column '{column}' must hold text or a list of chat messages "
                f"({{role, content}}), but row {i} holds {type(value).__name__} {str(value)[:40]!r}"
            )


def prepare_preference_data(dataset, kind: str, name: str = "train", drop_identical: bool = True, seed: int = 0):
    """Check columns, drop rows that carry no preference, unpair for KTO. Raises ValueError naming the cause."""
    columns = set(dataset.column_names)
    paired = {"chosen", "rejected"} <= columns
    unpaired = {"prompt", "completion", "label"} <= columns
    if not paired and not (kind == "kto" and unpaired):
        missing = sorted({"chosen", "rejected"} - columns)
        accepted = "{prompt, chosen, rejected}" + (" or {prompt, completion, label}" if kind == "kto" else "")
        raise ValueError(
            f"{name} dataset for {kind} lacks column(s) {missing}; it has {sorted(columns)}. {kind} needs "
            f"{accepted}: make pairs with scripts/generate_preferences.py or rename the columns"
        )
    num_rows = len(dataset)
    if num_rows == 0:
        raise ValueError(f"{name} dataset for {kind} is empty (0 rows): check dataset_name / max_train_samples")
    text_columns = ["prompt", "chosen", "rejected"] if paired else ["prompt", "completion"]
    for column in text_columns:
        if column in columns:
            _check_text_column(dataset, column, name, kind)
    if paired:
        empty = dataset.filter(lambda r: not (_is_empty(r["chosen"]) or _is_empty(r["rejected"])))
        num_empty = num_rows - len(empty)
        kept = empty.filter(lambda r: r["chosen"] != r["rejected"]) if drop_identical else empty
        num_identical = len(empty) - len(kept)
        if len(kept) == 0:
            raise ValueError(
                f"{name} dataset for {kind} is empty after filtering: {num_rows} rows, {num_empty} with an empty "
                f"chosen/rejected, {num_identical} with chosen == rejected (drop_identical=True)"
            )
        if num_empty or num_identical:
            logger.warning(
                "%s: dropped %d empty and %d identical pairs of %d", name, num_empty, num_identical, num_rows
            )
        return to_unpaired(kept, seed) if kind == "kto" else kept
    kept = dataset.filter(lambda r: not _is_empty(r["completion"]))
    if len(kept) == 0:
        raise ValueError(f"{name} dataset for kto is empty after filtering: all {num_rows} completions are empty")
    return kept


def replay_pairs(conversations, features=None):
    """Conversations ({messages: [..., assistant]}) as pairs whose chosen and rejected are the last assistant turn:
    prompt = every message before it. `features`: the pair dataset's, so the two concatenate (other columns None)."""
    import datasets

    rows = []
    for i, row in enumerate(conversations):
        messages = row.get("messages")
        if not (
            messages
            and isinstance(messages, list)
            and all(isinstance(m, dict) and {"role", "content"} <= set(m) for m in messages)
            and messages[-1]["role"] == "assistant"
        ):
            raise ValueError(
                f"replay_data row {i} has no conversation ending in an assistant turn (a `messages` "
                f"list of {{role, content}}); got {str(messages)[:60]!r}"
            )
        turn = [{"role": "assistant", "content": messages[-1]["content"]}]
        prompt = [{"role": m["role"], "content": m["content"]} for m in messages[:-1]]
        rows.append({"prompt": prompt, "chosen": turn, "rejected": turn})
    if features is None:
        return datasets.Dataset.from_list(rows)
    return datasets.Dataset.from_list([{**dict.fromkeys(features), **r} for r in rows], features=features)


def add_replay(train, spec: str, limit: int | None = None):
    """The pairs + `spec`'s conversations as chosen == rejected rows (PreferenceArgs.replay_data)."""
    import datasets

    conversations = load_replay_conversations(spec, limit)
    if not {"prompt", "chosen", "rejected"} <= set(train.column_names) or not len(conversations):
        raise ValueError(f"replay_data {spec!r}: needs paired train data and at least one conversation")
    replay = replay_pairs(conversations, train.features)
    logger.info(
        "replay: %d conversations from %s added to %d pairs (chosen == rejected: NLL only)",
        len(replay),
        spec,
        len(train),
    )
    return datasets.concatenate_datasets([train, replay])
