"""The pipeline's plan: its recipe (`PipelineConfig`) and each stage resolved from it, in order, before anything runs.

A pipeline recipe lists stages; each names a script (pretrain, sft, generate_preferences, dpo, kto, orpo, apo,
grpo, distill, train_tokenizer, or a path to a .py file), that stage's own recipe, overrides, and optionally an
accelerate config. A value `${sft.output_dir}` is read from an earlier stage's resolved config (recipe +
overrides), so each stage's model feeds the next; `${run_dir}` is the pipeline's run directory.
align/pipeline/run.py runs the plan (and documents how).

`start_at` starts the pipeline at a stage: the stages before it are resolved (later stages may read their keys) but
never run. What they would have made, their `output_dir`, is read from `inputs` when the recipe declares it
(`inputs: {sft: {output_dir: HuggingFaceTB/SmolLM3-3B}}`), else from their finished output of an earlier run; a
stage that runs and reads an output that is neither is refused at start, with the `inputs` line to add.

    stages = resolve_stages(PipelineConfig(stages=[...]))     # each Stage: its script, config, refs, parent
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]  # the checkout: align/pipeline/plan.py -> ./
MARKER = ".smolalign_stage.json"  # written into a stage's output dir only after it finished
STARTED = ".smolalign_stage_started.json"  # the config a (possibly interrupted) attempt ran with
# stage script names -> scripts/<file>.py
ALIASES = {"pretrain": "run_pretrain", "apo": "dpo", "tokenizer": "train_tokenizer"}
# Scripts that take --resume_from_checkpoint (generate_preferences resumes by itself: it skips done prompts).
RESUMABLE = {"pretrain", "run_pretrain", "sft", "dpo", "kto", "orpo", "apo", "grpo", "distill"}
NO_MODEL = {
    "tokenizer",
    "train_tokenizer",
    "generate_preferences",
    "generate_answers",
}  # stages whose output is not a model
DISTRIBUTED = RESUMABLE | {"generate_preferences"}  # scripts that run on many processes (accelerate launch)
TRACKED = RESUMABLE  # scripts whose config has report_to
# Scripts whose stage checks its training rows against the pipeline's eval sets before it trains
# (align.stage.load_data)
DECONTAMINATED = {"sft", "dpo", "kto", "orpo", "apo", "grpo", "distill"}
DECONTAMINATION = ("drop", "warn", "refuse", "off")
HELD_OUT_KEYS = (
    "dataset_name",
    "dataset_args",
    "dataset_config",
    "dataset_mixture",
    "dataset_test_split",
    "max_eval_samples",
)
TRACKING = ("wandb", "tensorboard", "none", "recipe")
LAUNCHERS = ("auto", "accelerate", "python")
STAGE_KEYS = {
    "name",
    "script",
    "recipe",
    "overrides",
    "accelerate_config",
    "num_processes",
    "launcher",
    "eval",
    "eval_overrides",
    "env",
    "resume",
    "target",
}
REF = re.compile(r"\$\{([A-Za-z0-9_\-]+)(?:\.([A-Za-z0-9_]+))?\}")
DATA_KEYS = re.compile(
    r"dataset|sources|^stages$|model_name_or_path|init_from|tokenizer_path|teacher|strong|weak|prompt"
)


@dataclass
class PipelineConfig:
    """The pipeline recipe (keys of the same names); `stages` entries are described in the module doc."""

    stages: list[dict] = field(default_factory=list, metadata={"help": "Ordered stages: {name, script, recipe, ...}."})
    name: str = field(default="pipeline", metadata={"help": "Pipeline name (wandb group prefix, report title)."})
    run_dir: str = field(default="outputs/tiny/pipeline", metadata={"help": "Manifest, logs, configs, eval, report."})
    launcher: str = field(
        default="auto",
        metadata={
            "help": "'accelerate' (accelerate launch), 'python', or 'auto': accelerate only for a stage with an "
            "accelerate_config or num_processes > 1 (one plain process needs no launcher: saves ~5-10 s a stage)."
        },
    )
    eval_recipe: str | None = field(
        default="recipes/tiny/eval.yaml", metadata={"help": "Eval recipe run after each model stage (null: none)."}
    )
    eval_overrides: dict | None = field(default=None, metadata={"help": "Keys overriding the eval recipe."})
    eval_script: str = field(default="scripts/evaluate.py", metadata={"help": "The evaluation entry point."})
    tracking: str = field(
        default="wandb", metadata={"help": f"{TRACKING}: report_to set on every training stage ('recipe': untouched)."}
    )
    tracking_group: str | None = field(
        default=None,
        metadata={
            "help": "wandb group of every stage's run (default: this pipeline run's id); an "
            "ablation sets its name so all its runs are one group."
        },
    )
    rerun: list[str] = field(default_factory=list, metadata={"help": "Stages to run again even if finished."})
    start_at: str | None = field(
        default=None,
        metadata={
            "aliases": ["--from"],
            "help": "Start at this stage (also --from): the stages before it never run; a stage that reads one's "
            "output_dir gets the value `inputs` declares for it, or its finished output of an earlier run.",
        },
    )
    inputs: dict | None = field(
        default=None,
        metadata={
            "help": "With start_at: what the stages before it would have made, {stage: {key: value}}, e.g. "
            "{sft: {output_dir: HuggingFaceTB/SmolLM3-3B}} to start at apo from a published SFT model."
        },
    )
    until: str | None = field(default=None, metadata={"help": "Stop after this stage."})
    report: bool = field(default=True, metadata={"help": "Write the markdown report + plots at the end."})
    report_only: bool = field(default=False, metadata={"help": "Only (re)write the report from the manifest."})
    dry_run: bool = field(default=False, metadata={"help": "Resolve and print the commands; run nothing."})
    accelerate_config: str | None = field(
        default=None,
        metadata={"help": "accelerate config for every stage that names none (e.g. recipes/accelerate/zero3.yaml)."},
    )
    num_processes: int | None = field(
        default=None, metadata={"help": "Processes per launch, over all machines, for every stage that names none."}
    )
    num_machines: int = field(
        default=1, metadata={"help": "Machines in a multi-node run: run this pipeline on each, with its machine_rank."}
    )
    machine_rank: int = field(
        default=0,
        metadata={
            "help": "This machine's rank (0 runs the single-process stages, evaluates and writes "
            "the manifest, markers and report; the others launch the training stages)."
        },
    )
    main_process_ip: str | None = field(
        default=None, metadata={"help": "Address of machine 0 that every machine reaches (multi-node only)."}
    )
    main_process_port: int = field(default=29500, metadata={"help": "Port on machine 0 for the ranks' rendezvous."})
    wait_for_main_s: float = field(
        default=3600.0, metadata={"help": "Machines other than 0: how long to wait for machine 0 to record a stage."}
    )
    sealed_test: bool = field(
        default=True,
        metadata={
            "help": "When every stage has finished, evaluate the final model and the SFT model it descends from once "
            "on the sealed test split (the eval recipe with eval_split: test; results in run_dir/eval_test/), "
            "reported beside the dev numbers. Every other evaluation (each stage, the targets, ablations) "
            "uses the dev split."
        },
    )
    decontamination: str = field(
        default="drop",
        metadata={
            "help": "Before each training stage trains, its rows are checked against every eval set of the pipeline "
            "(the eval recipe's suites, every stage's held-out split; align/data/decontamination.py): 'drop' "
            "overlapping rows (counted in the report), 'warn' and keep them, 'refuse' to train, or 'off'. A "
            "stage's own `decontamination` key wins."
        },
    )

    def __post_init__(self):
        if self.launcher not in LAUNCHERS:
            raise ValueError(f"launcher={self.launcher!r}: choose one of {LAUNCHERS}")
        if self.num_machines < 1 or not 0 <= self.machine_rank < self.num_machines:
            raise ValueError(f"machine_rank={self.machine_rank} must be in [0, num_machines={self.num_machines})")
        if self.num_machines > 1 and not self.main_process_ip:
            raise ValueError(
                f"num_machines={self.num_machines} needs main_process_ip: the address of machine 0 that every machine "
                "reaches (e.g. --main_process_ip 10.0.0.1; 127.0.0.1 to rehearse on one host)"
            )
        if self.num_machines > 1 and self.launcher == "python":
            raise ValueError(
                "launcher=python runs each stage in one process on one machine: a multi-node run "
                "(num_machines > 1) needs launcher accelerate or auto"
            )
        if self.decontamination not in DECONTAMINATION:
            raise ValueError(f"decontamination={self.decontamination!r}: choose one of {DECONTAMINATION}")
        if self.tracking not in TRACKING:
            raise ValueError(f"tracking={self.tracking!r}: choose one of {TRACKING}")
        if not isinstance(self.stages, list):
            raise ValueError("stages must be a list of {name, script, recipe, overrides, ...} mappings")


@dataclass
class Stage:
    name: str
    script: str
    recipe: str | None
    overrides: dict
    accelerate_config: str | None = None
    num_processes: int | None = None
    launcher: str | None = None
    eval: bool = True
    eval_overrides: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)
    resume: bool = False
    target: str | None = None
    config: dict = field(default_factory=dict)  # resolved: recipe + overrides, references substituted
    refs: set = field(default_factory=set)  # names of the earlier stages it reads
    parent: str | None = None  # the earlier stage whose output model this stage starts from (its "before")
    before_start: bool = False  # before the pipeline's start_at: resolved, never run

    @property
    def output_dir(self) -> str:
        return str(self.config["output_dir"])

    @property
    def makes_model(self) -> bool:
        return self.script not in NO_MODEL


def script_path(script: str) -> Path:
    if script.endswith(".py"):
        return Path(script)
    return ROOT / "scripts" / f"{ALIASES.get(script, script)}.py"


def read_yaml(path: str | Path, what: str) -> dict:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{what}: recipe file '{path}' not found")
    data = yaml.safe_load(p.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{what}: recipe '{path}' must be a YAML mapping of key: value")
    return data


@dataclass(frozen=True)
class Unmade:
    """The output of a stage before start_at that is not there: a stage that runs and reads it is refused with
    `why`; a stage that does not run keeps it as its value."""

    why: str


def resolve_refs(value, known: dict[str, dict], where: str, used: set | None = None, strict: bool = True):
    """Substitute `${stage.key}` (and `${run_dir}`) in strings, recursively through dicts and lists.

    A string that is exactly one reference takes the referenced value's type; otherwise it is text. A reference to
    an Unmade value raises ValueError when `strict`, else the whole string becomes that Unmade.
    """
    if isinstance(value, dict):
        return {k: resolve_refs(v, known, where, used, strict) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve_refs(v, known, where, used, strict) for v in value]
    if not isinstance(value, str) or "${" not in value:
        return value
    unmade: list[Unmade] = []

    def lookup(m: re.Match):
        stage, key = m.group(1), m.group(2)
        if key is None:
            if stage not in known.get("", {}):
                raise ValueError(f"{where}: unknown reference '{m.group(0)}'; write ${{stage.key}} or ${{run_dir}}")
            return known[""][stage]
        if stage not in known:
            earlier = [s for s in known if s]
            raise ValueError(f"{where}: '{m.group(0)}' names no earlier stage; earlier stages: {earlier}")
        if key not in known[stage]:
            raise ValueError(f"{where}: stage '{stage}' has no key '{key}' in its resolved config")
        if used is not None:
            used.add(stage)
        found = known[stage][key]
        if isinstance(found, Unmade):
            if strict:
                raise ValueError(f"{where} reads '{m.group(0)}': {found.why}")
            unmade.append(found)
        return found

    whole = REF.fullmatch(value)
    if whole:
        return lookup(whole)
    text = REF.sub(lambda m: str(lookup(m)), value)
    rest = REF.sub("", value)
    if "${" in rest:  # `${stages.sft.output_dir}` or `${sft output_dir}` would pass on as literal text
        bad = rest[rest.index("${") :].split("}")[0] + "}"
        raise ValueError(
            f"{where}: '{bad}' is not a reference; write ${{stage.key}} (e.g. ${{sft.output_dir}}) or ${{run_dir}}"
        )
    return unmade[0] if unmade else text


def _start_index(cfg: PipelineConfig) -> int:
    """Where the run starts (0 without start_at), after checking start_at and inputs against the stage list."""
    names = [str(raw.get("name")) for raw in cfg.stages if isinstance(raw, dict)]
    inputs = cfg.inputs or {}
    if not isinstance(inputs, dict) or not all(isinstance(v, dict) for v in inputs.values()):
        raise ValueError(
            f"inputs={inputs!r} must map a stage to its keys, e.g. inputs: "
            "{sft: {output_dir: HuggingFaceTB/SmolLM3-3B}}"
        )
    if cfg.start_at is None:
        if inputs:
            raise ValueError(
                f"inputs names {sorted(inputs)} but start_at is not set: inputs stand in for the stages "
                "before start_at, which do not run (set start_at, e.g. --start_at sft)"
            )
        return 0
    if cfg.start_at not in names:
        raise ValueError(f"start_at={cfg.start_at!r} is not a stage; stages: {names}")
    start = names.index(cfg.start_at)
    for name in inputs:
        if name not in names[:start]:
            raise ValueError(
                f"inputs names '{name}', which is not a stage before start_at={cfg.start_at!r}; inputs "
                f"stand in for the stages that do not run: {names[:start]}"
            )
    for what, chosen in (("rerun", cfg.rerun), ("until", [cfg.until] if cfg.until else [])):
        early = [n for n in chosen if n in names[:start]]
        if early:
            raise ValueError(f"{what} names {early}, before start_at={cfg.start_at!r}: those stages do not run")
    return start


def _as_read_later(name: str, config: dict, declared: dict, start_at: str) -> dict:
    """A stage before start_at as later stages read it: its resolved config, the keys `inputs` declares for it on
    top; its output_dir stays only when it holds that stage's finished output, else it is Unmade."""
    config = {**config, **declared}
    out = config.get("output_dir")
    if "output_dir" not in declared and not (isinstance(out, str) and (Path(out) / MARKER).is_file()):
        config["output_dir"] = Unmade(
            f"start_at={start_at!r} skips stage '{name}', and its output_dir {out} holds no finished output; declare "
            f"what to read instead, e.g. inputs: {{{name}: {{output_dir: <model dir or hub id>}}}} (or --inputs "
            f"'{{{name}: {{output_dir: ...}}}}'), or start at '{name}' or earlier"
        )
    return config


def resolve_stages(cfg: PipelineConfig) -> list[Stage]:
    """Validate the stage list and resolve every stage's config, in order (references go backwards only)."""
    if not cfg.stages:
        raise ValueError("stages is empty: list at least one {name, script, recipe} in the pipeline recipe")
    first = _start_index(cfg)
    known: dict[str, dict] = {"": {"run_dir": cfg.run_dir}}
    stages: list[Stage] = []
    for i, raw in enumerate(cfg.stages):
        runs = i >= first
        if not isinstance(raw, dict) or "name" not in raw or "script" not in raw:
            raise ValueError(f"stages[{i}] must be a mapping with at least 'name' and 'script', got {raw!r}")
        name = str(raw["name"])
        unknown = sorted(set(raw) - STAGE_KEYS)
        if unknown:
            raise ValueError(f"stage '{name}': unknown key(s) {unknown}; valid keys: {sorted(STAGE_KEYS)}")
        if name in known or not re.fullmatch(r"[A-Za-z0-9_\-]+", name):
            raise ValueError(
                f"stage name '{name}' is repeated or not [A-Za-z0-9_-]+: names must be unique identifiers"
            )
        script = str(raw["script"])
        if not script_path(script).is_file():
            raise FileNotFoundError(f"stage '{name}': script '{script}' not found at {script_path(script)}")
        used: set[str] = set()
        recipe = resolve_refs(raw.get("recipe"), known, f"stage '{name}'.recipe", used, strict=runs)
        if isinstance(recipe, Unmade):
            raise ValueError(f"stage '{name}'.recipe: {recipe.why}")
        base = read_yaml(recipe, f"stage '{name}'") if recipe else {}
        overrides = raw.get("overrides") or {}
        if not isinstance(overrides, dict):
            raise ValueError(f"stage '{name}': overrides must be a mapping of key: value")
        config = resolve_refs({**base, **overrides}, known, f"stage '{name}'", used, strict=runs)
        if "output_dir" not in config:
            raise ValueError(
                f"stage '{name}': no output_dir in its recipe or overrides; add overrides: {{output_dir: ...}}"
            )
        if cfg.tracking in ("wandb", "tensorboard") and script in TRACKED and "report_to" not in overrides:
            config["report_to"] = cfg.tracking
        stage = Stage(
            name=name,
            script=script,
            recipe=recipe,
            overrides=overrides,
            accelerate_config=resolve_refs(raw.get("accelerate_config"), known, name),
            num_processes=raw.get("num_processes"),
            launcher=raw.get("launcher"),
            eval_overrides=raw.get("eval_overrides") or {},
            env={k: str(v) for k, v in (raw.get("env") or {}).items()},
            resume=bool(raw.get("resume", script in RESUMABLE)),
            target=raw.get("target"),
            config=config,
            refs=used,
            before_start=not runs,
        )
        stage.eval = bool(raw.get("eval", stage.makes_model))
        start = config.get("model_name_or_path") or config.get("init_from")
        stage.parent = next((s.name for s in stages if start and s.output_dir == str(start)), None)
        if stage.launcher not in (None, *LAUNCHERS):
            raise ValueError(f"stage '{name}': launcher={stage.launcher!r}; choose one of {LAUNCHERS}")
        if stage.accelerate_config:
            check_accelerate_config(stage.accelerate_config, f"stage '{name}': ")
        if cfg.accelerate_config:
            check_accelerate_config(cfg.accelerate_config)
        known[name] = config if runs else _as_read_later(name, config, (cfg.inputs or {}).get(name, {}), cfg.start_at)
        stages.append(stage)
    for n in [*cfg.rerun, *([cfg.until] if cfg.until else [])]:
        if n not in known:
            raise ValueError(f"'{n}' (in rerun/until) is not a stage; stages: {[s.name for s in stages]}")
    planned = decontamination_sets(cfg, stages)
    if planned is not None:
        path = str(planned[0])
        for stage in stages:
            if stage.script in DECONTAMINATED and not stage.before_start:
                stage.config.setdefault("decontamination", cfg.decontamination)
                stage.config["decontamination_eval_sets"] = path
    return stages


def sealed_test_stages(stages: list[Stage]) -> list[Stage]:
    """What the sealed test split evaluates once a chain has finished: the SFT model the final model descends from
    (following the recorded parents; none when it has none) and the final model (the last evaluated model stage)."""
    by_name = {s.name: s for s in stages}
    final = next((s for s in reversed(stages) if s.makes_model and s.eval), None)
    if final is None:
        return []
    node = final
    while node.parent and node.script != "sft":
        node = by_name[node.parent]
    return [node, final] if node.script == "sft" and node is not final else [final]


def sealed_eval_config(eval_config: dict) -> dict:
    """An eval config on the sealed test split (the vibe prompts are read by a person, not scored: left out)."""
    suites = [s for s in eval_config.get("suites") or ["loss", "mc", "generative"] if s != "vibe"]
    return {**eval_config, "eval_split": "test", "suites": suites}


def decontamination_sets(cfg: PipelineConfig, stages: list[Stage]) -> tuple[Path, dict] | None:
    """(where, what) of the eval sets every training stage is checked against: {eval: each distinct eval config
    the stages are evaluated with (the sealed test's too), held_out: {stage: its data keys}} (the stage reads the
    sets themselves when it starts, so a held-out split made by an earlier stage is there). The file is named by a
    hash of its content: a change to any eval set changes the training stages' configs, so they run again. None when
    it is off."""
    stages = [s for s in stages if not s.before_start]  # the stages this run evaluates and trains
    if cfg.decontamination == "off" or not any(s.script in DECONTAMINATED for s in stages):
        return None
    evals: list[dict] = []
    if cfg.eval_recipe:
        base = {**read_yaml(cfg.eval_recipe, "eval_recipe"), **(cfg.eval_overrides or {})}
        sealed = {s.name for s in sealed_test_stages(stages)} if cfg.sealed_test else set()
        for s in stages:
            merged = {**base, **s.eval_overrides}
            for config in ([merged] if s.eval else []) + ([sealed_eval_config(merged)] if s.name in sealed else []):
                if config not in evals:
                    evals.append(config)
    held_out = {
        s.name: {k: s.config[k] for k in HELD_OUT_KEYS if s.config.get(k) is not None}
        for s in stages
        if s.config.get("dataset_name") or s.config.get("dataset_mixture")
    }
    content = {"eval": evals, "held_out": held_out}
    digest = hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return Path(cfg.run_dir) / "decontamination" / f"eval_sets-{digest}.json", content


def check_accelerate_config(path: str, where: str = "") -> None:
    """An accelerate config the pipeline will launch with: it exists, parses, and holds what `accelerate launch`
    reads (its keys, a known distributed_type, a ZeRO stage DeepSpeed has); else one line naming the problem at
    start, not an accelerate traceback on every rank when the stage launches."""
    import difflib

    from accelerate.commands.config.config_args import ClusterConfig
    from accelerate.utils import DistributedType

    fix = "fix it or start from one of recipes/accelerate/*.yaml"
    if not Path(path).is_file():
        raise FileNotFoundError(f"{where}accelerate_config '{path}' not found")
    try:
        config = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise ValueError(
            f"{where}accelerate_config '{path}' is not valid YAML{at} ({getattr(e, 'problem', e)}): {fix}"
        ) from None
    if not isinstance(config, dict):
        raise ValueError(f"{where}accelerate_config '{path}' must be a mapping of accelerate keys: {fix}")
    known = {f.name for f in dataclasses.fields(ClusterConfig)}
    for key in config:
        if key not in known:
            near = difflib.get_close_matches(str(key), sorted(known), n=1)
            hint = f" (did you mean '{near[0]}'?)" if near else ""
            raise ValueError(f"{where}accelerate_config '{path}': unknown key '{key}'{hint}: {fix}")
    kinds = [d.value for d in DistributedType]
    kind = config.get("distributed_type", "NO")
    if kind not in kinds:
        raise ValueError(f"{where}accelerate_config '{path}': distributed_type {kind!r} is not one of {kinds}")
    stage = (config.get("deepspeed_config") or {}).get("zero_stage") if kind == "DEEPSPEED" else None
    if stage is not None and stage not in (0, 1, 2, 3):
        raise ValueError(
            f"{where}accelerate_config '{path}': deepspeed_config.zero_stage {stage!r} is not 0, 1, 2 or 3"
        )
