"""Run an ablation: every variant x seed of one stage (or of a pipeline from one stage on), judged against a
baseline on the same held-out prompts; see align/pipeline/ablation.py.

    python scripts/ablate.py recipes/ablations/tiny_preference.yaml                  # run or continue it
    python scripts/ablate.py recipes/ablations/tiny_preference.yaml --report_only true   # rewrite the table
    python scripts/ablate.py recipes/ablations/tiny_preference.yaml --dry_run true   # check every run, list them
    python scripts/ablate.py recipes/ablations/smol135m_preference.yaml --executor slurm  # write the array job

Results: <run_dir>/ablation.md (the table), ablation.json (every run), plots/. Stop it at any time and run the same
command again: finished runs are skipped and the interrupted one resumes.
"""

import signal
import sys

from align.cli import run
from align.pipeline.ablation import AblationConfig, check, plan, run_all, write_runs, write_slurm
from align.pipeline.ablation_report import write

CONFIG_TYPES = (AblationConfig,)


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main(cfg: AblationConfig) -> int:
    runs = plan(cfg)
    if not cfg.report_only:
        check(runs)  # every run's config against its script's dataclasses, before anything runs
        print(
            f"ablation {cfg.name}: {len(cfg.variants)} variants x {len(cfg.seeds)} seeds = {len(runs)} runs "
            f"(baseline {cfg.baseline}) under {cfg.run_dir}",
            flush=True,
        )
        if cfg.dry_run:
            for r in runs:
                print(f"  {r.name}: python scripts/pipeline.py {r.recipe}")
            return 0
        write_runs(runs)
        if cfg.executor == "slurm":
            path = write_slurm(cfg, runs, sys.argv[1] if len(sys.argv) > 1 else "<recipe>")
            print(f"wrote {path}: submit it with `sbatch {path}`, then rerun with --report_only true")
            return 0
        signal.signal(signal.SIGTERM, _interrupt)
        try:
            status = run_all(cfg, runs, log=lambda line: print(line, flush=True))
        except KeyboardInterrupt:
            print("interrupted: run the same command again to continue", flush=True)
            write(cfg, runs)
            return 130
        if status["failed"]:
            print(f"failed: {', '.join(status['failed'])}")
    path = write(cfg, runs)
    print(f"report: {path}")
    print(path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(run(main, *CONFIG_TYPES) or 0)
