"""Packed, document-masked pretraining data with staged mixtures and an exact, saveable position.

What: documents from named sources are tokenized lazily, each prefixed with `<|endoftext|>` (so the
model learns to start and end documents), cut into chunks of at most `seq_len` tokens, and packed
back-to-back into rows of `seq_len + 1` tokens (inputs = row[:-1], targets = row[1:]).
Intra-document masking: `position_ids` restart at every `<|endoftext|>` (and at every row start);
transformers' SmolLM3 turns restarting positions into a block-diagonal causal mask when no
attention_mask is passed, so attention never crosses a document boundary.

Staged mixtures (the SmolLM3 playbook's curriculum): a list of stages, each a token budget and source
weights. Weights are TOKEN shares, met exactly by a deterministic "most behind its share goes next"
rule (no sampler RNG to save). The whole stream is a pure function of (sources, stages, seed);
each rank keeps its own contiguous slice of every global batch, so ranks never overlap, and
`state_dict()` captures the position so a resumed run sees exactly the tokens it would have seen.

How to use:

    stream = PackedStream(sources, stages, tokenizer, seq_len=512, seed=0, rank=0, world_size=1)
    batch = stream.next_batch(8)   # {"input_ids", "targets", "position_ids"}: (8, 512) int64
    state = stream.state_dict(); ...; stream.load_state_dict(state)
    eval_batches = stream.eval_batches(num_rows=16)   # {source: batch} from held-out documents

Sources in a recipe: `sources: {news: builtin:news, tasks: {spec: builtin:tasks, num: 20000,
formatter: "data_gen.tasks:to_pretrain_text"}}` (specs and extra args go to `align.data.load_source`;
see `load_documents`); in Python a source may also be a plain list of strings.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from pretrain.tokenizer import EOS


@dataclass
class Stage:
    """One curriculum stage: a token budget and token-share weights per source name."""

    name: str
    num_tokens: int
    weights: dict[str, float]


def parse_stages(stages: list[dict], source_names: list[str]) -> list[Stage]:
    """Validate the recipe's `stages` (list of {name, num_tokens, weights}) and normalise weights."""
    if not stages:
        raise ValueError("stages is empty: give at least one {name, num_tokens, weights: {source: weight}}")
    out = []
    for i, s in enumerate(stages):
        unknown = set(s) - {"name", "num_tokens", "weights"}
        if unknown or "weights" not in s or "num_tokens" not in s:
            raise ValueError(f"stages[{i}]={s}: needs keys num_tokens, weights (and optional name); got {sorted(s)}")
        weights = {k: float(v) for k, v in s["weights"].items() if float(v) > 0}
        missing = sorted(set(weights) - set(source_names))
        if missing:
            raise ValueError(f"stages[{i}].weights names unknown sources {missing}; known: {sorted(source_names)}")
        if not weights or int(s["num_tokens"]) <= 0:
            raise ValueError(f"stages[{i}] needs positive num_tokens and at least one positive weight")
        total = sum(weights.values())
        out.append(Stage(s.get("name", f"stage{i}"), int(s["num_tokens"]), {k: v / total for k, v in weights.items()}))
    return out


def load_documents(source, tokenizer=None) -> list[str]:
    """A source value -> its documents.

    `source` is a list of strings (used as is), a spec string for `align.data.load_source`, or a dict
    {spec, text_column="text", formatter=None, **load_source args}. `formatter` turns each row into text:
    "chat" renders the `messages` column with the tokenizer's chat template (mid-training on the chat
    format), "module:function" imports a row -> str function (e.g. data_gen.tasks:to_pretrain_text).
    """
    if isinstance(source, list):
        return [str(t) for t in source]
    if isinstance(source, str):
        source = {"spec": source}
    if not isinstance(source, dict) or "spec" not in source:
        raise ValueError(f"source {source!r}: expected a spec string, a list of texts, or {{spec: ..., ...}}")
    from align.data import load_source  # the shared loader (hub ids, local files, builtin:NAME)

    args = dict(source)
    spec, column, formatter = args.pop("spec"), args.pop("text_column", "text"), args.pop("formatter", None)
    ds = load_source(spec, **args)
    if formatter == "chat":
        if "messages" not in ds.column_names or tokenizer is None:
            raise ValueError(f"source {spec!r}: formatter 'chat' needs a 'messages' column (has {ds.column_names})")
        return [tokenizer.apply_chat_template(m, tokenize=False) for m in ds["messages"]]
    if formatter:
        import importlib

        module, _, name = str(formatter).partition(":")
        try:
            fn = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"source {spec!r}: formatter {formatter!r} is not an importable module:function") from e
        return [fn(row) for row in ds]
    if column not in ds.column_names:
        raise ValueError(f"source {spec!r} has no column {column!r} (columns: {ds.column_names}); set text_column")
    return [t for t in ds[column] if t]


class DocumentSource:
    """One source's documents in a per-epoch shuffled order, tokenized on demand, as `seq_len`-token chunks."""

    def __init__(
        self, name: str, texts: list[str], tokenizer, seq_len: int, seed: int, eval_docs: int = 0, eos: str = EOS
    ):
        if not texts:
            raise ValueError(f"source {name!r} has no documents")
        self.name, self.tokenizer, self.seq_len, self.seed = name, tokenizer, seq_len, seed
        self.eos_id = document_separator_id(tokenizer, eos)
        # Held-out documents are chosen by a fixed shuffle that does not depend on the training seed.
        order = list(range(len(texts)))
        random.Random(f"heldout-{name}").shuffle(order)
        num_eval = min(eval_docs, len(texts) - 1)
        self.eval_texts = [texts[i] for i in order[:num_eval]]
        self.texts = [texts[i] for i in sorted(order[num_eval:])]
        self._cache: dict[int, list[list[int]]] = {}
        self.epoch, self.cursor, self.pending = 0, 0, []

    def _chunks(self, index: int) -> list[list[int]]:
        if index not in self._cache:
            ids = self.tokenizer(self.texts[index], add_special_tokens=False)["input_ids"]
            body = self.seq_len - 1  # each chunk = [<|endoftext|>] + at most seq_len - 1 tokens
            self._cache[index] = [[self.eos_id] + ids[i : i + body] for i in range(0, max(len(ids), 1), body)]
        return self._cache[index]

    def _order(self, epoch: int) -> list[int]:
        order = list(range(len(self.texts)))
        random.Random(f"{self.seed}-{self.name}-{epoch}").shuffle(order)
        return order

    def next_chunk(self) -> list[int]:
        if not self.pending:
            order = self._order(self.epoch)
            self.pending = list(self._chunks(order[self.cursor]))
            self.cursor += 1
            if self.cursor == len(order):
                self.epoch, self.cursor = self.epoch + 1, 0
        return self.pending.pop(0)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "cursor": self.cursor, "pending": [list(c) for c in self.pending]}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.cursor, self.pending = state["epoch"], state["cursor"], [list(c) for c in state["pending"]]


def document_separator_id(tokenizer, token: str = EOS) -> int:
    """Id of the token that starts every packed document; ValueError if the tokenizer lacks it."""
    tid = tokenizer.convert_tokens_to_ids(token)
    if tid is None or tid == tokenizer.unk_token_id:
        raise ValueError(f"document_separator {token!r} is not a token of this tokenizer; name one it has")
    return tid


def position_ids_for(input_ids: torch.Tensor, eos_id: int) -> torch.Tensor:
    """Positions restarting at 0 at every `<|endoftext|>` and at the row start. (B, T) -> (B, T)."""
    B, T = input_ids.shape
    idx = torch.arange(T, device=input_ids.device).expand(B, T)
    is_start = input_ids == eos_id
    is_start[:, 0] = True
    last_start = torch.where(is_start, idx, torch.zeros_like(idx)).cummax(dim=1).values
    return idx - last_start


class PackedStream:
    """The deterministic global stream of packed rows; this rank's share of each batch; a saveable position."""

    def __init__(
        self,
        sources: dict[str, object],
        stages: list[dict] | list[Stage],
        tokenizer,
        seq_len: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        eval_docs: int = 0,
        document_separator: str = EOS,
    ):
        if seq_len < 2:
            raise ValueError(f"seq_len={seq_len} must be >= 2")
        self.stages = stages if stages and isinstance(stages[0], Stage) else parse_stages(stages, list(sources))
        used = sorted({name for s in self.stages for name in s.weights})
        # Only sources some stage uses are loaded (a recipe may list more).
        self.sources = {
            n: DocumentSource(n, load_documents(sources[n], tokenizer), tokenizer, seq_len, seed, eval_docs)
            for n in used
        }
        self.seq_len, self.rank, self.world_size = seq_len, rank, world_size
        self.eos_id = document_separator_id(tokenizer, document_separator)
        self.buffer: list[int] = []
        self.tokens_emitted = 0  # global, over all ranks
        self.stage_consumed: dict[str, int] = {}  # tokens taken per source in the current stage
        self.stage_index = 0

    @property
    def total_tokens(self) -> int:
        return sum(s.num_tokens for s in self.stages)

    def current_stage(self) -> Stage:
        return self.stages[self.stage_index]

    def _advance_stage(self) -> None:
        # The stage is decided per document by the global token count; the last stage runs on past its budget.
        bound = sum(s.num_tokens for s in self.stages[: self.stage_index + 1])
        while self.stage_index < len(self.stages) - 1 and self.tokens_emitted >= bound:
            self.stage_index += 1
            self.stage_consumed = {}
            bound += self.stages[self.stage_index].num_tokens

    def _next_chunk(self) -> list[int]:
        weights = self.current_stage().weights
        # The source furthest behind its token share goes next; ties break by name (deterministic).
        name = min(sorted(weights), key=lambda n: self.stage_consumed.get(n, 0) / weights[n])
        chunk = self.sources[name].next_chunk()
        self.stage_consumed[name] = self.stage_consumed.get(name, 0) + len(chunk)
        return chunk

    def _next_row(self) -> list[int]:
        while len(self.buffer) < self.seq_len + 1:
            self._advance_stage()
            self.buffer.extend(self._next_chunk())
        row, self.buffer = self.buffer[: self.seq_len + 1], self.buffer[self.seq_len + 1 :]
        self.tokens_emitted += self.seq_len
        return row

    def next_batch(self, num_rows: int) -> dict[str, torch.Tensor]:
        """This rank's `num_rows` rows of the next global batch of `num_rows * world_size` rows."""
        rows = [self._next_row() for _ in range(num_rows * self.world_size)]
        mine = rows[self.rank * num_rows : (self.rank + 1) * num_rows]
        return self.collate(mine)

    def collate(self, rows: list[list[int]]) -> dict[str, torch.Tensor]:
        data = torch.tensor(rows, dtype=torch.long)  # (B, T + 1)
        input_ids = data[:, :-1].contiguous()
        return {
            "input_ids": input_ids,
            "targets": data[:, 1:].contiguous(),
            "position_ids": position_ids_for(input_ids, self.eos_id),
        }

    def eval_batches(self, num_rows: int) -> dict[str, dict[str, torch.Tensor]]:
        """{source: batch of up to num_rows packed rows of its held-out documents} (same on every rank)."""
        out = {}
        for name, src in self.sources.items():
            stream: list[int] = []
            for text in src.eval_texts:
                ids = [self.eos_id] + src.tokenizer(text, add_special_tokens=False)["input_ids"]
                stream.extend(ids)
                if len(stream) >= num_rows * (self.seq_len + 1):
                    break
            n = min(num_rows, len(stream) // (self.seq_len + 1))
            if n:
                L = self.seq_len + 1
                out[name] = self.collate([stream[i * L : (i + 1) * L] for i in range(n)])
        return out

    def state_dict(self) -> dict:
        return {
            "buffer": list(self.buffer),
            "tokens_emitted": self.tokens_emitted,
            "stage_index": self.stage_index,
            "stage_consumed": dict(self.stage_consumed),
            "sources": {n: s.state_dict() for n, s in self.sources.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        missing = sorted(set(self.sources) - set(state["sources"]))
        if missing:
            raise ValueError(f"data state has no position for sources {missing}: was the mixture changed on resume?")
        self.buffer, self.tokens_emitted = list(state["buffer"]), state["tokens_emitted"]
        self.stage_index, self.stage_consumed = state["stage_index"], dict(state["stage_consumed"])
        for n, s in self.sources.items():
            s.load_state_dict(state["sources"][n])
