"""The steps every post-training stage shares, as plain functions (no base trainer): one stage shape.

Every stage's `main(script_args, training_args, model_args)` (align/sft/trainer.py, preference.py, grpo.py, distill.py)
reads top to bottom in the same order, with these steps around its own trainer and measurement:

    start("sft", script_args, training_args, model_args)        # seed, log the resolved config, check the model
    tokenizer, chat_template = load_tokenizer(model_args, training_args)
    data = load_data(script_args, training_args.output_dir)       # DatasetDict: "train" (+ "test"), decontaminated
    ...the stage's own data preparation...
    model = load_model(model_args)                                # dtype, attention, QLoRA from the same keys
    trainer = SomeTrainer(model=model, ..., peft_config=peft_config(model_args))
    prepare(trainer, script_args, "sft", raw_train=...)         # preflight checks, then atomic checkpoints + guard
    report["before"] = measure()                                  # the stage's own held-out metric
    report["train"] = train(trainer, training_args)               # resumes from the latest complete checkpoint
    save(trainer, tokenizer, training_args)                       # HF model dir; LoRA merged (merge_lora_on_save)
    report["after"] = measure()
    write_report(trainer, training_args.output_dir, "sft_eval.json", report)

The same keys mean the same thing in every stage: `merge_lora_on_save` (align.config.StageArgs), QLoRA's
`load_in_4bit` / `load_in_8bit` and LoRA's `use_peft`, `lora_*` (TRL's ModelConfig), `chat_template_path` and
`eos_token`, and for the stages that generate `rollout_backend` + `rollout_kwargs` (align.rollout.sampler).

Why saving is here: it is collective under DeepSpeed ZeRO-3 (`trainer.save_model` gathers the shards from all ranks;
calling it on rank 0 alone hangs), and a LoRA adapter must be merged so the next stage loads a plain HF model.
Merging a sharded PeftModel in place is not possible, so the adapter is saved first (collectively), then the main
process loads the base model whole, applies the saved adapter, merges and writes: the same on every launch.

Importing this module imports `data_gen`, which registers `builtin:tasks` with align.data.loading for every stage's
data.
"""

from __future__ import annotations

import json
import logging
import os
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path

import torch
import trl
from peft import PeftConfig, PeftModel
from transformers import TrainerCallback, set_seed

import data_gen  # noqa: F401  (registers builtin:tasks with align.data.loading for every stage's data)
from align.data.chat import setup_chat_format
from align.data.decontamination import decontaminate
from align.data.loading import get_dataset, held_out_splits
from align.eval.suite import EvalConfig, eval_items
from align.modeling import loading as models
from align.modeling.cpu_attention import fp32_attention
from align.runtime.checkpoint import FinishedAtResume, exit_if_preempted, install, resume_checkpoint, write_json_atomic
from align.runtime.device import setup_process
from align.runtime.distributed import world, zero3_init_disabled
from align.runtime.memory import trim_if_memory_low
from align.runtime.preflight import preflight

logger = logging.getLogger(__name__)

ADAPTER_DIR = "adapter"


# ----------------------------------------------------------------------------------------------- before training


def start(stage: str, script_args, training_args, model_args) -> None:
    """Set up the process (`setup_process`), seed every RNG, log the resolved config (rank 0) and refuse a run
    without a model to start from."""
    setup_process()
    set_seed(training_args.seed)
    if training_args.process_index == 0:
        logger.info("%s stage: script=%s\nmodel=%s\ntraining=%s", stage, script_args, model_args, training_args)
    if not model_args.model_name_or_path:
        raise ValueError(
            f"model_name_or_path is not set; point it at the model the {stage} stage starts from "
            "(e.g. outputs/tiny/sft)"
        )


def load_tokenizer(model_args, training_args):
    """(tokenizer, chat template text or None): the model's tokenizer with the recipe's `chat_template_path` and
    end-of-turn `eos_token` installed (a base model gets both here). The template is applied here, once: the field
    is cleared so that TRL does not apply it (and clone it into the model) again."""
    tokenizer = models.load_tokenizer(model_args.model_name_or_path)
    path = getattr(training_args, "chat_template_path", None)
    template = setup_chat_format(tokenizer, path, getattr(training_args, "eos_token", None))
    if path:
        training_args.chat_template_path = None
    return tokenizer, template


DECONTAMINATION_REPORT = "decontamination.json"


def load_data(script_args, output_dir: str | None = None):
    """The recipe's rows (`dataset_name` or `dataset_mixture`, align.data.loading): a DatasetDict with "train" (+
    "test").

    With `decontamination_eval_sets` (the pipeline sets it), the training rows are checked against every eval set
    it names and the stage's own held-out split, after loading, so any source or mixture is checked as the stage
    reads it (align/data/decontamination.py); what was found goes to `<output_dir>/decontamination.json`."""
    data = get_dataset(script_args)
    if not getattr(script_args, "decontamination_eval_sets", None):
        return data
    sets, missing = eval_sets(script_args.decontamination_eval_sets)
    if "test" in data and len(data["test"]):
        sets["held-out:this stage"] = data["test"].to_list()
    data["train"], report = decontaminate(
        data["train"],
        sets,
        script_args.decontamination,
        script_args.decontamination_ngram,
        script_args.decontamination_threshold,
    )
    report["not_made_yet"] = missing
    if output_dir and world()[0] == 0 and os.environ.get("RANK", "0") == "0":  # a launcher's rank before its group
        write_json_atomic(Path(output_dir) / DECONTAMINATION_REPORT, report, indent=2)
    return data


def eval_sets(path: str) -> tuple[dict[str, list[dict]], list[str]]:
    """({source: rows}, sources not made yet) of a decontamination file {eval: [eval recipe configs], held_out:
    {stage: its data keys}}: every item each eval config's suites score (align.eval.suite.eval_items) and every
    stage's held-out split (align.data.loading.held_out_splits), read now."""
    try:
        spec = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise ValueError(
            f"decontamination_eval_sets={path!r} cannot be read ({err}): point it at the JSON file the "
            "pipeline writes ({eval: [...], held_out: {...}}) or unset it"
        ) from None
    keys = {f.name for f in fields(EvalConfig)}
    sets: dict[str, list[dict]] = {}
    missing: list[str] = []
    for config in spec.get("eval") or []:
        cfg = EvalConfig(**{**{k: v for k, v in config.items() if k in keys}, "model_name_or_path": "(items only)"})
        for name, rows in eval_items(cfg).items():
            if rows is None:
                missing.append(f"eval:{name}")
            else:
                sets.setdefault(f"eval:{name}", []).extend(rows)
    for stage, keys_of_stage in (spec.get("held_out") or {}).items():
        found, absent = held_out_splits(keys_of_stage)
        missing += [f"held-out:{stage} ({source})" for source in absent]
        for source, rows in found.items():
            sets[f"held-out:{stage}" + (f" ({source})" if len(found) > 1 else "")] = rows.to_list()
    return sets, sorted(set(missing))


def load_model(model_args, name_or_path: str | None = None):
    """The model to train, from the ModelConfig keys every stage shares: `dtype`, `attn_implementation`, and QLoRA's
    `load_in_4bit` / `load_in_8bit` (bitsandbytes, CUDA only; the LoRA adapter comes from `peft_config`)."""
    kwargs = {}
    quantization = trl.get_quantization_config(model_args)
    if quantization is not None:
        if not torch.cuda.is_available():
            raise ValueError(
                "load_in_4bit / load_in_8bit (QLoRA) need a CUDA GPU and bitsandbytes; "
                "on CPU use plain LoRA (use_peft: true) instead"
            )
        # each rank's own GPU (TRL 1.x has no get_kbit_device_map)
        kwargs.update(quantization_config=quantization, device_map={"": models.local_device()})
    return models.load_model(
        name_or_path or model_args.model_name_or_path,
        dtype=model_args.dtype or "auto",
        attn_implementation=model_args.attn_implementation,
        **kwargs,
    )


def peft_config(model_args):
    """The LoRA adapter the recipe asks for (`use_peft`, `lora_r`, `lora_alpha`, ...), or None. Without
    `lora_target_modules`, PEFT's default modules for the architecture; where PEFT has none (SmolLM3, our pretrained
    models: PEFT raised "Please specify `target_modules`"), every linear layer but the head ("all-linear")."""
    config = trl.get_peft_config(model_args)
    if config is not None and config.target_modules is None and not getattr(config, "target_parameters", None):
        from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULTS

        model_type = _model_type(model_args.model_name_or_path)
        if model_type is not None and model_type not in DEFAULTS:
            config.target_modules = "all-linear"
            logger.info("LoRA: PEFT has no default modules for %s models: every linear layer but the head", model_type)
    return config


def _model_type(name_or_path: str) -> str | None:
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(models.resolve_model_path(name_or_path)).model_type
    except (OSError, ValueError):
        return None  # a hub id offline, a path not made yet: PEFT decides (and names what is missing)


def prepare(trainer, script_args, stage: str, **checks) -> None:
    """The preflight checks (align.runtime.preflight; `checks` are its keyword arguments), then atomic checkpoints, the
    non-finite guard and the engine resync after a resume (align.runtime.checkpoint). Every rank calls it."""
    preflight(trainer, script_args, stage=stage, **checks)
    install(trainer, script_args)


# ----------------------------------------------------------------------------------------------- training


class _TrimWhenMemoryLow(TrainerCallback):
    """After each step: the kept free memory goes back to the OS when the machine runs low (configs.trim_if_memory_low;
    a no-op where keep_freed_memory did not apply, e.g. on a GPU machine)."""

    def __init__(self):
        self.trims = 0

    def on_step_end(self, args, state, control, **kwargs):
        if trim_if_memory_low():
            self.trims += 1
            if self.trims == 1 or self.trims % 50 == 0:
                logger.info(
                    "step %d: memory low, kept free memory handed back to the OS (%d times so far)",
                    state.global_step,
                    self.trims,
                )


def train(trainer, training_args) -> dict:
    """Train, resuming from the latest complete checkpoint in output_dir (align.runtime.checkpoint.resume_checkpoint);
    return the trainer's numeric metrics with the first and last logged loss. On a CPU under bf16 autocast the
    trained model attends in fp32 (align/modeling/cpu_attention.py: sdpa's bf16 backward is about half as fast
    there)."""
    resume = resume_checkpoint(training_args)
    if not any(isinstance(c, _TrimWhenMemoryLow) for c in trainer.callback_handler.callbacks):
        trainer.add_callback(_TrimWhenMemoryLow())
    with fp32_attention(trainer.model):
        try:
            result = trainer.train(resume_from_checkpoint=resume)
        except FinishedAtResume as done:
            logger.info(
                "resumed from %s at step %s, the run's last: nothing left to train (its weights are the final model)",
                resume,
                done,
            )
            result = None
    exit_if_preempted(trainer)  # SIGTERM: the checkpoint is saved; no final model, no evaluation
    metrics = {} if result is None else {k: float(v) for k, v in result.metrics.items() if isinstance(v, (int, float))}
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    if losses:
        metrics["first_logged_loss"], metrics["last_logged_loss"] = losses[0], losses[-1]
    return metrics


@contextmanager
def own_precision(trainer):
    """Measure the model in its own dtype, as before training. `trainer.train()` has accelerate wrap the model's
    forward in bf16/fp16 autocast (mixed precision) and leaves it wrapped, so a held-out measurement taken after
    training would run in another precision than the one taken before it (greedy answers differ: 2 of 16 SmolLM2-135M
    held-out answers at identical weights), and in another than `scripts/evaluate.py` loading the saved model. Inside,
    the forward is accelerate's original one; it is put back on exit. (DeepSpeed bf16 casts the weights themselves;
    this does not change them.)"""
    with models.native_forward(trainer.accelerator.unwrap_model(trainer.model)):
        yield


def save(trainer, tokenizer, training_args) -> None:
    """The trained model as an HF directory in output_dir (`save_trained_model`, `merge_lora_on_save`)."""
    save_trained_model(
        trainer, tokenizer, training_args.output_dir, getattr(training_args, "merge_lora_on_save", True)
    )


def save_trained_model(trainer, tokenizer, output_dir: str, merge_lora: bool = True) -> None:
    """The trained model as an HF directory that `AutoModelForCausalLM.from_pretrained` loads (+ tokenizer).

    With LoRA and `merge_lora`: the adapter goes to `output_dir/adapter`, the merged model to `output_dir`; without
    `merge_lora` the adapter alone is saved to `output_dir`. Call on every rank; rank 0 writes."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    peft = hasattr(model, "peft_config")
    if peft and merge_lora:
        adapter_dir = os.path.join(output_dir, ADAPTER_DIR)
        trainer.save_model(adapter_dir)  # collective under ZeRO-3
        if trainer.accelerator.is_main_process:
            merge_adapter_dir(adapter_dir, output_dir)
    else:
        trainer.save_model(output_dir)
    if trainer.accelerator.is_main_process:
        tokenizer.save_pretrained(output_dir)  # the chat template travels with the tokenizer
    trainer.accelerator.wait_for_everyone()


def merge_adapter_dir(adapter_dir: str, output_dir: str) -> None:
    """Load the adapter's base model whole (outside ZeRO-3's partitioning), apply the adapter, merge, save."""
    base_path = PeftConfig.from_pretrained(adapter_dir).base_model_name_or_path
    with zero3_init_disabled():
        base = models.load_model(base_path, dtype="auto")
        merged = PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()
    merged.save_pretrained(output_dir, safe_serialization=True)
    logger.info("LoRA adapter %s merged into %s -> %s", adapter_dir, base_path, output_dir)


def round_dir(output_dir: str, k: int, rounds: int) -> str:
    """Where round k (1-based) of a stage's `rounds` saves its model (distillation's expert iteration, iterative APO):
    the stage's output_dir for the last round, output_dir/round-<k> before it."""
    return output_dir if k == rounds else os.path.join(output_dir, f"round-{k}")


def write_report(trainer, output_dir: str, filename: str, report: dict) -> None:
    """The stage's report as `<output_dir>/<filename>` (main process; the pipeline's manifest reads it)."""
    if trainer.accelerator.is_main_process:  # whole or not at all: a round's report marks it finished for a rerun
        write_json_atomic(os.path.join(output_dir, filename), report, indent=2)
