"""`import align, pretrain, rewards, data_gen` stays light: no vllm, deepspeed or liger at import time."""

import subprocess
import sys


def test_import_does_not_pull_heavy_optional_packages():
    code = (
        "import sys, align, pretrain, rewards, data_gen\n"
        "import align.cli, align.config, align.data.loading, align.modeling.loading\n"
        "heavy = [m for m in ('vllm', 'deepspeed', 'liger_kernel') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "", f"imported at package import time: {proc.stdout.strip()}"
