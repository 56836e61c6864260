"""Run a whole pipeline (pretrain -> SFT -> APO -> GRPO -> distillation ...) from one recipe; see
align/pipeline/run.py.

    python scripts/pipeline.py recipes/tiny/pipeline.yaml                  # `make demo`: the embedded tiny world
    python scripts/pipeline.py recipes/tiny/pipeline.yaml --report_only    # rewrite report.md + plots
    python scripts/pipeline.py recipes/tiny/pipeline.yaml --rerun sft      # run sft (and what depends on it) again
    python scripts/pipeline.py recipes/tiny/pipeline.yaml --dry_run        # print each stage's command
    python scripts/pipeline.py recipes/smollm3/post_train_pipeline.yaml   # SmolLM3-3B-Base on one 8-GPU node
    python scripts/pipeline.py recipes/smollm3/pipeline.yaml --start_at sft \
        --inputs '{sft_reasoning: {output_dir: HuggingFaceTB/SmolLM3-3B-Base}}'   # from a stage on (--from)
    python scripts/pipeline.py recipes/smollm3/pipeline.yaml --num_machines 2 --machine_rank 0 \
        --main_process_ip 10.0.0.1 --num_processes 16                          # on each machine, its own rank

Re-running after a crash or Ctrl-C skips finished stages and resumes the interrupted one. Everything lands in
run_dir: manifest.json, configs/, logs/, eval/, report.md, plots/.
"""

import signal
import sys

from align.cli import run
from align.pipeline.plan import PipelineConfig
from align.pipeline.report import write_report
from align.pipeline.run import run_pipeline

CONFIG_TYPES = (PipelineConfig,)


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main(cfg: PipelineConfig) -> int:
    from rich.console import Console

    console = Console(soft_wrap=True)
    # `kill <pid>` stops the running stage's whole process group the same way Ctrl-C does
    signal.signal(signal.SIGTERM, _interrupt)
    if not cfg.report_only:
        try:
            run_pipeline(cfg, console)
        except KeyboardInterrupt:
            console.print("[yellow]interrupted[/]: re-run the same command to resume")
            return 130
        except RuntimeError as e:  # a failed stage: the manifest says which; the report shows how far we got
            console.print(f"[red]error[/]: {e}")
            if cfg.report and cfg.machine_rank == 0:
                console.print(f"partial report: {write_report(cfg.run_dir)}")
            return 1
    if (cfg.report or cfg.report_only) and cfg.machine_rank == 0:
        if not cfg.dry_run:
            console.print(f"report: {write_report(cfg.run_dir)}")
    return 0


if __name__ == "__main__":
    sys.exit(run(main, *CONFIG_TYPES) or 0)
