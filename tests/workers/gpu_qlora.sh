#!/usr/bin/env bash
# QLoRA on a CUDA GPU with no other model needed (not in CI: bitsandbytes is CUDA only). From the repo root:
#     bash tests/workers/gpu_qlora.sh OUT_DIR
# A small random SmolLM3 (the tiny tokenizer in tests/assets) takes 4 SFT steps with LoRA and with LoRA on its 4-bit
# quantized base, both without lora_target_modules (PEFT has no default for SmolLM3: every linear layer but the head);
# prints both loss curves and what each saved model is.
set -uo pipefail
OUT=${1:?out dir}; mkdir -p "$OUT"
export WANDB_MODE=offline HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
$PY - "$OUT/model" <<'PY'
import sys, torch
from transformers import AutoTokenizer, SmolLM3Config, SmolLM3ForCausalLM
tok = AutoTokenizer.from_pretrained("tests/assets/tiny_tokenizer")
torch.manual_seed(0)
config = SmolLM3Config(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                       pad_token_id=tok.pad_token_id or 0, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
SmolLM3ForCausalLM(config).save_pretrained(sys.argv[1]); tok.save_pretrained(sys.argv[1])
PY
for kind in lora qlora; do
  extra=(); [ $kind = qlora ] && extra=(--load_in_4bit true)
  timeout -s INT -k 15 "${STAGE_TIMEOUT:-150}" $PY scripts/sft.py recipes/tiny/sft.yaml --model_name_or_path "$OUT/model" \
    --output_dir "$OUT/$kind" --max_steps 4 --logging_steps 1 --save_steps 4 --eval_strategy no --eval_after false \
    --dataset_args "{num: 64, mode: mixed, seed: 0}" --use_peft true --lora_r 8 --lora_alpha 16 --learning_rate 1e-3 \
    --report_to none "${extra[@]}" > "$OUT/$kind.log" 2>&1
  echo "sft $kind rc $?"; grep -h -m1 "LoRA: PEFT has no default" "$OUT/$kind.log"; grep -h "Error" "$OUT/$kind.log" | tail -2
done
$PY - "$OUT" <<'PY'
import glob, json, sys
from transformers import AutoModelForCausalLM
out = sys.argv[1]
for kind in ("lora", "qlora"):
    files = sorted(glob.glob(f"{out}/{kind}/checkpoint-*/trainer_state.json"))
    if not files:
        print(kind, "no checkpoint"); continue
    print(kind, "losses", [round(h["loss"], 4) for h in json.load(open(files[-1]))["log_history"] if "loss" in h])
    m = AutoModelForCausalLM.from_pretrained(f"{out}/{kind}")
    print(kind, "saved model", type(m).__name__, m.dtype, "quantized:", hasattr(m.config, "quantization_config"))
PY
