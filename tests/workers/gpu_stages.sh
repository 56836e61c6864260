#!/usr/bin/env bash
# Every stage once on a CUDA GPU, one process, bf16, a few steps (not in CI: CI has no GPU). From the repo root:
#     bash tests/workers/gpu_stages.sh MODELS_DIR OUT_DIR
# MODELS_DIR holds the micro pipeline's outputs (`python scripts/pipeline.py recipes/tiny/micro_pipeline.yaml`; its
# configs/ name the models by the absolute paths they had there). Each line says what ran and what it computed;
# a stage that fails prints the end of its log. Then tests/workers/gpu_paths.sh for Liger, FSDP2 and evaluation.
set -uo pipefail
M=${1:?models dir}; OUT=${2:?out dir}
mkdir -p "$OUT"
export WANDB_MODE=offline HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
trl="--max_steps 3 --logging_steps 1 --save_steps 3 --report_to none --bf16 true"

run() {  # name, then the command; prints rc, seconds and the last logged loss
  local name=$1; shift
  [[ -z "${ONLY:-}" || " $ONLY " == *" $name "* ]] || return 0  # ONLY="grpo distill ...": just those runs
  local start=$SECONDS
  # SIGINT first: a hung stage leaves Python's traceback (where it waited) at the end of its log
  timeout -s INT -k 15 "${STAGE_TIMEOUT:-300}" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  local loss
  loss=$(grep -o "'loss': '[^']*'" "$OUT/$name.log" | tail -1)
  echo "$name rc=$rc ${SECONDS}s-${start}s $loss"
  [ $rc -eq 0 ] || tail -25 "$OUT/$name.log"
}

$PY -c "import torch, transformers, trl, datasets, peft, accelerate as a; print('torch', torch.__version__, 'transformers', transformers.__version__, 'trl', trl.__version__, 'accelerate', a.__version__, torch.cuda.get_device_name())"
run pretrain $PY scripts/run_pretrain.py "$M/configs/pretrain_small.yaml" --output_dir "$OUT/pretrain" --max_steps 3 \
    --save_steps 3 --mixed_precision bf16 --skill_eval_num 4
grep -h -o "device[^,]*" "$OUT/pretrain.log" | head -2
run sft $PY scripts/sft.py "$M/configs/sft.yaml" --output_dir "$OUT/sft" $trl --eval_after true --eval_num_prompts 4
run apo $PY scripts/dpo.py "$M/configs/apo.yaml" --output_dir "$OUT/apo" $trl --per_device_train_batch_size 2
run grpo $PY scripts/grpo.py "$M/configs/grpo.yaml" --output_dir "$OUT/grpo" $trl --rollout_backend hf \
    --eval_after true --eval_num_prompts 4
run grpo_padding_free $PY scripts/grpo.py "$M/configs/grpo.yaml" --output_dir "$OUT/grpo_pf" $trl --rollout_backend hf \
    --padding_free true
run grpo_async $PY scripts/grpo.py "$M/configs/grpo.yaml" --output_dir "$OUT/grpo_async" $trl --rollout_backend hf \
    --async_generation true --max_staleness 1
run distill $PY scripts/distill.py recipes/tiny/distill.yaml --model_name_or_path "$M/pretrain_reasoning" \
    --teacher_model_name_or_path "$M/sft_strong" --output_dir "$OUT/distill" $trl --per_device_train_batch_size 2 \
    --max_completion_length 16 --max_length 128 --eval_num_prompts 4 --distill_eval_max_new_tokens 16 \
    --dataset_args "{num: 32, mode: mixed, seed: 0}"
# replay rows beside the GRPO loss (align/grpo/replay.py), padded and padding-free
run grpo_replay $PY scripts/grpo.py "$M/configs/grpo.yaml" --output_dir "$OUT/grpo_replay" $trl --rollout_backend hf \
    --replay_data builtin:tasks --replay_args "{num: 16, mode: mixed, seed: 1}" --replay_coef 0.2
run grpo_replay_pf $PY scripts/grpo.py "$M/configs/grpo.yaml" --output_dir "$OUT/grpo_replay_pf" $trl --rollout_backend hf \
    --replay_data builtin:tasks --replay_args "{num: 16, mode: mixed, seed: 1}" --replay_coef 0.2 --padding_free true
# the rejection-sampling teacher: its best-of-n answers sampled on the GPU (the teacher loaded to the CPU before)
run distill_rejection $PY scripts/distill.py recipes/tiny/distill.yaml --model_name_or_path "$M/pretrain_reasoning" \
    --teacher_model_name_or_path "$M/sft_strong" --output_dir "$OUT/distill_rejection" $trl \
    --per_device_train_batch_size 2 --loss rejection_sampling --teacher_best_of 8 --temperature 1.0 \
    --max_completion_length 32 --max_length 160 --eval_num_prompts 16 --distill_eval_max_new_tokens 32 \
    --dataset_args "{num: 64, mode: mixed, seed: 0}" --replay_data builtin:tasks --replay_samples 8
grep -h -o "teacher on [a-z:0-9]*\|verified answer for [0-9]* of [0-9]*\|replay/nll[^,]*" "$OUT"/distill*.log "$OUT"/grpo_replay*.log | sort | uniq -c | head
run preferences $PY scripts/generate_preferences.py "$M/configs/preferences.yaml" --output_dir "$OUT/preferences" \
    --rollout_backend hf
grep -h -o "hf engine: .* loaded on [a-z:0-9]*" "$OUT/preferences.log" | head -1
run evaluate $PY scripts/evaluate.py recipes/tiny/eval.yaml --model_name_or_path "$M/sft" --output_dir "$OUT/eval" \
    --suites loss mc generative --mc_sets tasks:8 --gen_sets tasks:8 --max_new_tokens 32 --backend hf
$PY - "$OUT" <<'PY'
import json, sys, os
out = sys.argv[1]
for name, f in [("sft", "sft/sft_eval.json"), ("grpo", "grpo/grpo_eval.json"), ("grpo_async", "grpo_async/grpo_eval.json"), ("distill", "distill/distill_eval.json"),
                ("distill_rejection", "distill_rejection/distill_eval.json"),
                ("eval", "eval/eval_results.json")]:
    p = os.path.join(out, f)
    if not os.path.exists(p):
        print(name, "no report"); continue
    r = json.load(open(p))
    keep = {k: r[k] for k in ("device", "world_size", "distributed_type") if k in r}
    print(name, keep, {k: v for k, v in (r.get("metrics") or {}).items() if k.startswith(("acc/", "loss/"))})
    if "teacher_best_of" in r:  # distillation: the teacher's verified best-of-n, the student before and after
        print(" ", name, "teacher best-of", {k: r["teacher_best_of"][k] for k in ("n", "accuracy", "by_mode")},
              "student", [r.get(w, {}).get("accuracy") for w in ("before", "after")])
PY
