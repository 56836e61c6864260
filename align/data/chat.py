"""Chat templates and assistant-token masks that work for ANY Jinja chat template.

Why: TRL's `assistant_only_loss` needs `{% generation %}` markers in the template, and most real templates
(Llama-3, Gemma, Mistral, Qwen, SmolLM3 ...) have none, so users get all-zero masks or train on the user's
words. Here a mask is computed for any template:

1. markers present -> the character spans that `{% generation %}` reports (TRL's way);
2. otherwise -> a template-independent method: render the conversation once with each assistant content
   replaced by a unique sentinel. The text around the sentinels is the template's scaffolding, so the real
   render can be cut into scaffolding and (possibly rewritten, e.g. think-stripped) assistant contents. The
   assistant's end-of-turn text is what the template writes after the content when the conversation ends at
   that turn (render of the prefix up to it), cut to what the next turn's scaffolding really starts with.

Character spans become token masks through the fast tokenizer's offsets: a token is trained when it overlaps
an assistant span (content + end-of-turn token, never the whitespace after it). An all-zero mask, or an
assistant turn whose content cannot be located, raises ValueError naming the template and the example index.

`tokenize_sft_dataset` turns {"messages"} or {"prompt", "completion"} datasets into pre-tokenized rows
({"input_ids", "assistant_masks"} / {"input_ids", "completion_mask"}) that TRL's SFTTrainer accepts as is.

    from align.data.chat import assistant_masks
    out = assistant_masks(tokenizer, messages)   # {"input_ids": [...], "assistant_masks": [0, 0, 1, ...]}
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

_GENERATION_RE = re.compile(r"\{%-?\s*(end)?generation\s*-?%\}")
_SENTINEL = "\u2063SMOLALIGN{}\u2063"  # invisible separator: survives trim/strip/split filters of templates


def has_generation_markers(template: str | None) -> bool:
    return bool(template) and _GENERATION_RE.search(template) is not None


def strip_generation_markers(template: str) -> str:
    """The same template without `{% generation %}` / `{% endgeneration %}` tags (renders identically)."""
    return _GENERATION_RE.sub("", template)


# SmolLM3's chat format, written for this project: ChatML turns, a system turn carrying the reasoning mode
# ("/think" unless enable_thinking=False; a /think or /no_think flag in the system text overrides it), an empty
# <think> block opening every no_think assistant turn, the <think> blocks of assistant turns before the last user
# turn stripped (those after it, e.g. a tool-calling turn and the answer after the tool's reply, keep them: what
# the model saw when it wrote the answer), and
# {% generation %} markers around each assistant content + <|im_end|>. (SmolLM3's released template adds a
# metadata and tools header to the system turn; clone it byte for byte with chat_template_path:
# HuggingFaceTB/SmolLM3-3B.)
SMOLLM3_TEMPLATE = (
    "{%- set ns = namespace(mode='/think', system='', last=-1) -%}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}{%- set ns.mode = '/no_think' -%}{%- endif -%}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set sys = messages[0]['content'] -%}"
    "{%- if '/no_think' in sys -%}{%- set ns.mode = '/no_think' -%}"
    "{%- elif '/think' in sys -%}{%- set ns.mode = '/think' -%}{%- endif -%}"
    "{%- set ns.system = sys.replace('/no_think', '').replace('/think', '').strip() -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for m in loop_messages -%}{%- if m['role'] == 'user' -%}{%- set ns.last = loop.index0 -%}{%- endif -%}"
    "{%- endfor -%}"
    "{{- '<|im_start|>system\\n' + (ns.system + '\\n' if ns.system else '') + ns.mode + '<|im_end|>\\n' -}}"
    "{%- for m in loop_messages -%}"
    "{%- set content = m['content'] if m['content'] is string else '' -%}"
    "{%- if m['role'] == 'assistant' -%}"
    "{%- if loop.index0 < ns.last and '</think>' in content -%}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}{%- endif -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if ns.mode == '/no_think' and '<think>' not in content -%}{{- '<think>\\n\\n</think>\\n' -}}{%- endif -%}"
    "{% generation %}{{- content + '<|im_end|>' -}}{% endgeneration %}{{- '\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + content + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
    "{%- if ns.mode == '/no_think' -%}{{- '<think>\\n\\n</think>\\n' -}}{%- endif -%}"
    "{%- endif -%}"
)

# Plain ChatML (the format of SmolLM3's reasoning mid-training): every turn as <|im_start|>role ... <|im_end|>.
CHATML_TEMPLATE = (
    "{%- for m in messages -%}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + (m['content'] if m['content'] is string else '') + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
BUILTIN_TEMPLATES = {"chatml": CHATML_TEMPLATE, "smollm3": SMOLLM3_TEMPLATE}


def load_chat_template(path_or_text: str) -> str:
    """A template from a builtin name (chatml, smollm3), a .jinja/.j2 file, a model dir or hub id whose tokenizer
    has one (e.g. HuggingFaceTB/SmolLM3-3B), or the template text itself."""
    if path_or_text in BUILTIN_TEMPLATES:
        return BUILTIN_TEMPLATES[path_or_text]
    if path_or_text.endswith((".jinja", ".j2")):
        path = Path(path_or_text)
        if not path.is_file():
            raise FileNotFoundError(f"chat_template_path {path_or_text!r} does not exist; pass a .jinja file")
        return path.read_text(encoding="utf-8")
    if "{{" in path_or_text or "{%" in path_or_text:
        return path_or_text
    from transformers import AutoTokenizer

    try:
        template = AutoTokenizer.from_pretrained(path_or_text).chat_template
    except (OSError, ValueError) as err:
        raise FileNotFoundError(
            f"chat_template_path {path_or_text!r} is no builtin ({', '.join(BUILTIN_TEMPLATES)}), .jinja file, "
            f"template text, or loadable tokenizer ({type(err).__name__})"
        ) from err
    if not isinstance(template, str) or not template:
        raise ValueError(f"chat_template_path {path_or_text!r}: that tokenizer has no chat template to clone")
    return template


def setup_chat_format(tokenizer: Any, chat_template: str | None = None, eos_token: str | None = None) -> str | None:
    """Install a chat template and its end-of-turn token as EOS on `tokenizer` (a base model's has neither).

    Returns the template text when one was given (None: the tokenizer's own stays). `eos_token` must already
    be a token of the vocabulary (SmolLM3's base tokenizer has <|im_end|>); the old EOS becomes the pad token if
    there was none or the pad was the new EOS, so padding never masks the token the model must learn to emit.
    The model side (config.eos_token_id, generation_config.eos_token_id, which generate() and vLLM stop on) is
    `install_eos`; TRL's SFTTrainer does the same when its `eos_token` is set.
    """
    template = load_chat_template(chat_template) if chat_template else None
    if template:
        tokenizer.chat_template = template
    if eos_token:
        if eos_token not in tokenizer.get_vocab():
            added = [t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values()]
            raise ValueError(
                f"eos_token={eos_token!r} is not a token of {getattr(tokenizer, 'name_or_path', '')!r}; name one it "
                f"has (its added tokens: {', '.join(added) or 'none'}), or add it to the tokenizer first"
            )
        old = tokenizer.eos_token
        tokenizer.eos_token = eos_token
        if old and old != eos_token and tokenizer.pad_token in (None, eos_token):
            tokenizer.pad_token = old
    return template


def install_eos(model: Any, tokenizer: Any) -> None:
    """Make the model stop where the tokenizer's EOS says: config.eos_token_id and generation_config (first)."""
    eos = tokenizer.eos_token_id
    model.config.eos_token_id = eos
    gen = getattr(model, "generation_config", None)
    if gen is not None:
        old = gen.eos_token_id if isinstance(gen.eos_token_id, list) else [gen.eos_token_id]
        gen.eos_token_id = [eos, *[i for i in old if i is not None and i != eos]]
        if gen.pad_token_id is None:
            gen.pad_token_id = tokenizer.pad_token_id


def template_name(tokenizer: Any, chat_template: str | None = None) -> str:
    """A short name for error messages: the tokenizer's name and a hash of the template text."""
    template = chat_template or getattr(tokenizer, "chat_template", None) or ""
    digest = hashlib.sha1(template.encode()).hexdigest()[:8]
    return f"chat template {digest} of {getattr(tokenizer, 'name_or_path', '') or type(tokenizer).__name__!r}"


def _get_template(tokenizer: Any, chat_template: str | None) -> str:
    template = chat_template or getattr(tokenizer, "chat_template", None)
    if not template:
        raise ValueError(
            f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no chat_template; set chat_template_path "
            "(a .jinja file) or use a tokenizer that ships one"
        )
    return template


def render(
    tokenizer: Any,
    messages: Sequence[dict],
    *,
    chat_template: str | None = None,
    add_generation_prompt: bool = False,
    tools: list | None = None,
    **template_kwargs: Any,
) -> str:
    """The conversation as text, exactly as the template writes it."""
    return tokenizer.apply_chat_template(
        list(messages),
        chat_template=_get_template(tokenizer, chat_template),
        tools=tools,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        **template_kwargs,
    )


def _content(message: dict) -> str:
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    # multimodal-style content blocks: the text parts, in order
    return "".join(block.get("text", "") for block in content if isinstance(block, dict))


def _marker_spans(tokenizer: Any, messages, template: str, tools, template_kwargs) -> tuple[str, list]:
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, indices = render_jinja_template(
        conversations=[list(messages)],
        tools=tools,
        chat_template=template,
        return_assistant_tokens_mask=True,
        **{**tokenizer.special_tokens_map, **template_kwargs},
    )
    return rendered[0], [tuple(span) for span in indices[0]]


def _leading_special(text: str, specials: list[str]) -> str:
    """The longest special token that `text` starts with ('' if none)."""
    hits = [s for s in specials if s and text.startswith(s)]
    return max(hits, key=len) if hits else ""


def _sentinel_spans(
    tokenizer: Any, messages, template: str, tools, template_kwargs, where: str, turns: set[int] | None
) -> tuple[str, list]:
    """Assistant spans (content + end-of-turn) of the real render, found without generation markers."""
    kw = dict(chat_template=template, tools=tools, **template_kwargs)
    assistant_idx = [i for i, m in enumerate(messages) if m.get("role") == "assistant" and _content(m)]
    sentinels = {i: _SENTINEL.format(i) for i in assistant_idx}
    masked = [{**m, "content": sentinels[i]} if i in sentinels else dict(m) for i, m in enumerate(messages)]
    full = render(tokenizer, messages, **kw)
    skeleton = render(tokenizer, masked, **kw)

    # skeleton = part_0 S_a part_1 S_b ... part_n: the parts are the scaffolding (with every non-assistant message)
    parts, pos = [], 0
    for i in assistant_idx:
        at = skeleton.find(sentinels[i], pos)
        if at < 0 or skeleton.count(sentinels[i]) != 1:
            raise ValueError(
                f"{where}: assistant turn {i} content cannot be located in the rendered text (the template "
                "drops, repeats or reorders it); fix the template or add {% generation %} markers"
            )
        parts.append(skeleton[pos:at])
        pos = at + len(sentinels[i])
    parts.append(skeleton[pos:])

    specials = list(getattr(tokenizer, "all_special_tokens", [])) + [
        t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values()
    ]
    spans, cursor = [], 0
    for k, i in enumerate(assistant_idx):
        before, after = parts[k], parts[k + 1]
        if not full.startswith(before, cursor):
            raise ValueError(
                f"{where}: assistant turn {i} content cannot be located in the rendered text (the scaffolding "
                "before it changes with the assistant's content); add {% generation %} markers to the template"
            )
        start = cursor + len(before)
        end = full.rfind(after) if k == len(assistant_idx) - 1 else full.find(after, start)
        if after == "" and k == len(assistant_idx) - 1:
            end = len(full)
        rendered = full[start:end] if end >= start else ""
        original = _content(messages[i])
        located = rendered.strip() and (rendered.strip() in original or original.strip() in rendered)
        if end < start or not located:
            raise ValueError(
                f"{where}: assistant turn {i} content {original[:40]!r} cannot be located in the rendered text "
                f"(found {rendered[:40]!r}); add {{% generation %}} markers to the template"
            )
        # End-of-turn: what the template writes after this content when the conversation stops here, cut to
        # what really follows it in the full render; trailing whitespace (ChatML's "\n") is scaffolding.
        try:
            prefix = render(tokenizer, masked[: i + 1], **kw)
            tail = prefix[prefix.rfind(sentinels[i]) + len(sentinels[i]) :]
            n = 0
            while n < min(len(tail), len(after)) and tail[n] == after[n]:
                n += 1
            eot = after[:n].rstrip()
        except Exception:  # templates that refuse a conversation ending on an assistant turn
            eot = ""
        if not eot:
            eot = _leading_special(after, specials)
        if turns is None or i in turns:
            spans.append((start, end + len(eot)))
        cursor = end
    return full, spans


def _spans_to_mask(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[int]:
    mask = [0] * len(offsets)
    for t, (s, e) in enumerate(offsets):
        for a, b in spans:
            # a token overlapping the span (zero-width offsets count by their start) is trained
            if (s < b and e > a) or (s == e and a <= s < b):
                mask[t] = 1
                break
    return mask


def assistant_masks(
    tokenizer: Any,
    messages: Sequence[dict],
    *,
    chat_template: str | None = None,
    tools: list | None = None,
    example_index: int = 0,
    method: str = "auto",
    turns: set[int] | None = None,
    **template_kwargs: Any,
) -> dict[str, list[int]]:
    """Token ids of the rendered conversation and a 0/1 mask of the assistant tokens to train.

    method: "auto" (generation markers when the template has them, else sentinels), "markers" or "sentinel".
    turns: only these message indices count as trained (e.g. the completion turns of a prompt/completion row).
    """
    if method not in ("auto", "markers", "sentinel"):
        raise ValueError(f"method={method!r}; valid: 'auto', 'markers', 'sentinel'")
    template = _get_template(tokenizer, chat_template)
    where = f"{template_name(tokenizer, template)}, example {example_index}"
    use_markers = method == "markers" or (method == "auto" and has_generation_markers(template))
    if use_markers and turns is None:
        text, spans = _marker_spans(tokenizer, messages, template, tools, template_kwargs)
    else:
        # Markers cannot tell turns apart, so a turn subset always goes through the sentinel method.
        template = strip_generation_markers(template)
        text, spans = _sentinel_spans(tokenizer, messages, template, tools, template_kwargs, where, turns)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = _spans_to_mask(enc["offset_mapping"], spans)
    if not any(mask):
        raise ValueError(
            f"{where}: the assistant mask is all zeros (no assistant turn with content, or a template whose "
            "{% generation %} markers wrap nothing); check the data's roles and the template"
        )
    return {"input_ids": list(enc["input_ids"]), "assistant_masks": mask}


def completion_mask(
    tokenizer: Any,
    prompt: str | list[dict],
    completion: str | list[dict],
    *,
    chat_template: str | None = None,
    tools: list | None = None,
    example_index: int = 0,
    **template_kwargs: Any,
) -> dict[str, list[int]]:
    """{"input_ids", "completion_mask"} for a prompt/completion pair (conversational or plain text)."""
    if isinstance(prompt, list) != isinstance(completion, list):
        raise ValueError(f"example {example_index}: prompt and completion must both be text or both be messages")
    if isinstance(prompt, list):
        out = assistant_masks(
            tokenizer,
            prompt + completion,
            chat_template=chat_template,
            tools=tools,
            example_index=example_index,
            turns=set(range(len(prompt), len(prompt) + len(completion))),
            **template_kwargs,
        )
        return {"input_ids": out["input_ids"], "completion_mask": out["assistant_masks"]}
    eos = tokenizer.eos_token or ""
    text = prompt + (completion if completion.endswith(eos) else completion + eos)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = _spans_to_mask(enc["offset_mapping"], [(len(prompt), len(text))])
    if not any(mask):
        raise ValueError(f"example {example_index}: empty completion; every row needs completion text")
    return {"input_ids": list(enc["input_ids"]), "completion_mask": mask}


def tokenize_sft_dataset(
    dataset: Any,
    tokenizer: Any,
    *,
    assistant_only_loss: bool = True,
    chat_template: str | None = None,
    num_proc: int | None = None,
    name: str = "train",
    method: str = "auto",
) -> Any:
    """Pre-tokenize a {"messages"} or {"prompt", "completion"} dataset for TRL's SFTTrainer.

    messages -> {"input_ids", "assistant_masks"} ({"input_ids"} only when assistant_only_loss is False);
    prompt/completion -> {"input_ids", "completion_mask"} (set SFTConfig.completion_only_loss=True to apply it).
    method: how assistant masks are found (see `assistant_masks`).
    A per-row "chat_template_kwargs" column (e.g. {"enable_thinking": False}) and "tools" column are honoured.
    """
    columns = set(dataset.column_names)
    if "messages" in columns:
        kind = "messages"
    elif {"prompt", "completion"} <= columns:
        kind = "prompt_completion"
    else:
        raise ValueError(
            f"{name} dataset has columns {sorted(columns)}; SFT needs 'messages' or 'prompt' + 'completion'"
        )

    def one(row: dict, idx: int) -> dict:
        kwargs = dict(row.get("chat_template_kwargs") or {})
        tools = row.get("tools")
        if kind == "messages":
            if not assistant_only_loss:
                text = render(tokenizer, row["messages"], chat_template=chat_template, tools=tools, **kwargs)
                return {"input_ids": tokenizer(text, add_special_tokens=False)["input_ids"]}
            return assistant_masks(
                tokenizer,
                row["messages"],
                chat_template=chat_template,
                tools=tools,
                example_index=idx,
                method=method,
                **kwargs,
            )
        return completion_mask(
            tokenizer,
            row["prompt"],
            row["completion"],
            chat_template=chat_template,
            tools=tools,
            example_index=idx,
            **kwargs,
        )

    return dataset.map(
        one,
        with_indices=True,
        remove_columns=dataset.column_names,
        num_proc=num_proc,
        desc=f"Tokenizing {name} with assistant masks",
    )
