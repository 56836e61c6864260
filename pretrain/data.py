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
formatter: "data_gen.tasks:to_pretrain_text"}}` (specs and extra args go to `align.data.loading.load_source`;
see `load_documents`); in Python a source may also be a plain list of strings.

Streaming (`{spec: HuggingFaceFW/fineweb-edu, config: sample-10BT, streaming: true}`): a corpus too large for
memory is read as a `datasets.IterableDataset`, sharded per rank (`split_dataset_by_node`), optionally through
a seeded shuffle buffer (`shuffle_buffer: N`), and never held whole. Its held-out documents are the first
`eval_docs` of the unsharded stream (the same on every rank, skipped in training). As soon as one source
streams, the whole stream is sharded per rank: each rank packs its own rows from its own documents (and an
in-memory source gives each rank every world_size-th document), stage boundaries still follow the global token
count, and `state_dict()` gathers every rank's position (datasets' own iterator state: exact without a shuffle
buffer; with one, the documents in the buffer at checkpoint time are skipped on resume, as datasets documents).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass

import torch

from align.data.loading import load_source
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


STREAM_KEYS = ("streaming", "shuffle_buffer")


def _source_args(source) -> dict:
    if isinstance(source, str):
        source = {"spec": source}
    if not isinstance(source, dict) or "spec" not in source:
        raise ValueError(f"source {source!r}: expected a spec string, a list of texts, or {{spec: ..., ...}}")
    return dict(source)


def _row_to_text(spec: str, column: str, formatter, columns: list[str], tokenizer) -> Callable[[dict], str]:
    """How one row becomes a document: its `column`, the chat template over `messages`, or module:function."""
    if formatter == "chat":
        if "messages" not in columns or tokenizer is None:
            raise ValueError(f"source {spec!r}: formatter 'chat' needs a 'messages' column (has {columns})")
        return lambda row: tokenizer.apply_chat_template(row["messages"], tokenize=False)
    if formatter:
        import importlib

        module, _, name = str(formatter).partition(":")
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"source {spec!r}: formatter {formatter!r} is not an importable module:function") from e
    if column not in columns:
        raise ValueError(f"source {spec!r} has no column {column!r} (columns: {columns}); set text_column")
    return lambda row: row[column]


def load_documents(source, tokenizer=None) -> list[str]:
    """A source value -> its documents.

    `source` is a list of strings (used as is), a spec string for `align.data.loading.load_source`, or a dict
    {spec, text_column="text", formatter=None, config, split, **load_source args}. `formatter` turns each row
    into text: "chat" renders the `messages` column with the tokenizer's chat template (mid-training on the chat
    format), "module:function" imports a row -> str function (e.g. data_gen.tasks:to_pretrain_text).
    """
    if isinstance(source, list):
        return [str(t) for t in source]

    args = _source_args(source)
    spec, column, formatter = args.pop("spec"), args.pop("text_column", "text"), args.pop("formatter", None)
    for key in STREAM_KEYS:
        args.pop(key, None)
    ds = load_source(spec, **args)
    to_text = _row_to_text(spec, column, formatter, ds.column_names, tokenizer)
    if formatter == "chat":
        return [to_text({"messages": m}) for m in ds["messages"]]
    if formatter:
        return [to_text(row) for row in ds]
    return [t for t in ds[column] if t]


def is_streaming(source) -> bool:
    return isinstance(source, dict) and bool(source.get("streaming"))


class DocumentSource:
    """One source's documents in a per-epoch shuffled order, tokenized on demand, as `seq_len`-token chunks."""

    def __init__(
        self,
        name: str,
        texts: list[str],
        tokenizer,
        seq_len: int,
        seed: int,
        eval_docs: int = 0,
        eos: str = EOS,
        rank: int = 0,
        world_size: int = 1,
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
        self.texts = [texts[i] for i in sorted(order[num_eval:])][rank::world_size]  # sharded streams: every Nth
        if not self.texts:
            raise ValueError(f"source {name!r}: no training documents left for rank {rank} of {world_size}")
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


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8", "replace")).hexdigest()


class StreamingDocumentSource:
    """One source read as a stream: this rank's shard of an IterableDataset, tokenized document by document.

    Same interface as DocumentSource (next_chunk, eval_texts, state_dict); nothing but the current document's
    chunks is held. An epoch is one pass over this rank's shard; the next reshuffles (set_epoch).
    """

    def __init__(
        self,
        name: str,
        source: dict,
        tokenizer,
        seq_len: int,
        seed: int,
        eval_docs: int = 0,
        eos: str = EOS,
        rank: int = 0,
        world_size: int = 1,
    ):
        from datasets.distributed import split_dataset_by_node

        args = _source_args(source)
        spec, column, formatter = args.pop("spec"), args.pop("text_column", "text"), args.pop("formatter", None)
        buffer = int(args.pop("shuffle_buffer", 0) or 0)
        args.pop("streaming", None)
        stream = load_source(spec, streaming=True, **args)
        columns = list(stream.column_names or next(iter(stream)).keys())
        self.to_text = _row_to_text(spec, column, formatter, columns, tokenizer)
        self.name, self.tokenizer, self.seq_len, self.rank = name, tokenizer, seq_len, rank
        self.eos_id = document_separator_id(tokenizer, eos)
        # Held out: the first eval_docs documents of the whole (unshuffled, unsharded) stream, on every rank.
        self.eval_texts = []
        for row in stream:
            if len(self.eval_texts) >= eval_docs:
                break
            if text := self.to_text(row):
                self.eval_texts.append(text)
        self._held_out = {_digest(t) for t in self.eval_texts}
        if buffer:
            stream = stream.shuffle(seed=seed, buffer_size=buffer)  # one seed on every rank: one shard order
        self.stream = split_dataset_by_node(stream, rank=rank, world_size=world_size)
        self.epoch, self.pending, self._it, self._docs_this_epoch = 0, [], None, 0

    def _next_text(self) -> str:
        while True:
            if self._it is None:
                self.stream.set_epoch(self.epoch)
                self._it = iter(self.stream)
            try:
                row = next(self._it)
            except StopIteration:
                if not self._docs_this_epoch:
                    raise ValueError(f"source {self.name!r} has no training documents on rank {self.rank}") from None
                self.epoch, self._it, self._docs_this_epoch = self.epoch + 1, None, 0  # a new epoch starts fresh
                continue
            text = self.to_text(row)
            if text and _digest(text) not in self._held_out:
                self._docs_this_epoch += 1
                return text

    def next_chunk(self) -> list[int]:
        if not self.pending:
            ids = self.tokenizer(self._next_text(), add_special_tokens=False)["input_ids"]
            body = self.seq_len - 1
            self.pending = [[self.eos_id] + ids[i : i + body] for i in range(0, max(len(ids), 1), body)]
        return self.pending.pop(0)

    def state_dict(self) -> dict:
        # datasets' iterator state is the position after the last row read (it names its epoch).
        return {
            "epoch": self.epoch,
            "docs": self._docs_this_epoch,
            "stream": self.stream.state_dict(),
            "pending": [list(c) for c in self.pending],
        }

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self._docs_this_epoch = state["epoch"], state["docs"]
        self.pending = [list(c) for c in state["pending"]]
        self.stream.set_epoch(self.epoch)
        self.stream.load_state_dict(state["stream"])
        self._it = None


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
        # One streamed source shards the whole stream per rank (see the module doc); else every rank computes the
        # same global stream and keeps its slice, so N ranks train exactly like one process on the global batch.
        self.sharded = world_size > 1 and any(is_streaming(sources[n]) for n in used)
        shard = (rank, world_size) if self.sharded else (0, 1)
        # Only sources some stage uses are loaded (a recipe may list more).
        self.sources = {
            n: StreamingDocumentSource(n, sources[n], tokenizer, seq_len, seed, eval_docs, document_separator, *shard)
            if is_streaming(sources[n])
            else DocumentSource(
                n,
                load_documents(sources[n], tokenizer),
                tokenizer,
                seq_len,
                seed,
                eval_docs,
                document_separator,
                *shard,
            )
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
        # Sharded: every rank emits a row at the same time, so the global count is world_size rows.
        self.tokens_emitted += self.seq_len * (self.world_size if self.sharded else 1)
        return row

    def next_batch(self, num_rows: int) -> dict[str, torch.Tensor]:
        """This rank's `num_rows` rows of the next global batch of `num_rows * world_size` rows."""
        if self.sharded:
            return self.collate([self._next_row() for _ in range(num_rows)])
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
        """The stream's position. Sharded, it is collective (every rank must call it): all ranks' positions."""
        state = {
            "buffer": list(self.buffer),
            "tokens_emitted": self.tokens_emitted,
            "stage_index": self.stage_index,
            "stage_consumed": dict(self.stage_consumed),
            "sources": {n: s.state_dict() for n, s in self.sources.items()},
        }
        if not self.sharded:
            return state
        import torch.distributed as dist

        ranks = [None] * self.world_size
        dist.all_gather_object(ranks, state)
        return {"ranks": ranks}

    def load_state_dict(self, state: dict) -> None:
        if "ranks" in state or self.sharded:
            ranks = state.get("ranks", [])
            if not self.sharded or len(ranks) != self.world_size:
                raise ValueError(
                    f"data state was saved by {len(ranks) or 1} rank(s) with sharded streaming; resume with the "
                    f"same sources and number of processes (now {self.world_size})"
                )
            state = ranks[self.rank]
        missing = sorted(set(self.sources) - set(state["sources"]))
        if missing:
            raise ValueError(f"data state has no position for sources {missing}: was the mixture changed on resume?")
        self.buffer, self.tokens_emitted = list(state["buffer"]), state["tokens_emitted"]
        self.stage_index, self.stage_consumed = state["stage_index"], dict(state["stage_consumed"])
        for n, s in self.sources.items():
            s.load_state_dict(state["sources"][n])
