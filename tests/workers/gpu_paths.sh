#!/usr/bin/env bash
# The GPU-only branches, run on a CUDA machine (not in CI: CI has no GPU). From the repository root:
#     bash tests/workers/gpu_paths.sh MODELS_DIR OUT_DIR
# MODELS_DIR holds the micro pipeline's outputs (configs/, pretrain_reasoning/, sft/, apo/: `python scripts/pipeline.py
# recipes/tiny/micro_pipeline.yaml`). Checks: (1) SFT with Liger kernels trains with the loss of the run without them;
# (2) FSDP2 (accelerate, fsdp2.yaml, one GPU) pushes full tensors (`DTensor.full_tensor()`) to a rollout engine
# with its own copy, and the saved model equals the gathered weights; (3) evaluation on the GPU; (4) the vLLM engine
# on CUDA: call seeds and an fp32 LM head (see below); (5) bitsandbytes: QLoRA SFT and an 8-bit distillation teacher.
# GPU_PATHS picks sections (default "1 2 3 4 5").
set -uo pipefail
M=${1:?models dir}; OUT=${2:?out dir}
mkdir -p "$OUT"
export WANDB_MODE=offline HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
t="timeout -s INT -k 15 ${STAGE_TIMEOUT:-300}"  # a hung step leaves Python's traceback at the end of its log
on() { [[ " ${GPU_PATHS:-1 2 3 4 5} " == *" $1 "* ]]; }
compare_losses() {  # two runs' logged losses, step by step
  $PY - "$OUT" "$1" "$2" <<'PY'
import json, sys, glob
def losses(d):
    f = sorted(glob.glob(f"{d}/checkpoint-*/trainer_state.json"))[-1]
    return [h["loss"] for h in json.load(open(f))["log_history"] if "loss" in h]
out, x, y = sys.argv[1:]
a, b = losses(f"{out}/{x}"), losses(f"{out}/{y}")
print("losses", x, a, y, b, "max rel diff", max(abs(p - q) / abs(p) for p, q in zip(a, b)))
PY
}
sft="$M/configs/sft.yaml --model_name_or_path $M/pretrain_reasoning --max_steps 4 --logging_steps 1 --save_steps 4 --eval_after false --bf16 true"
if on 1; then
$t $PY scripts/sft.py $sft --output_dir "$OUT/sft_plain" > "$OUT/sft_plain.log" 2>&1; echo "sft plain rc $?"
$t $PY scripts/sft.py $sft --output_dir "$OUT/sft_liger" --use_liger_kernel true > "$OUT/sft_liger.log" 2>&1; echo "sft liger rc $?"
compare_losses sft_plain sft_liger
grep -i -m3 "liger" "$OUT/sft_liger.log"
fi
if on 2; then
$t $PY -m accelerate.commands.launch --config_file recipes/accelerate/fsdp2.yaml --num_processes 1 tests/workers/grpo_sync.py \
    "$OUT/fsdp" "$M/configs/grpo.yaml" --model_name_or_path "$M/apo" --output_dir "$OUT/fsdp/train" --bf16 true \
    --save_strategy no --learning_rate 1e-3 --report_to none --rollout_backend hf --rollout_kwargs '{dtype: bfloat16}' \
    > "$OUT/fsdp.log" 2>&1; echo "fsdp2 rc $?"
cat "$OUT/fsdp/result.json" 2>/dev/null | $PY -c "import json,sys; d=json.load(sys.stdin); print({k: v for k, v in d.items() if k != 'ranks'}); [print({k: r[k] for k in ('backend','pushes','copy_diff')}, 'greedy parity', r['engine_ids'] == r['model_ids']) for r in d['ranks']]"
fi
if on 3; then
# (3) per-stage evaluation on the GPU (issue 40): the evaluated model lands on cuda:LOCAL_RANK, and a vLLM engine's
# context holds a 4,096-token answer beside its prompt (truncated share must stay low with max_new_tokens 4096)
$t $PY scripts/evaluate.py recipes/tiny/eval.yaml --model_name_or_path "$M/sft" --output_dir "$OUT/eval" \
    --suites loss mc generative --mc_sets tasks:8 --gen_sets tasks:8 --modes no_think --max_new_tokens 4096 \
    --rollout_backend "${EVAL_BACKEND:-vllm}" > "$OUT/eval.log" 2>&1; echo "eval rc $?"
$PY -c "import json,sys; r=json.load(open(sys.argv[1])); print('eval device', r['device'], 'truncated', r['metrics'].get('truncated/tasks/no_think'))" "$OUT/eval/eval_results.json"
fi
if on 4; then
# (4) the vLLM engine on CUDA: a seeded call repeats and costs less than a generator per request; head_dtype float32
# (cast_lm_head_to_fp32) brings a bf16 engine's log-probs nearer the fp32-head trainer's
$t $PY tests/workers/vllm_gpu_check.py "$M/sft" > "$OUT/vllm_gpu.log" 2>&1; echo "vllm gpu rc $?"; grep -E "repeats|per call|log-prob" "$OUT/vllm_gpu.log"
fi
if on 5; then
# (5) bitsandbytes (CUDA only): QLoRA (a 4-bit base, LoRA adapters trained, the merged model saved in full precision)
# trains with the loss of plain LoRA; an 8-bit teacher on the rank's GPU grades the student's samples
$t $PY scripts/sft.py $sft --output_dir "$OUT/sft_lora" --use_peft true --lora_r 8 --lora_alpha 16 \
    > "$OUT/sft_lora.log" 2>&1; echo "sft lora rc $?"
$t $PY scripts/sft.py $sft --output_dir "$OUT/sft_qlora" --use_peft true --lora_r 8 --lora_alpha 16 --load_in_4bit true \
    > "$OUT/sft_qlora.log" 2>&1; echo "sft qlora rc $?"; tail -3 "$OUT/sft_qlora.log"
compare_losses sft_lora sft_qlora
$PY - "$OUT" <<'PY'
import sys
from transformers import AutoModelForCausalLM
out = sys.argv[1]
m = AutoModelForCausalLM.from_pretrained(f"{out}/sft_qlora")
print("qlora saved model dtype", m.dtype, "quantized", hasattr(m.config, "quantization_config"))
PY
$t $PY scripts/distill.py recipes/tiny/distill.yaml --model_name_or_path "$M/pretrain_reasoning" --teacher_model_name_or_path \
    "$M/sft_strong" --output_dir "$OUT/distill_8bit" --max_steps 3 --logging_steps 1 --save_steps 3 --report_to none \
    --bf16 true --per_device_train_batch_size 2 --max_completion_length 16 --max_length 128 --eval_num_prompts 4 \
    --distill_eval_max_new_tokens 16 --dataset_args "{num: 32, mode: mixed, seed: 0}" --teacher_quantization 8bit \
    > "$OUT/distill_8bit.log" 2>&1; echo "distill 8-bit teacher rc $?"; grep -o "teacher on [a-z:0-9]*" "$OUT/distill_8bit.log"
tail -3 "$OUT/distill_8bit.log"
fi
